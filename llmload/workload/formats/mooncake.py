"""`mooncake`: Mooncake-style JSONL traces, lengths and prefix blocks only."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from llmload.workload.formats.common import (
    BadLine,
    Head,
    LogFormat,
    LogRequest,
    Parsed,
    integer,
    json_records,
    parse_records,
)

MOONCAKE_BLOCK_TOKENS = 512


def _mooncake_record(where: str, record: dict[str, Any]) -> Iterator[LogRequest]:
    """A Mooncake trace line; `hash_ids` name the prompt's 512-token blocks (shared = same prefix).

    Example::

        {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 59]}
    """
    stamp = record.get("timestamp")
    if isinstance(stamp, bool) or not isinstance(stamp, int | float):
        raise BadLine(f"bad timestamp: {stamp!r} is not a number of milliseconds")
    length = integer(record.get("input_length"), "input_length", minimum=1)
    hash_ids = record.get("hash_ids") or []
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) for h in hash_ids):
        raise BadLine("bad hash_ids: not a list of integers")
    if hash_ids and len(hash_ids) != -(-length // MOONCAKE_BLOCK_TOKENS):
        raise BadLine(f"bad hash_ids: {len(hash_ids)} blocks for input_length {length} (512 tokens per block)")
    yield LogRequest(
        where=where,
        timestamp=stamp / 1000,
        prompt_tokens=length,
        output_tokens=integer(record.get("output_length"), "output_length"),
        hash_ids=np.asarray(hash_ids, dtype=np.int64) if hash_ids else None,
    )


def parse_mooncake(path: Path) -> Iterator[Parsed]:
    """Mooncake-style JSONL traces (timestamp in ms, input_length, output_length, hash_ids)."""
    return parse_records(json_records(path), _mooncake_record)


def _sniff(head: Head) -> bool:
    """A first JSON object with Mooncake's `hash_ids` or `input_length`."""
    return head.record is not None and ("hash_ids" in head.record or "input_length" in head.record)


FORMAT = LogFormat(
    name="mooncake",
    title="a Mooncake trace",
    sniff=_sniff,
    parse=parse_mooncake,
    hash_block_tokens=MOONCAKE_BLOCK_TOKENS,
)
