"""`helicone`: Helicone request exports (`npx @helicone/export`, JSONL, JSON or CSV; the REST API's
`/v1/request/query-clickhouse` rows, or a saved response page `{"data": [...], "error": null}`): one
request a row. The CSV export has no response bodies, and its JSON cells carry the export tool's doubled
quotes (read as they were meant).

Kept: `request_created_at` (ISO 8601, or ClickHouse's "2026-11-20 10:00:00.000", UTC), the response's end
(`response_created_at`, else the start plus `delay_ms` or `latency`, milliseconds), the messages and
`max_tokens` of `request_body`, the reply text of `response_body`, `prompt_tokens` and `completion_tokens`
(else the response's usage). A row exported without bodies (no `--include-body`) is a length-only
request of its token counts. Failed requests (`response_status` other than 200) and rows of other
endpoints (a body without `messages`: embeddings, completions) are ignored and counted.

Source: Helicone/helicone `examples/export/typescript/index.ts` (the export tool) and the
`HeliconeRequest` row type of its API (`request_created_at`, `request_body`, `response_body`,
`response_status`, `delay_ms`, `prompt_tokens`, `completion_tokens`; the CSV writer's `convertToCSVRow`).
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
    csv_header,
    log_timestamp,
    milliseconds,
    object_field,
    parse_records,
    request_max_tokens,
    request_messages,
    table_records,
    token_count,
)

_JSON_COLUMNS = ("request_body", "response_body", "request_properties")
_NUMBER_COLUMNS = ("response_status", "prompt_tokens", "completion_tokens", "delay_ms", "latency")


def _json_text(value: str, column: str) -> Any:
    """A CSV cell of JSON. The export tool doubles the quotes of an object's JSON before it quotes the
    cell (so each is doubled twice): the cell read is JSON with `""` for `"`, undone here."""
    for text in (value, value.replace('""', '"')):
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
    raise BadLine(f"bad record: {column} is not JSON")


def _number(value: str, column: str) -> int | float:
    try:
        return int(value)
    except ValueError:
        try:
            return float(value)
        except ValueError:
            raise BadLine(f"bad record: {column} is {value!r}, not a number") from None


def _from_text(record: dict[str, Any]) -> dict[str, Any]:
    """A row of the CSV export (every cell text) with its JSON and number columns read; a JSON row as it is."""
    if not any(isinstance(record.get(c), str) for c in _JSON_COLUMNS + _NUMBER_COLUMNS):
        return record
    out = dict(record)
    for column in _JSON_COLUMNS:
        if isinstance(out.get(column), str) and out[column].lstrip()[:1] in ("{", "["):
            out[column] = _json_text(out[column], column)
    for column in _NUMBER_COLUMNS:
        if isinstance(out.get(column), str):
            out[column] = _number(out[column], column)
    return out


def _helicone_record(where: str, record: dict[str, Any]) -> Iterator[Parsed]:
    """One exported request.

    Example (keys abridged)::

        {"request_id": "8c1f…", "request_created_at": "2026-11-20T10:00:00.000Z",
         "request_path": "/v1/chat/completions",
         "request_body": {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64},
         "response_status": 200, "response_created_at": "2026-11-20T10:00:00.840Z",
         "response_body": {"choices": [{"message": {"role": "assistant", "content": "Hello"}}], "usage": {...}},
         "model": "gpt-4o", "prompt_tokens": 9, "completion_tokens": 2, "delay_ms": 840, "cost": 2.5e-05}
    """
    record = _from_text(record)
    status = record.get("response_status")
    if status is not None and status != 200:
        yield Issue(where, f"failed request: response_status {status!r}", fatal=False, category="failed request")
        return
    body = object_field(record, "request_body")
    if body and "messages" not in body:
        yield Issue(
            where, "not a chat request: request_body has no messages", fatal=False, category="not a chat request"
        )
        return
    reply, usage_prompt, usage_output = chat_completion(record.get("response_body") or None, "response_body")
    prompt_tokens = token_count(record.get("prompt_tokens"), "prompt_tokens") or usage_prompt
    if not body and prompt_tokens is None:
        raise BadLine("no prompt: neither request_body.messages nor prompt_tokens")
    timestamp = log_timestamp(record.get("request_created_at"))
    finished = log_timestamp(record.get("response_created_at"))
    took = milliseconds(record.get("delay_ms", record.get("latency")), "delay_ms")
    if finished is None and took is not None and timestamp is not None:
        finished = timestamp + took
    yield LogRequest(
        where=where,
        timestamp=timestamp,
        finished=finished,
        messages=request_messages(body) if body else None,
        max_tokens=request_max_tokens(body),
        prompt_tokens=prompt_tokens,
        output_tokens=token_count(record.get("completion_tokens"), "completion_tokens") or usage_output,
        reply=reply,
    )


def parse_helicone(path: Path) -> Iterator[Parsed]:
    """Helicone request exports (see `_helicone_record`), in time order, as arrivals are measured from the
    first row's time. The export tool writes the newest request first: a row earlier than one before it is
    a bad line (skipped with --skip-bad), asking for the file reversed."""
    latest: float | None = None
    for item in parse_records(table_records(path), _helicone_record):
        if (
            isinstance(item, LogRequest)
            and item.timestamp is not None
            and latest is not None
            and item.timestamp < latest
        ):
            yield Issue(item.where, "out of order: request_created_at is before an earlier row's; the export lists"
                        " the newest first: reverse its rows (tac, for JSONL; a CSV's header stays first)")  # fmt: skip
            continue
        if isinstance(item, LogRequest) and item.timestamp is not None:
            latest = item.timestamp
        yield item


def _sniff(head: Head) -> bool:
    """A first JSON object with Helicone's `request_created_at` or `request_body`, or a CSV header naming them."""
    names = head.record if head.record is not None else csv_header(head)
    return "request_created_at" in names or "request_body" in names


FORMAT = LogFormat(name="helicone", title="a Helicone request export", sniff=_sniff, parse=parse_helicone)
