"""`azure-trace`: Azure LLM inference trace CSV, lengths only."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from llmload.workload.formats.common import (
    BadLine,
    FormatError,
    Head,
    Issue,
    LogFormat,
    LogRequest,
    Parsed,
    integer,
    log_timestamp,
)

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_azure_trace(path: Path) -> Iterator[Parsed]:
    """Azure LLM inference trace CSV (2023/2024): one request per row, lengths only; the columns are
    found by name, and a header without one of them is refused naming it.

    Example::

        TIMESTAMP,ContextTokens,GeneratedTokens
        2023-11-16 18:15:46.6805900,374,44
    """
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = [name.strip() for name in next(reader, [])]
        missing = [name for name in _AZURE_COLUMNS if name not in header]
        if missing:
            raise FormatError(
                f"{path}:1: no column {' or '.join(missing)} (it has {', '.join(header) or 'no columns'})"
            )
        stamp_at, context_at, generated_at = (header.index(name) for name in _AZURE_COLUMNS)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:
                continue
            if len(row) < len(header):
                yield Issue(where, f"{len(row)} column(s), not {len(header)}", category="short row")
                continue
            try:
                yield LogRequest(
                    where=where,
                    timestamp=log_timestamp(row[stamp_at].strip()),
                    prompt_tokens=_whole(row[context_at], "ContextTokens", minimum=1),
                    output_tokens=_whole(row[generated_at], "GeneratedTokens"),
                )
            except BadLine as exc:
                yield Issue(where, str(exc), category="bad value")


def _whole(text: str, column: str, *, minimum: int = 0) -> int:
    """A token count: a whole number, at least `minimum`."""
    try:
        value = int(text)
    except ValueError:
        raise BadLine(f"{column} {text!r} is not a whole number") from None
    return integer(value, column, minimum=minimum)


def _sniff(head: Head) -> bool:
    """A CSV header naming one of the trace's columns (a missing one is the parser's to name)."""
    return bool(set(_AZURE_COLUMNS) & {name.strip() for name in head.first_line.split(",")})


FORMAT = LogFormat(name="azure-trace", title="an Azure trace", sniff=_sniff, parse=parse_azure_trace)
