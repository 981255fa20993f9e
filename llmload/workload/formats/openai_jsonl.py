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
    chat_messages,
    json_records,
    log_timestamp,
    milliseconds,
    parse_records,
    request_max_tokens,
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
    reply, prompt_tokens, output_tokens = chat_completion(record.get("response") or {}, "response")
    timestamp = log_timestamp(record.get("timestamp"))
    finished = log_timestamp(record.get("response_timestamp"))
    latency = milliseconds(record.get("latency_ms"), "latency_ms")
    if latency is not None and timestamp is not None:
        finished = timestamp + latency
    yield LogRequest(
        where=where,
        timestamp=timestamp,
        finished=finished,
        messages=chat_messages(body.get("messages")),
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
