"""`make bench`: measurements of llmload itself (speed and timing honesty), printed as tables."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


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
