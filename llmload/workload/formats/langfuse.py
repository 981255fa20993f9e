"""`langfuse`: Langfuse observation exports, JSONL or a JSON array: the UI's batch export (camelCase keys)
or the blob-storage export (snake_case keys). Each GENERATION observation is one request; spans, events
and the other observation types are ignored and counted.

Kept: `startTime` and `endTime` (ISO 8601; the end separates think time from the reply), the `input`
messages (a list, `{"messages": [...]}`, a JSON string of either, or a plain prompt string, sent as one
user message), the reply text of `output`, `modelParameters.max_tokens`, and the token counts of
`usageDetails` (else `usage`, else `promptTokens`/`completionTokens`; 0, Langfuse's "not counted", is
taken as unknown).

Source: langfuse/langfuse `packages/shared/src/server/repositories/observations.ts` (the export's
columns: start_time, end_time, completion_start_time, input, output, provided_model_name,
model_parameters, usage_details) and the public API's `Observation` (usage {input, output, total}).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from llmload.workload.formats.common import (
    BadLine,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    chat_completion,
    chat_messages,
    json_records,
    log_timestamp,
    optional_integer,
    parse_records,
    token_count,
)


def _field(record: dict[str, Any], camel: str, snake: str) -> Any:
    """A field under the UI export's camelCase name or the blob export's snake_case one."""
    return record.get(camel, record.get(snake))


def _decoded(value: Any) -> Any:
    """A JSON string decoded (the blob export keeps input, output and parameters as JSON text)."""
    if isinstance(value, str) and value.lstrip()[:1] in ("[", "{"):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def _messages(value: Any) -> list[dict[str, str]]:
    value = _decoded(value)
    if isinstance(value, dict):
        value = value.get("messages")
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return chat_messages(value)


def _reply(value: Any) -> str | None:
    value = _decoded(value)
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "choices" in value:
        return chat_completion(value, "output")[0]
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


def _digits(value: Any) -> Any:
    """An integer written as a string ("256": Langfuse keeps model parameters so, ClickHouse 64-bit counts)
    as an integer; anything else as it is."""
    return int(value) if isinstance(value, str) and value.isdigit() else value


def _parameter(parameters: Any, name: str) -> int | None:
    value = parameters.get(name) if isinstance(parameters, dict) else None
    return optional_integer(_digits(value), f"modelParameters.{name}", minimum=1)


def _langfuse_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """One observation.

    Example (keys abridged)::

        {"id": "obs-1", "traceId": "trace-1", "type": "GENERATION", "name": "chat",
         "startTime": "2026-11-20T10:00:00.000Z", "endTime": "2026-11-20T10:00:01.200Z",
         "completionStartTime": "2026-11-20T10:00:00.300Z", "model": "gpt-4o", "modelParameters": {"max_tokens": 64},
         "input": [{"role": "user", "content": "Hi"}], "output": {"role": "assistant", "content": "Hello"},
         "usageDetails": {"input": 9, "output": 2, "total": 11}}
    """
    kind = record.get("type")
    if kind != "GENERATION":
        yield Issue(where, f"not a generation: type {kind!r}", fatal=False, category="not a generation")
        return
    usage = _field(record, "usageDetails", "usage_details") or record.get("usage") or {}
    if not isinstance(usage, dict):
        raise BadLine("bad record: usageDetails is not an object")
    parameters = _decoded(_field(record, "modelParameters", "model_parameters"))
    yield LogRequest(
        where=where,
        timestamp=log_timestamp(_field(record, "startTime", "start_time")),
        finished=log_timestamp(_field(record, "endTime", "end_time")),
        messages=_messages(record.get("input")),
        max_tokens=_parameter(parameters, "max_completion_tokens") or _parameter(parameters, "max_tokens"),
        prompt_tokens=token_count(_digits(usage.get("input", record.get("promptTokens"))), "usage input"),
        output_tokens=token_count(_digits(usage.get("output", record.get("completionTokens"))), "usage output"),
        reply=_reply(record.get("output")),
    )


def parse_langfuse(path: Path) -> Iterator[Parsed]:
    """Langfuse observation exports (see `_langfuse_record`)."""
    return parse_records(json_records(path), _langfuse_record)


def _sniff(head: Head) -> bool:
    """A first JSON object with an observation's `type`, start time and trace id (either spelling)."""
    record = head.record
    return (
        record is not None
        and "type" in record
        and ("startTime" in record or "start_time" in record)
        and ("traceId" in record or "trace_id" in record)
    )


FORMAT = LogFormat(name="langfuse", title="a Langfuse observations export", sniff=_sniff, parse=parse_langfuse)
