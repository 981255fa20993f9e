"""Emitting a stream's chunks at absolute deadlines, and measuring how late they really left.

Streams are not coroutines sleeping per token: one Pacer keeps every stream's next deadline in
a heap and writes what is due straight to the transports, a few microseconds per chunk, so
hundreds of concurrent streams on one core still leave on time. Deadlines are absolute
(start + k * interval), so a late emission never delays the ones after it; emissions already
due together are written together. Times are time.monotonic(): asyncio's loop.time() is the
same clock, but uvloop's is truncated to whole milliseconds.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import itertools
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from llmload.sim.wire import http_chunk


@dataclass(frozen=True, slots=True)
class Schedule:
    """Emission k carries `payload(k)` at `deadline(k)` (time.monotonic seconds)."""

    start: float
    interval: float
    count: int
    payload: Callable[[int], bytes]
    pause_at: int = -1
    """From this emission on, every deadline is `pause_s` later (a stall)."""
    pause_s: float = 0.0
    abort_after: bool = False
    """Drop the connection abruptly after the last emission (no chunked terminator)."""

    def deadline(self, k: int) -> float:
        pause = self.pause_s if 0 <= self.pause_at <= k else 0.0
        return self.start + k * self.interval + pause

    def all_due(self, now: float) -> bool:
        """Nothing to wait for: the whole body can go out in one write."""
        return not self.abort_after and self.deadline(self.count - 1) <= now

    def body(self) -> bytes:
        return b"".join(self.payload(k) for k in range(self.count))


class LagStats:
    """Emission lag (actual minus scheduled write time) in 10 µs bins: constant memory for any run."""

    BINS_PER_S = 100_000
    BINS = 100_000  # up to 1 s; anything later lands in the last bin (max stays exact)

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._bins = [0] * self.BINS
        self.count = 0
        self._sum = 0.0
        self.max = 0.0

    def record(self, lag_s: float) -> None:
        self._bins[min(int(lag_s * self.BINS_PER_S), self.BINS - 1)] += 1
        self.count += 1
        self._sum += lag_s
        self.max = max(self.max, lag_s)

    def percentiles_ms(self, *qs: float) -> list[float]:
        """Each q-th percentile (0..100), to the middle of its 10 µs bin.

        Sums bins only up to the highest percentile's: lags are mostly tiny, so a scrape during a
        run stays short instead of stalling every stream for the 100,000-bin sum (~5 ms)."""
        ranks = [q / 100.0 * (self.count - 1) for q in qs]
        top = max(ranks)
        cumulative = list(itertools.takewhile(lambda c: c <= top, itertools.accumulate(self._bins)))
        return [(bisect.bisect_right(cumulative, r) + 0.5) * 1000.0 / self.BINS_PER_S for r in ranks]

    def snapshot(self) -> dict[str, float | int | None]:
        if not self.count:
            return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None, "max": None}
        p50, p90, p99 = self.percentiles_ms(50, 90, 99)
        mean, top = self._sum / self.count * 1000.0, self.max * 1000.0
        return {"count": self.count, "mean": mean, "p50": p50, "p90": p90, "p99": p99, "max": top}


class _Paced(Protocol):
    def first_deadline(self) -> float: ...

    def emit(self, now: float) -> float | None:
        """Do what is due by `now`; the next deadline, or None once finished."""


class _Stream:
    """One response's emissions, written as HTTP chunks straight to the transport."""

    __slots__ = ("_done", "_next", "_schedule", "_stats", "_transport")

    def __init__(
        self, transport: asyncio.Transport, schedule: Schedule, stats: LagStats, done: asyncio.Future[None]
    ) -> None:
        self._transport = transport
        self._schedule = schedule
        self._stats = stats
        self._done = done
        self._next = 0

    def first_deadline(self) -> float:
        return self._schedule.deadline(0)

    def emit(self, now: float) -> float | None:
        transport = self._transport
        if self._done.done() or transport.is_closing():  # handler cancelled, or the client went away
            self._finish()
            return None
        schedule = self._schedule
        k = self._next
        deadline = schedule.deadline(k)
        parts = []
        while deadline <= now:
            parts.append(schedule.payload(k))
            self._stats.record(now - deadline)
            k += 1
            if k == schedule.count:
                break
            deadline = schedule.deadline(k)
        data = b"".join(parts)
        if data:
            transport.write(http_chunk(data))
        self._next = k
        if k < schedule.count:
            return deadline
        if schedule.abort_after:
            transport.abort()
        self._finish()
        return None

    def _finish(self) -> None:
        if not self._done.done():
            self._done.set_result(None)


