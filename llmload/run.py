"""The replay engine, free of Locust: who sends which session when, and what each request became.

A `Dispatcher` holds this process's share of the planned session arrivals; whichever user is
free claims the next one and sleeps until its time, so arrivals keep their planned times however
slow the target is. When no user is free an arrival waits, and that wait is recorded as schedule
delay (coordinated omission made visible). A `SessionReplayer` plays one session turn by turn,
sending the accumulated history plus the new turn, and turns every request into a record.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gevent
import numpy as np
import psutil

from llmload.client import ChatClient, StreamResult, chat_body
from llmload.failures import HEALTH_PROBED, refine_with_health
from llmload.models import Message, RequestRecord, Session
from llmload.schedule import ArrivalSchedule, stage_at
from llmload.workload.tokens import Tokenizer

RecordSink = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class RunClock:
    """One origin for the whole run: perf_counter for intervals, unix seconds in records."""

    start_perf: float
    start_wall: float

    @classmethod
    def now(cls) -> RunClock:
        return cls(time.perf_counter(), time.time())

    def wall(self, perf: float) -> float:
        return self.start_wall + (perf - self.start_perf)

    def offset(self, perf: float) -> float:
        return perf - self.start_perf


class StealMeter:
    """CPU time the hypervisor gave to other guests ("steal") since creation, in % of all CPU time.

    On a VM, a vCPU descheduled for a few ms delays client and target alike: latency tails that
    neither caused. Runs record it so the report can say so; 0 on bare metal and non-Linux.
    """

    def __init__(self) -> None:
        self._start = psutil.cpu_times()

    @property
    def percent(self) -> float:
        now = psutil.cpu_times()
        total = sum(now) - sum(self._start)
        steal = getattr(now, "steal", 0.0) - getattr(self._start, "steal", 0.0)
        return 100.0 * steal / total if total > 0 else 0.0


@dataclass(frozen=True)
class Arrival:
    seq: int
    at: float  # perf_counter seconds
    session: Session

    @property
    def session_id(self) -> str:
        return self.session.id


class Dispatcher:
    """This process's session arrivals, handed out in order to whichever user is free."""

    def __init__(
        self,
        schedule: ArrivalSchedule,
        sessions: Sequence[Session],
        clock: RunClock,
        *,
        run_id: str,
        worker_index: int = 0,
        worker_count: int = 1,
        drain_s: float = 30.0,
    ) -> None:
        self.clock = clock
        self.run_id = run_id
        self.stages = schedule.stages
        self._sessions = sessions
        self._index = worker_index
        self._count = worker_count
        offsets = np.fromiter(schedule.share(worker_index, worker_count), dtype=float)
        self._times = clock.start_perf + offsets
        self._next = 0
        self.plan_end = clock.start_perf + schedule.end_s
        self.deadline = self.plan_end + drain_s
        self.busy = 0
        self.users = 0

    @property
    def planned(self) -> int:
        return len(self._times)

    def _arrival(self, j: int) -> Arrival:
        seq = self._index + j * self._count
        session = self._sessions[seq % len(self._sessions)]
        if seq >= len(self._sessions):  # the workload is cycled: keep session ids unique
            session = session.model_copy(update={"id": f"{session.id}~{seq // len(self._sessions)}"})
        return Arrival(seq, float(self._times[j]), session)

    def claim(self) -> Arrival | None:
        """The next arrival, or None when the plan has no more (never yields to other greenlets)."""
        if self._next >= len(self._times):
            return None
        arrival = self._arrival(self._next)
        self._next += 1
        return arrival

    def backlog(self, now: float) -> int:
        """Arrivals already due that no user has claimed: the sign of too few users."""
        return max(0, int(np.searchsorted(self._times, now, side="right")) - self._next)

    def expire(self, now: float) -> list[Arrival]:
        """Give up the arrivals due by `now` that were never claimed; they become `not_sent`."""
        due = int(np.searchsorted(self._times, min(now, self.plan_end), side="right"))
        expired = [self._arrival(j) for j in range(self._next, due)]
        self._next = max(self._next, due)
        if now >= self.plan_end:
            self._next = len(self._times)
        return expired

    @property
    def done(self) -> bool:
        """Plan over and nothing in flight: every record of this process is written."""
        return self._next >= len(self._times) and self.busy == 0

    def record(self, arrival: Arrival, turn: int, scheduled: float, result: StreamResult | None) -> RequestRecord:
        """The record of one scheduled request; `not_sent` when it never left."""
        clock = self.clock
        record = RequestRecord(
            run_id=self.run_id,
            worker=self._index,
            stage=stage_at(self.stages, clock.offset(scheduled)).name,
            session_id=arrival.session_id,
            turn=turn,
            scheduled_at=clock.wall(scheduled),
            status="not_sent",
        )
        if result is None:
            return record
        first, times = result.first_token_at, result.token_times
        output_tokens = result.completion_tokens if result.completion_tokens is not None else len(times)
        tpot = None
        if first is not None and output_tokens > 1:
            tpot = (times[-1] - first) * 1000 / (output_tokens - 1)
        return record.model_copy(
            update={
                "sent_at": clock.wall(result.sent_at),
                "first_token_at": clock.wall(first) if first is not None else None,
                "finished_at": clock.wall(result.finished_at),
                "schedule_delay_ms": max(0.0, (result.sent_at - scheduled) * 1000),
                "ttft_ms": (first - result.sent_at) * 1000 if first is not None else None,
                "e2e_ms": (result.finished_at - result.sent_at) * 1000,
                "tpot_ms": tpot,
                "itl_ms": np.round(np.diff(times) * 1000, 3).tolist() if len(times) > 1 else [],
                "prompt_tokens": result.prompt_tokens,
                "output_tokens": output_tokens,
                "cached_tokens": result.cached_tokens,
                "usage_from_server": result.completion_tokens is not None,
                "status": "ok" if result.ok else "failed",
                "error_category": result.error_category,
                "http_status": result.http_status,
                "error_message": result.error_message,
            }
        )


