"""`azure-trace`: Azure LLM inference trace CSV, lengths only."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

from llmload.workload.formats.common import Head, Issue, LogFormat, LogRequest, Parsed, integer, log_timestamp

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def parse_azure_trace(path: Path) -> Iterator[Parsed]:
    """Azure LLM inference trace CSV (2023/2024): one request per row, lengths only.

    Example::

        TIMESTAMP,ContextTokens,GeneratedTokens
        2023-11-16 18:15:46.6805900,374,44
    """
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != _AZURE_COLUMNS:
            yield Issue(f"{path}:1", f"bad header: not {','.join(_AZURE_COLUMNS)}")
            return
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if not row:
                continue
            try:
                stamp, context, generated = row[:3]
                yield LogRequest(
                    where=where,
                    timestamp=log_timestamp(stamp.strip()),
                    prompt_tokens=integer(int(context), "ContextTokens", minimum=1),
                    output_tokens=integer(int(generated), "GeneratedTokens"),
                )
            except ValueError as exc:  # includes BadLine, short rows and non-integer fields
                yield Issue(where, f"bad row: {exc}")


def _sniff(head: Head) -> bool:
    """The trace's header as the first line."""
    return head.first_line.split(",")[:3] == list(_AZURE_COLUMNS)


FORMAT = LogFormat(name="azure-trace", sniff=_sniff, parse=parse_azure_trace)