class _Wakeup:
    """Resolves a future at its deadline (a non-streaming response's moment, an engine step's end)."""

    __slots__ = ("_deadline", "_done", "_stats")

    def __init__(self, deadline: float, stats: LagStats | None, done: asyncio.Future[None]) -> None:
        self._deadline = deadline
        self._stats = stats
        self._done = done

    def first_deadline(self) -> float:
        return self._deadline

    def emit(self, now: float) -> None:
        if not self._done.done():
            if self._stats is not None:
                self._stats.record(now - self._deadline)
            self._done.set_result(None)


class Pacer:
    """Runs every stream's emissions from one heap of deadlines, and records their lag.

    Event loops time out in whole milliseconds (epoll, libuv; uvloop also rounds the delay), so
    a timer per token would leave up to ~1.5 ms early or late. Instead a helper thread sleeps on
    the kernel's microsecond timers and wakes the loop PREWAKE_S before the next deadline (a
    wake-up takes 0.1-0.3 ms), and the loop sleeps out the rest: emissions leave tens of
    microseconds late, without spinning a core. Under load the deadlines are closer together
    than PREWAKE_S and the heap is simply served on every loop iteration.
    """

    PREWAKE_S = 3e-4

    def __init__(self, loop: asyncio.AbstractEventLoop, stats: LagStats) -> None:
        self.stats = stats
        self._loop = loop
        self._heap: list[tuple[float, int, _Paced]] = []
        self._seq = itertools.count()
        self._tick_queued = False
        self._alarm = _Alarm(loop, self._tick)

    async def stream(self, transport: asyncio.Transport, schedule: Schedule) -> None:
        """Write `schedule` to `transport`, returning when its last emission has left."""
        done = self._loop.create_future()
        self._add(_Stream(transport, schedule, self.stats, done))
        await done  # if cancelled, so is `done`, and the stream stops at its next deadline

    async def sleep_until(self, deadline: float, *, record: bool = True) -> None:
        """Wake at `deadline`; `record=False` when what follows records its own lag (engine steps)."""
        done = self._loop.create_future()
        self._add(_Wakeup(deadline, self.stats if record else None, done))
        await done

    def run_due(self) -> None:
        """Emit what is due now. Handlers call this between their steps: a burst of arriving
        requests is handled in one loop iteration, which would otherwise hold every due chunk
        back until the whole burst is parsed (milliseconds)."""
        if self._heap and self._heap[0][0] <= time.monotonic():
            self._tick()

    def close(self) -> None:
        self._alarm.close()

    def _add(self, item: _Paced) -> None:
        deadline = item.first_deadline()
        heapq.heappush(self._heap, (deadline, next(self._seq), item))
        if self._heap[0][2] is item:
            self._wake_for(deadline)

    def _tick(self) -> None:
        self._tick_queued = False
        heap = self._heap
        now = time.monotonic()
        while heap and heap[0][0] <= now:
            item = heapq.heappop(heap)[2]
            deadline = item.emit(now)
            if deadline is not None:
                heapq.heappush(heap, (deadline, next(self._seq), item))
        if heap:
            self._wake_for(heap[0][0])

    def _wake_for(self, deadline: float) -> None:
        gap = deadline - time.monotonic()
        if gap > self.PREWAKE_S:
            self._alarm.set(deadline - self.PREWAKE_S)
        elif not self._tick_queued:
            if gap > 0:
                time.sleep(gap)  # blocks the loop for at most PREWAKE_S; I/O is served right after
            self._tick_queued = True
            self._loop.call_soon(self._tick)


class _Alarm:
    """A daemon thread that calls `callback` on the loop at (or just after) the earliest time set."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._cond = threading.Condition()
        self._at = math.inf
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="llmload-sim-pacer", daemon=True)
        self._thread.start()

    def set(self, at: float) -> None:
        with self._cond:
            if at < self._at:
                self._at = at
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (wait := self._at - time.monotonic()) > 0:
                    self._cond.wait(None if wait == math.inf else wait)
                if self._closed:
                    return
                self._at = math.inf
            self._loop.call_soon_threadsafe(self._callback)
