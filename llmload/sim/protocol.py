"""The parts of vLLM's requests the simulator reads, and the prompt's tokens.

Unknown fields are ignored, as vLLM does. The models are named like vLLM's so pydantic's error
texts for these fields read the same as the real server's.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Annotated

from pydantic import BaseModel, Field

from llmload.workload.tokens import GENERATION_PROMPT, chatml_message, get_tokenizer


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


class _GenerationRequest(BaseModel):
    model: str | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    request_id: str | None = None

    def output_limit(self) -> tuple[str, int | None]:
        """The requested output cap and the parameter vLLM names in errors about it."""
        return "max_tokens", self.max_tokens

    def prompt_pieces(self) -> list[str]:
        raise NotImplementedError


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None

    def output_limit(self) -> tuple[str, int | None]:
        if self.max_completion_tokens is not None:
            return "max_completion_tokens", self.max_completion_tokens
        return "max_tokens", self.max_tokens

    def prompt_pieces(self) -> list[str]:
        return render_chatml(self.messages)


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: one text prompt (vLLM's default max_tokens here is 16)."""

    prompt: str
    max_tokens: int | None = 16

    def prompt_pieces(self) -> list[str]:
        return [self.prompt]


class TokenizeCompletionRequest(BaseModel):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(BaseModel):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


# The longest cl100k token, in bytes (tiktoken's token_byte_values()); vLLM bounds a prompt's
# characters by max_model_len times this before tokenizing.
MAX_CHARS_PER_TOKEN = 128


def render_chatml(messages: Sequence[ChatMessage], *, generation_prompt: bool = True) -> list[str]:
    """The prompt as the chat template renders it, one piece per message plus the generation prompt."""
    pieces = [chatml_message(m.role, m.text()) for m in messages]
    return [*pieces, GENERATION_PROMPT] if generation_prompt else pieces


class PromptTokenizer:
    """Token ids of a rendered prompt, piece by piece.

    Every chat piece starts with `<|` and ends with a newline, which no pre-token spans (cl100k's,
    or a ChatML model's, whose `<|im_start|>` is a special token), so the per-piece encodings
    concatenate to the whole text's; the per-piece cache makes multi-turn replays (which resend
    the history) nearly free. The ids feed prefix caching; their count is the prompt length.
    """

    def __init__(self, name: str) -> None:
        self.tokenizer = get_tokenizer(name)
        self._encode = lru_cache(maxsize=4096)(self._encode_piece)

    def _encode_piece(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(text))

    def ids(self, pieces: Sequence[str]) -> list[int]:
        return [i for piece in pieces for i in self._encode(piece)]

    def word_ids(self, words: Sequence[str]) -> list[int]:
        """One id per output word (its first token): what the engine appends as it generates."""
        return [self._encode(w)[0] for w in words]
