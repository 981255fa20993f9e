"""Failure classification: what went wrong, in the categories reports and gates count.

Rules are ordered from the most specific cause to the most generic, and the same rules apply
to an HTTP error body and to an error object that arrives inside an HTTP 200 stream (vLLM sends
its back-pressure 503 and engine-death 500 that way), so the category names the cause and the
message says where it was seen.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

import gevent
import orjson
from geventhttpclient.response import HTTPConnectionClosed

from llmload.access import tls_reason
from llmload.models import FailureCategory

MESSAGE_LIMIT = 500

_CONTEXT_MARKERS = (
    "maximum context length",
    # vLLM clamps max_tokens to max_model_len - prompt; a forced min_tokens above that is refused
    "min_tokens must be less than or equal to max_tokens",
    "context length",
    "context window",
    "prompt is too long",
    "too many input tokens",
)
_CONTEXT_PARAMS = frozenset({"input_tokens", "input_text", "prompt"})
# a model or LoRA adapter the server does not serve: vLLM's 404 "The model `x` does not exist." (param "model")
_MODEL_MARKERS = ("does not exist", "model not found", "no such model")
_OOM_MARKERS = (
    "out of memory",
    "outofmemoryerror",
    "no available memory for the cache blocks",
    "cuda error: out of memory",
    "insufficient memory",
)
_ENGINE_DEAD_MARKERS = ("enginedeaderror", "enginecore encountered an issue", "engine is dead", "engine loop")


def _error_fields(body: Any) -> tuple[str, str | None]:
    """(message, param) from an OpenAI-style error body, whatever its nesting."""
    if isinstance(body, dict):
        err = body.get("error", body)
        if isinstance(err, dict):
            message = err.get("message") or err.get("detail") or orjson.dumps(err).decode()
            param = err.get("param")
            return str(message), str(param) if param is not None else None
        if isinstance(err, str):
            return err, None
    return str(body), None


def parse_error_body(raw: bytes) -> tuple[str, str | None]:
    try:
        return _error_fields(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip(), None


def classify_error(status: int | None, message: str, param: str | None = None) -> FailureCategory | None:
    """The specific cause an error message names, or None when it names none."""
    text = message.lower()
    if (status in (None, 400, 413, 422)) and (param in _CONTEXT_PARAMS or any(m in text for m in _CONTEXT_MARKERS)):
        return "context_length"
    if status == 404 and (param == "model" or any(m in text for m in _MODEL_MARKERS)):
        return "model_not_found"
    if any(m in text for m in _OOM_MARKERS):
        return "oom"
    if any(m in text for m in _ENGINE_DEAD_MARKERS):
        return "engine_dead"
    if status in (429, 503):
        return "rate_limited"
    return None


def classify_http_status(status: int, message: str, param: str | None = None) -> FailureCategory:
    specific = classify_error(status, message, param)
    if specific is not None:
        return specific
    return "http_4xx" if status < 500 else "http_5xx"


def classify_stream_error(error_obj: Any) -> tuple[FailureCategory, int | None, str]:
    """An error object inside a 200 stream: (category, the code it carries, message)."""
    message, param = _error_fields({"error": error_obj} if not isinstance(error_obj, dict) else error_obj)
    code = error_obj.get("code") if isinstance(error_obj, dict) else None
    status = code if isinstance(code, int) else None
    category = classify_error(status, message, param) or "stream_error"
    return category, status, f"in-stream error: {message}"


# failures whose cause the server's /health tells: a dead engine (503) or a server gone (unreachable)
HEALTH_PROBED: frozenset[str] = frozenset({"server_down", "stream_error", "http_5xx"})


def refine_with_health(category: FailureCategory, message: str, health: int | None) -> tuple[FailureCategory, str]:
    """vLLM answers /health 503 once its engine is dead, and stops listening soon after; a server
    that closed a connection yet answers /health is not down."""
    if health == 503 and category in HEALTH_PROBED:
        return "engine_dead", f"{message} (/health answered 503: engine dead)"
    if health is None and category == "stream_error":
        return "server_down", f"{message} (server unreachable afterwards)"
    if health == 200 and category == "server_down":
        return "stream_error", f"{message} (yet /health answered 200: the server is up)"
    return category, message


def classify_exception(exc: BaseException, *, got_response: bool) -> tuple[FailureCategory, str]:
    """Transport-level failures: a limit hit, the stream cut, the server gone or garbled."""
    name = type(exc).__name__
    detail = f"{name}: {exc}" if str(exc) else name
    if isinstance(exc, (gevent.Timeout, socket.timeout, TimeoutError)):
        return "timeout", detail
    # a refused handshake (untrusted certificate, a client certificate required, plain HTTP on the port), never
    # the connection closing, which OpenSSL reports as an EOF or a close notify
    if not isinstance(exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError)) and (reason := tls_reason(exc)):
        return "tls", f"TLS: {reason}"
    if got_response:
        return "stream_error", f"stream cut short: {detail}"
    if isinstance(exc, (OSError, HTTPConnectionClosed)):
        return "server_down", detail
    return "http_5xx", f"unreadable response: {detail}"


def clip(message: str, secrets: tuple[str, ...] = ()) -> str:
    """Messages go into records and reports: bounded, and never carrying the API key or a header's value."""
    for secret in secrets:
        message = message.replace(secret, "***")
    return message if len(message) <= MESSAGE_LIMIT else message[: MESSAGE_LIMIT - 1] + "…"
