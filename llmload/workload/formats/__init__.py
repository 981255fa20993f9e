"""Request logs in, `LogRequest`s out: format detection and one streaming parser per format.

Parsers read one line (or one JSON value) at a time and yield, in file order, a `LogRequest`
for each request or an `Issue` for each line they cannot use, so a caller can report every bad
line as `file:line: reason` and memory stays flat however long the log is. They keep what the
log tells and nothing more: fields a log lacks stay None, and tokenizing, grouping into
sessions and synthesis are the builder's job (`llmload.workload.build`).

Each format is one module declaring its `FORMAT` (name, sniff, parser); `FORMATS` lists them in
the order `--format` offers them. Adding a format is one new module and one entry in `FORMATS`.
Today: `openai_jsonl`, `messages_jsonl`, `openai_batch`, `sharegpt`, `litellm`, `langfuse`, `helicone`,
`otel_genai`, `vllm_log`, `azure_trace`, `mooncake` and `weka`, over the shared types and JSON helpers
of `common`. The JSON formats read JSONL, JSON arrays of the same records, indented JSON objects one
after another, and saved API response pages (`{"data": [...], "meta": ...}`) alike (`json_records`):
detection sees a JSON array's first element, an indented first object, or a page's first record as it
sees a first line (docs/workload-format.md lists every format's detection rule and what it keeps).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from llmload.workload.formats import (
    azure_trace,
    helicone,
    langfuse,
    litellm,
    messages_jsonl,
    mooncake,
    openai_batch,
    openai_jsonl,
    otel_genai,
    sharegpt,
    vllm_log,
    weka,
)
from llmload.workload.formats.common import (
    DETECT_BYTES,
    FormatError,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    envelope,
    json_array_items,
    json_values,
)

__all__ = [
    "FORMATS",
    "FORMAT_NAMES",
    "FormatError",
    "Head",
    "Issue",
    "LogFormat",
    "LogRequest",
    "Parsed",
    "detect_format",
    "format_named",
    "log_format",
    "read_log",
]

FORMATS: tuple[LogFormat, ...] = (
    openai_jsonl.FORMAT,
    messages_jsonl.FORMAT,
    openai_batch.FORMAT,
    sharegpt.FORMAT,
    litellm.FORMAT,
    langfuse.FORMAT,
    helicone.FORMAT,
    otel_genai.FORMAT,
    vllm_log.FORMAT,
    azure_trace.FORMAT,
    mooncake.FORMAT,
    weka.FORMAT,
)
FORMAT_NAMES = tuple(f.name for f in FORMATS)
_BY_NAME = {f.name: f for f in FORMATS}
_SNIFF_ORDER = sorted(FORMATS, key=lambda f: f.fallback)  # stable: FORMATS order, loose sniffs last


def _first_line(path: Path) -> tuple[bytes, bytes]:
    """The first 64 KiB and the first non-blank line (whole however long it is: one JSON request may
    be megabytes); FormatError for a file that cannot be read or holds nothing."""
    try:
        with path.open("rb") as handle:
            head = handle.read(DETECT_BYTES)
            handle.seek(0)
            first_line = next((line for line in handle if line.strip()), b"")
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    if not first_line:
        raise FormatError(f"{path}: empty")
    return head, first_line


def _first_element(path: Path) -> Any:
    """The first element of a log that is JSON arrays (None: none, or not valid JSON)."""
    item = next(json_array_items(path), None)
    return item[1] if isinstance(item, tuple) else None


def _sniff(path: Path) -> tuple[LogFormat | None, dict[str, Any] | None]:
    """The format whose sniff takes the log's head (None: no format's), and its first JSON object
    (its first line decoded, or a JSON array's first element), when it has one."""
    head, first_line = _first_line(path)
    first = first_line.decode("utf-8", errors="replace").strip()
    record: dict[str, Any] | None = None
    if first.startswith("{"):
        try:
            value = orjson.loads(first)
        except orjson.JSONDecodeError:
            value = None
        if value is None and not first.endswith("}"):  # an indented JSON value: read it whole
            try:
                item = next(json_values(path), None)
            except (UnicodeDecodeError, OSError):
                item = None
            value = item[1] if isinstance(item, tuple) else None
        if not isinstance(value, dict):
            raise FormatError(f"{path}:1: first line is not a JSON object; use --format")
        records = envelope(value)  # an API response page: its first record tells the format
        record = value if records is None else records[0] if records and isinstance(records[0], dict) else None
    elif first.startswith("["):
        element = _first_element(path)
        record = element if isinstance(element, dict) else None
    seen = Head(first_line=first, record=record, text=head.decode("utf-8", errors="replace"))
    return next((fmt for fmt in _SNIFF_ORDER if fmt.sniff(seen)), None), record


def format_named(name: str) -> LogFormat:
    """The format of a `--format` name (one of FORMAT_NAMES)."""
    return _BY_NAME[name]


def detect_format(path: Path) -> str:
    """The format of a log from its first non-blank line and, for vLLM logs, its first 64 KiB."""
    fmt, record = _sniff(path)
    if fmt is not None:
        return fmt.name
    if record is not None:
        raise FormatError(f"{path}:1: a JSON object of no known log format (keys {sorted(record)[:8]})")
    raise FormatError(f"{path}: cannot tell the log format; use --format ({', '.join(FORMAT_NAMES)})")


def log_format(path: Path) -> LogFormat | None:
    """The log format `path` is in, or None (it is something else: a workload, say, or unreadable)."""
    try:
        return _sniff(path)[0]
    except FormatError:
        return None


def read_log(path: Path, fmt: str | None = None) -> tuple[str, Iterator[Parsed]]:
    """The format (given or detected) and the stream of parsed requests and issues of one file."""
    if fmt is None:
        fmt = detect_format(path)
    else:
        _first_line(path)  # an empty file is refused as such, whatever format was given
    if fmt not in _BY_NAME:
        raise FormatError(f"unknown format {fmt!r}: one of {', '.join(FORMAT_NAMES)}")
    return fmt, _BY_NAME[fmt].parse(path)
