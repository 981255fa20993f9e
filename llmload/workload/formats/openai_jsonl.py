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
    chat_messages,
    json_lines,
    log_timestamp,
    optional_integer,
    parse_records,
)


def _openai_record(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """A bare chat-completions request body, or a `{timestamp, request, response}` record. The
    response's end, when given as `response_timestamp` or `latency_ms`, separates a user's think
    time from the time the reply took.

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
    if not isinstance(response, dict):
        raise BadLine("bad record: response is not an object")
    usage = response.get("usage") or {}
    if not isinstance(usage, dict):
        raise BadLine("bad record: response.usage is not an object")
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    reply = message.get("content") if isinstance(message, dict) else None
    timestamp = log_timestamp(record.get("timestamp"))
    finished = log_timestamp(record.get("response_timestamp"))
    latency_ms = record.get("latency_ms")
    if latency_ms is not None:
        if not isinstance(latency_ms, (int, float)) or isinstance(latency_ms, bool) or latency_ms < 0:
            raise BadLine(f"bad latency_ms: {latency_ms!r} is not a number of milliseconds ≥ 0")
        if timestamp is not None:
            finished = timestamp + latency_ms / 1000
    yield LogRequest(
        where=where,
        timestamp=timestamp,
        finished=finished,
        messages=chat_messages(body.get("messages")),
        max_tokens=optional_integer(body.get("max_completion_tokens", body.get("max_tokens")), "max_tokens", minimum=1),
        prompt_tokens=optional_integer(usage.get("prompt_tokens"), "usage.prompt_tokens"),
        output_tokens=optional_integer(usage.get("completion_tokens"), "usage.completion_tokens"),
        reply=reply if isinstance(reply, str) else None,
    )


def parse_openai_jsonl(path: Path) -> Iterator[Parsed]:
    """OpenAI chat-completions request logs, one JSON object per line (see `_openai_record`)."""
    return parse_records(json_lines(path), _openai_record)


def _sniff(head: Head) -> bool:
    """A first line that is a request body or a `{timestamp, request, response}` record."""
    return head.record is not None and ("messages" in head.record or "request" in head.record)


FORMAT = LogFormat(
    name="openai-jsonl", title="an OpenAI JSONL log", sniff=_sniff, parse=parse_openai_jsonl, fallback=True
)