def flatten_history(history: Sequence[list[Message]], keep_turns: int | None) -> list[Message]:
    kept = history[-keep_turns:] if keep_turns else history
    return [m for turn in kept for m in turn]


class SessionReplayer:
    """Plays sessions for one user: one request at a time, history carried from turn to turn."""

    def __init__(
        self,
        client: ChatClient,
        dispatcher: Dispatcher,
        sink: RecordSink,
        *,
        model: str,
        tokenizer: Tokenizer,
        history_turns: int | None = None,
    ) -> None:
        self.client = client
        self.dispatcher = dispatcher
        self.sink = sink
        self.model = model
        self.tokenizer = tokenizer
        self.history_turns = history_turns

    def _with_health(self, record: RequestRecord) -> RequestRecord:
        """Ask /health what a transport-level failure was: a dead engine, a server gone, or neither."""
        assert record.error_category is not None and record.error_message is not None
        health = self.client.probe_health()
        category, message = refine_with_health(record.error_category, record.error_message, health)
        return record.model_copy(update={"error_category": category, "error_message": message, "server_health": health})

    def _wait_until(self, arrival: Arrival, turn: int, scheduled: float) -> None:
        """Sleep until a request's time; stopped while waiting for a due request, record it not_sent."""
        try:
            gevent.sleep(max(0.0, scheduled - time.perf_counter()))
        except gevent.GreenletExit:
            if scheduled <= time.perf_counter():
                self.sink(self.dispatcher.record(arrival, turn, scheduled, None))
            raise

    def replay(self, arrival: Arrival) -> None:
        """Play the session; a failed turn ends it (its history is broken), as a user would give up."""
        self._wait_until(arrival, 0, arrival.at)
        history: list[list[Message]] = []
        scheduled = arrival.at
        self.dispatcher.busy += 1
        try:
            for index, turn in enumerate(arrival.session.turns):
                if index > 0:
                    scheduled = time.perf_counter() + turn.think_time_s
                    if scheduled > self.dispatcher.plan_end:
                        return  # the plan ends before this turn would be sent: never scheduled
                    self._wait_until(arrival, index, scheduled)
                messages = [*flatten_history(history, self.history_turns), *turn.messages]
                body = chat_body(self.model, messages, max_tokens=turn.max_tokens, output_tokens=turn.output_tokens)
                result = self.client.stream_chat(body, deadline=self.dispatcher.deadline)
                if result.prompt_tokens is None and result.ok:
                    result.prompt_tokens = sum(self.tokenizer.count(m.content) for m in messages)
                record = self.dispatcher.record(arrival, index, scheduled, result)
                if record.error_category in HEALTH_PROBED and not result.stopped:
                    record = self._with_health(record)
                self.sink(record)
                if result.stopped:
                    raise gevent.GreenletExit
                if not result.ok:
                    return
                history.append([*turn.messages, Message(role="assistant", content=result.text)])
        finally:
            self.dispatcher.busy -= 1
