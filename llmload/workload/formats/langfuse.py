"""`langfuse`: Langfuse observation exports, JSONL, a JSON array or CSV (objects as JSON text in their
cells): the UI's batch export (camelCase keys) or the blob-storage export (snake_case keys). Each
GENERATION observation is one request; spans, events and the other observation types are ignored and
counted.

Kept: `startTime` and `endTime` (ISO 8601; the end separates think time from the reply), the `input`
messages (a list, `{"messages": [...]}`, a JSON string of either, or a plain prompt string, sent as one
user message), the reply text of `output`, `modelParameters.max_tokens`, and the token counts of
`usageDetails` (else `usage`, else `promptTokens`/`completionTokens`; `input`/`output`, or a provider's
`prompt_tokens`/`completion_tokens` or `input_tokens`/`output_tokens` kept as they came; 0, Langfuse's
"not counted", is taken as unknown). A saved page of the public API (`{"data": [...], "meta": {...}}`)
reads as its observations. A traces export (no `type`, a `timestamp`) is refused at each line, naming
what to export instead.

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
    csv_header,
    log_timestamp,
    optional_integer,
    parse_records,
    request_messages,
    table_records,
    token_count,
)

_INPUT = ("input", "prompt_tokens", "input_tokens")
_OUTPUT = ("output", "completion_tokens", "output_tokens")


def _is_trace(record: dict[str, Any]) -> bool:
    """A trace of a Langfuse traces export (the UI's Traces table, `GET /api/public/traces`): a `timestamp`
    and the trace's own fields, where an observation has `type`, `startTime` and `traceId`."""
    return (
        "timestamp" in record
        and "type" not in record
        and "input" in record
        and any(key in record for key in ("sessionId", "htmlPath", "observations", "session_id"))
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
        return request_messages(value)  # {"messages": [...]}, an Anthropic body's `system` first
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    return chat_messages(value)


def _reply(value: Any) -> str | None:
    """The reply text of `output`: a string, a message (text or text parts), a list of messages (the
    first) or of content parts, or a whole chat completion."""
    value = _decoded(value)
    if isinstance(value, list) and value and all(isinstance(v, dict) and "role" not in v for v in value):
        value = {"content": value}  # content parts or blocks, as an Anthropic reply's are logged
    elif isinstance(value, list) and value and isinstance(value[0], dict):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and ("choices" in value or value.get("type") == "message"):
        return chat_completion(value, "output")[0]
    content = value.get("content") if isinstance(value, dict) else None
    if isinstance(content, list):
        return chat_messages([{"role": "assistant", "content": content}])[0]["content"]
    return content if isinstance(content, str) else None


def _count(usage: dict[str, Any], names: tuple[str, ...], fallback: Any) -> Any:
    """The first of `names` that `usage` has (Langfuse's own `input`/`output`, or a provider's keys kept as
    they came), else `fallback`."""
    return next((usage[name] for name in names if usage.get(name) is not None), fallback)


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
    if kind is None and _is_trace(record):
        raise BadLine(
            "a Langfuse trace, not an observation: export the observations instead (the Generations table's"
            " export, or GET /api/public/observations?type=GENERATION)"
        )
    if kind != "GENERATION":
        yield Issue(where, f"not a generation: type {kind!r}", fatal=False, category="not a generation")
        return
    usage = _decoded(_field(record, "usageDetails", "usage_details") or record.get("usage")) or {}
    if not isinstance(usage, dict):
        raise BadLine("bad record: usageDetails is not an object")
    parameters = _decoded(_field(record, "modelParameters", "model_parameters"))
    yield LogRequest(
        where=where,
        timestamp=log_timestamp(_field(record, "startTime", "start_time")),
        finished=log_timestamp(_field(record, "endTime", "end_time")),
        messages=_messages(record.get("input")),
        max_tokens=_parameter(parameters, "max_completion_tokens") or _parameter(parameters, "max_tokens"),
        prompt_tokens=token_count(_digits(_count(usage, _INPUT, record.get("promptTokens"))), "usage input"),
        output_tokens=token_count(_digits(_count(usage, _OUTPUT, record.get("completionTokens"))), "usage output"),
        reply=_reply(record.get("output")),
    )


def parse_langfuse(path: Path) -> Iterator[Parsed]:
    """Langfuse observation exports (see `_langfuse_record`)."""
    return parse_records(table_records(path), _langfuse_record)


def _sniff(head: Head) -> bool:
    """A first JSON object with an observation's `type`, start time and trace id (either spelling)."""
    record = head.record if head.record is not None else dict.fromkeys(csv_header(head))
    if _is_trace(record):
        return True  # refused at each line, naming what to export instead
    return (
        "type" in record
        and ("startTime" in record or "start_time" in record)
        and ("traceId" in record or "trace_id" in record)
    )


FORMAT = LogFormat(name="langfuse", title="a Langfuse observations export", sniff=_sniff, parse=parse_langfuse)
