"""The part of vLLM's chat request the simulator reads, and the prompt's token count.

Unknown fields are ignored, as vLLM does. The model is named like vLLM's so pydantic's error
texts for these fields read the same as the real server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from pydantic import BaseModel

from llmload.workload.tokens import get_tokenizer


class ContentPart(BaseModel):
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    role: str
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        """vLLM's "string" content format: text parts joined by newlines."""
        if isinstance(self.content, list):
            return "\n".join(p.text for p in self.content if p.text is not None)
        return self.content or ""


class StreamOptions(BaseModel):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatCompletionRequest(BaseModel):
    messages: list[ChatMessage]
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    request_id: str | None = None

    def output_limit(self) -> tuple[str, int | None]:
        """The requested output cap and the parameter vLLM names in errors about it."""
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens


GENERATION_PROMPT = "<|im_start|>assistant\n"
# The longest cl100k token, in bytes (tiktoken's token_byte_values()); vLLM bounds a prompt's
# characters by max_model_len times this before tokenizing.
MAX_CHARS_PER_TOKEN = 128


def render_chatml(messages: Sequence[ChatMessage]) -> list[str]:
    """The prompt as the chat template renders it, one piece per message plus the generation prompt."""
    return [f"<|im_start|>{m.role}\n{m.text()}<|im_end|>\n" for m in messages] + [GENERATION_PROMPT]


def count_tokens(pieces: Sequence[str]) -> int:
    """cl100k tokens of the rendered prompt.

    Every piece starts with `<|` and ends with a newline, which no cl100k pre-token spans, so
    the sum of per-piece counts equals the count of the whole text; the per-piece cache makes
    multi-turn replays (which resend the history) nearly free.
    """
    return sum(_count(piece) for piece in pieces)


@lru_cache(maxsize=1024)
def _count(text: str) -> int:
    return get_tokenizer("cl100k_base").count(text)
