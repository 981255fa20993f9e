"""`make bench`: measurements of llmload itself (speed and timing honesty), printed as tables."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def client_on_core_0() -> Iterator[None]:
    """Pin this process (the client) to core 0 while the block runs; the target is put on core 1.

    Restored afterwards: a later benchmark in the same process (the workload builder, whose
    tokenizer uses threads) must have every core again.
    """
    before = os.sched_getaffinity(0)
    if len(before) > 1:
        os.sched_setaffinity(0, {0})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def write_between_markers(doc: Path, begin: str, end: str, text: str) -> None:
    """Replace what stands between the `begin` and `end` marker lines of `doc` (a docs/ page whose
    tables a benchmark regenerates) with `text`, the markers kept."""
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    doc.write_text(pattern.sub(lambda _: f"{begin}\n{text}\n{end}", doc.read_text()))
