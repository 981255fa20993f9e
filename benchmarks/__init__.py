"""`make bench`: measurements of llmload itself (speed and timing honesty), printed as tables."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import psutil


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


class StealMeter:
    """CPU time the hypervisor gave to other guests ("steal") since creation, in % of all CPU time.

    On a VM, a vCPU descheduled for a few ms delays client and target alike: timing tails that
    neither caused. The tables print it beside every timing figure so a bad run explains itself.
    """

    def __init__(self) -> None:
        self._start = psutil.cpu_times()

    @property
    def percent(self) -> float:
        now = psutil.cpu_times()
        total = sum(now) - sum(self._start)
        steal = getattr(now, "steal", 0.0) - getattr(self._start, "steal", 0.0)
        return 100.0 * steal / total if total > 0 else 0.0
