"""`openai-jsonl`: OpenAI chat-completions request logs, one JSON object per line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from llmload.workload.formats.common import (
    BadLine,
    Head,
    LogFormat,
    LogRequest,
    Parsed,
    chat_completion,
    json_records,
    log_timestamp,
    milliseconds,
    parse_records,
    request_max_tokens,
    request_messages,
)

_START_KEYS = ("timestamp", "created_at", "start_time", "request_time")
_END_KEYS = ("response_timestamp", "end_time", "completed_at")
_LATENCY_KEYS = ("latency_ms", "duration_ms")


def _first(record: dict[str, Any], keys: tuple[str, ...]) -> Any:
    """The first of `keys` the record has a value for (gateways name the same time differently)."""
    return next((record[key] for key in keys if record.get(key) is not None), None)


def _created(response: dict[str, Any] | list[Any]) -> Any:
    """A logged response's `created` (unix seconds; a streamed one's first chunk's)."""
    first = response[0] if isinstance(response, list) and response else response
    return first.get("created") if isinstance(first, dict) else None


def _openai_record(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """A bare chat-completions request body, or a `{timestamp, request, response}` record. The
    response's end, when given as `response_timestamp` or `latency_ms`, separates a user's think
    time from the time the reply took. Gateways name these otherwise: the start may be `created_at`,
    `start_time` or `request_time` (else the logged completion's `created`), the end `end_time` or
    `completed_at`, the latency `duration_ms`; a streamed response may be logged as its chunks.

    Example lines::

        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}
        {"timestamp": "2026-11-20T10:00:00Z", "latency_ms": 840, "request": {"messages": [...], "max_tokens": 64},
         "response": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}],
                      "usage": {"prompt_tokens": 9, "completion_tokens": 2}}}
    """
    body = record.get("request", record)
    if not isinstance(body, dict):
        raise BadLine("bad record: request is not an object")
    response = record.get("response") or {}
    reply, prompt_tokens, output_tokens = chat_completion(response, "response")
    timestamp = log_timestamp(_first(record, _START_KEYS))
    if timestamp is None and isinstance(response, dict | list) and body is not record:
        timestamp = log_timestamp(_created(response))  # the completion's `created`: when it was asked
    finished = log_timestamp(_first(record, _END_KEYS))
    latency = milliseconds(_first(record, _LATENCY_KEYS), "latency_ms")
    if latency is not None and timestamp is not None:
        finished = timestamp + latency
    yield LogRequest(
        where=where,
        timestamp=timestamp,
        finished=finished,
        messages=request_messages(body),
        max_tokens=request_max_tokens(body),
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        reply=reply,
    )


def parse_openai_jsonl(path: Path) -> Iterator[Parsed]:
    """OpenAI chat-completions request logs, one JSON object per line or a JSON array of them (see `_openai_record`)."""
    return parse_records(json_records(path), _openai_record)


def _sniff(head: Head) -> bool:
    """A first line that is a request body or a `{timestamp, request, response}` record."""
    return head.record is not None and ("messages" in head.record or "request" in head.record)


FORMAT = LogFormat(
    name="openai-jsonl", title="an OpenAI JSONL log", sniff=_sniff, parse=parse_openai_jsonl, fallback=True
)
