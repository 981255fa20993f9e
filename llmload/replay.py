"""The replay engine, free of Locust: which request goes out when, for which session, and what it became.

The plan's arrivals are *requests*. In the rate modes (poisson, constant, gamma) a
`RequestDispatcher` hands each arrival, when it falls due, to the session whose next turn has
waited longest past its think time, or opens a new session when none is due. So every stage
offers exactly its request rate, all turns counted, from its first second, whatever the sessions'
lengths and think times: think time becomes a minimum, and sessions carry across stages. In trace
mode a `TraceDispatcher` plays the trace's own sessions at their recorded times; a turn that is
due before its previous reply came back waits, and the wait is schedule delay.

Users are request slots: a free user claims the next arrival in order and sleeps until its time.
When no user is free an arrival waits, and that wait is recorded as schedule delay (coordinated
omission made visible). `TurnSender` sends one turn of a session, with the history the server
really answered, and turns it into a record.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import gevent
import gevent.event
import numpy as np

from llmload import drain
from llmload.cancel import CancelPlan
from llmload.client import ChatClient, StreamResult
from llmload.failures import HEALTH_PROBED
from llmload.model_mix import ModelMix
from llmload.models import (
    REPLAY_SEPARATOR,
    Message,
    RequestRecord,
    Session,
    SessionLinks,
    Stage,
    Turn,
    conversations,
)
from llmload.recordlog import request_record, with_health
from llmload.replicas import Replicas
from llmload.schedule import ArrivalPlan, ArrivalSchedule, RunClock, SlotShare, TraceClock, slots_held, stage_at
from llmload.server.request import RequestShape
from llmload.workload.blocks import BlockText
from llmload.workload.cache_bust import marked, play_marker
from llmload.workload.tokens import Tokenizer

RecordSink = Callable[[RequestRecord], None]
SessionStop = Literal["failure", "plan end", "not spawned"]


@dataclass(eq=False)
class LiveSession:
    """A session being replayed: its next turn, the history the server answered, when it may go on."""

    session: Session
    trace_start: float | None = None  # trace mode: the session's first turn on the trace's clock
    key: int = -1  # trace mode: its place in the plan (llmload.schedule.ArrivalPlan.keys)
    next_turn: int = 0
    history: list[list[Message]] = field(default_factory=list)
    ready_at: float = 0.0  # perf_counter seconds: previous reply + think time
    stopped_by: SessionStop | None = None  # trace mode: why it ended before its last turn

    @property
    def finished(self) -> bool:
        return self.next_turn >= len(self.session.turns)


@dataclass(frozen=True)
class Arrival:
    """One planned request of this process (rate modes), or one planned session start (trace mode)."""

    seq: int | None  # its position in the fleet's ArrivalPlan (None: a closed loop plans none)
    at: float  # perf_counter seconds
    session: LiveSession | None = None  # trace mode: the session that starts here


@dataclass(frozen=True)
class InFlight:
    """A request on the wire: what a distributed run's master records as `lost` if its worker dies."""

    seq: int | None  # the arrival's plan position; None for a trace session's follow-up turn
    scheduled: float  # perf_counter seconds
    sent: float
    session_id: str
    turn: int


def _session_copy(sessions: Sequence[Session], index: int, bust_run: str | None = None) -> Session:
    """The workload's `index`-th session, cycling the workload with unique ids; with `bust_run` (the
    run's id, --cache-bust) its first message opens with its play's marker."""
    session = sessions[index % len(sessions)]
    play = index // len(sessions)
    if play:
        session = session.model_copy(update={"id": f"{session.id}{REPLAY_SEPARATOR}{play}"})
    return marked(session, play_marker(bust_run, play)) if bust_run is not None else session


@dataclass(frozen=True)
class WorkerShare:
    """This process's share of a run: worker `index` of `count` takes the run's arrivals index,
    index + count, ...; in-flight requests get `drain_s` after the plan's end."""

    run_id: str
    index: int = 0
    count: int = 1
    drain_s: float = drain.DEFAULT_CAP_S
    cache_bust: bool = False  # every play of a session opens with its own marker (llmload.workload.cache_bust)


class Dispatcher:
    """This process's planned arrivals, handed out in order to whichever user is free."""

    def __init__(self, stages: Sequence[Stage], plan: ArrivalPlan, clock: RunClock, share: WorkerShare) -> None:
        self.clock = clock
        self.run_id = share.run_id
        self.bust_run = share.run_id if share.cache_bust else None
        self.stages = list(stages)
        self.plan = plan
        self._index = share.index
        self._count = share.count
        self._positions = plan.owned(share.index, share.count)
        self._times = clock.start_perf + plan.offsets[self._positions]
        self._next = 0
        self.plan_end = clock.start_perf + self.stages[-1].end_s
        self.deadline = self.plan_end + share.drain_s
        self.busy = 0
        self.sends: list[float] = []  # when requests left (run offsets), until the live figures take them
        self.sent_total = 0  # requests sent, counted here: a distributed run's master checks its records by it
        self.in_flight: dict[int, InFlight] = {}
        self.on_the_wire: dict[int, gevent.Greenlet] = {}  # flights whose stream is open, by their user
        self.longest_answer_s = 0.0  # the drain waits on requests younger than a multiple of it,
        self.last_answer_at = 0.0  # and while the last answer came back less than that long ago
        self.answers = 0  # (every request waited for until llmload.drain.MIN_ANSWERS came back)
        self._flight_ids = itertools.count()

    def adopt(self, positions: Sequence[int], slots: Sequence[SlotShare] = ()) -> None:
        """Take over arrivals of the plan (a lost worker's, from the master): merged, in time order,
        among the ones not yet claimed. `slots`: a closed loop's (ConversationDispatcher), which plans none."""
        pending = np.concatenate([self._positions[self._next :], np.asarray(positions, dtype=np.int64)])
        pending.sort()  # the plan's positions are in time order
        self._positions = np.concatenate([self._positions[: self._next], pending])
        self._times = self.clock.start_perf + self.plan.offsets[self._positions]

    def take_off(self, seq: int | None, scheduled: float, session_id: str, turn: int) -> int:
        """A request leaves: counted, and held in flight until `land`."""
        now = time.perf_counter()
        self.sends.append(self.clock.offset(now))
        self.sent_total += 1
        flight = next(self._flight_ids)
        self.in_flight[flight] = InFlight(seq, scheduled, now, session_id, turn)
        return flight

    def land(self, flight: int, answer_s: float | None = None) -> None:
        """A request's record is handed on; `answer_s`: how long the server took to answer it, when it did."""
        self.in_flight.pop(flight, None)
        if answer_s is not None:
            self.longest_answer_s = max(self.longest_answer_s, answer_s)
            self.last_answer_at = time.perf_counter()
            self.answers += 1

    def end_drain(self, now: float) -> int:
        """After the plan's end, give up on the requests on the wire once none may still finish
        (llmload.drain: all older than a multiple of the longest answer seen, and no answer for as long);
        how many were cut."""
        if now < self.plan_end or not self.on_the_wire:
            return 0
        ages = [now - self.in_flight[f].sent for f in self.on_the_wire if f in self.in_flight]
        if drain.waiting_on(np.asarray(ages), self.answers, self.longest_answer_s, now - self.last_answer_at):
            return 0
        users = list(self.on_the_wire.values())
        for user in users:
            user.kill(drain.DrainOver, block=False)
        return len(users)

    def take_sends(self) -> tuple[list[float], float]:
        """The sends noted since the last call, and the run offset up to which they are complete."""
        sends, self.sends = self.sends, []
        return sends, self.clock.offset(time.perf_counter())

    @property
    def planned(self) -> int:
        return len(self._times)

    def _arrival(self, j: int) -> Arrival:
        return Arrival(int(self._positions[j]), float(self._times[j]))

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

    def record(self, session_id: str, turn: int, scheduled: float, result: StreamResult | None) -> RequestRecord:
        """The record of one of this process's scheduled requests (recordlog.request_record)."""
        stage = stage_at(self.stages, self.clock.offset(scheduled)).name
        return request_record(
            run_id=self.run_id, worker=self._index, stage=stage, session_id=session_id, turn=turn,
            scheduled=scheduled, result=result, clock=self.clock,
        )  # fmt: skip


class RequestDispatcher(Dispatcher):
    """Rate modes: request arrivals at the stage rates; each goes to a due session or a new one."""

    def __init__(
        self,
        schedule: ArrivalSchedule,
        sessions: Sequence[Session],
        clock: RunClock,
        share: WorkerShare,
        first_session: int = 0,
    ) -> None:
        super().__init__(schedule.stages, ArrivalPlan.of(schedule, sessions), clock, share)
        self._sessions = sessions
        self._first = first_session
        self._opened = 0
        self._ready: list[tuple[float, int, LiveSession]] = []  # heap by ready_at, then order
        self._order = itertools.count()

    def session_for(self, now: float) -> LiveSession:
        """The session whose next turn has been due longest, else a new one (ids unique across workers)."""
        if self._ready and self._ready[0][0] <= now:
            return heapq.heappop(self._ready)[2]
        index = self._first + self._index + self._opened * self._count
        self._opened += 1
        return LiveSession(_session_copy(self._sessions, index, self.bust_run))

    def release(self, live: LiveSession, ok: bool) -> None:
        """A turn is back: the session waits out its next think time, or ends (done, or broken by a failure)."""
        if ok and not live.finished:
            live.ready_at = time.perf_counter() + live.session.turns[live.next_turn].think_time_s
            heapq.heappush(self._ready, (live.ready_at, next(self._order), live))

    @property
    def waiting_sessions(self) -> int:
        return len(self._ready)


class TraceDispatcher(Dispatcher):
    """Trace mode: the trace's sessions at their recorded offsets, played at each stage's speed.

    Worker k of N plays conversations k, k + N, ... (a subagent beside the agent that spawned it, as
    the agent's turn that joins it waits for it to end); the trace repeats (ids made unique) when the
    plan is longer than it, shifted by its span plus one mean gap between session starts.
    """

    def __init__(
        self,
        trace: TraceClock,
        sessions: Sequence[Session],
        clock: RunClock,
        share: WorkerShare,
        plan: ArrivalPlan | None = None,
    ) -> None:
        self.trace = trace
        self._sessions = sessions
        links = SessionLinks.of(sessions)
        self._index_of, self._spawner_of = links.by_id, links.spawner
        super().__init__(trace.stages, plan or ArrivalPlan.of(trace, sessions, links), clock, share)
        self._owned = set(self.plan.keys[self._positions].tolist())
        self._ended: dict[int, gevent.event.Event] = {}
        self._spawned: dict[int, gevent.event.AsyncResult] = {}  # a subagent's: when the reply that spawns it came

    def adopt(self, positions: Sequence[int], slots: Sequence[SlotShare] = ()) -> None:
        super().adopt(positions)
        self._owned.update(self.plan.keys[np.asarray(positions, dtype=np.int64)].tolist())

    def _arrival(self, j: int) -> Arrival:
        position = int(self._positions[j])
        assert self.plan.trace_starts is not None
        index, start = int(self.plan.keys[position]), float(self.plan.trace_starts[position])
        live = LiveSession(_session_copy(self._sessions, index, self.bust_run), trace_start=start, key=index)
        return Arrival(position, float(self._times[j]), live)

    def expire(self, now: float) -> list[Arrival]:
        expired = super().expire(now)
        for arrival in expired:
            if arrival.session is not None:
                self.end(arrival.session)
        return expired

    def end(self, live: LiveSession) -> None:
        """The session is over (done, failed, cut, or never sent): a turn that joins it goes on, and a
        subagent it had yet to spawn never starts."""
        self._ended.setdefault(live.key, gevent.event.Event()).set()
        for turn in live.session.turns:
            self.spawn(live, turn.spawns, None)

    def _key(self, live: LiveSession, name: str) -> int | None:
        """The plan key of session `name` in `live`'s play, when this worker plays it."""
        play = live.key // len(self._sessions) * len(self._sessions)
        key = play + self._index_of.get(name, -len(self._sessions) - 1)
        return key if key in self._owned else None

    def spawn(self, live: LiveSession, subagents: Sequence[str], back: float | None) -> None:
        """The reply that spawns `subagents` came back at `back` (perf seconds); None: it never will."""
        for name in subagents:
            key = self._key(live, name)
            if key is not None and not (result := self._spawned.setdefault(key, gevent.event.AsyncResult())).ready():
                result.set(back)

    def start(self, live: LiveSession, at: float) -> float | None:
        """When a session's first turn is due: at its arrival, or, for a subagent, its first think time after
        the reply that spawns it if that is later (its agent runs ahead of, or behind, the recorded clock);
        None when that reply never comes in the plan."""
        spawner = self._spawner_of.get(live.key % len(self._sessions))
        if spawner is None or self._key(live, self._sessions[spawner].id) is None:
            return at
        result = self._spawned.setdefault(live.key, gevent.event.AsyncResult())
        result.wait(self.plan_end - time.perf_counter())
        back = result.value if result.ready() else None
        if back is None:
            return None
        think = live.session.turns[0].think_time_s / self.trace.speed_at(self.clock.offset(back))
        return max(at, back + think)

    def join(self, live: LiveSession, subagents: Sequence[str]) -> float | None:
        """Wait until the subagents this turn joins have ended (those this worker plays: each of this
        play's; not one outside the plan, or a lost worker's resplit to another); when they did, or None
        when the plan ended first."""
        for name in subagents:
            key = self._key(live, name)
            if key is not None and not self._ended.setdefault(key, gevent.event.Event()).wait(
                self.plan_end - time.perf_counter()
            ):
                return None
        return time.perf_counter()

    def due(self, live: LiveSession, reply_at: float) -> float:
        """When a follow-up turn is due: at its recorded time when the source has one, else its
        think time after the reply (at the stage's speed)."""
        turn = live.session.turns[live.next_turn]
        if turn.at_s is not None and live.trace_start is not None:
            return self.clock.start_perf + self.trace.run_time(live.trace_start + turn.at_s)
        return reply_at + turn.think_time_s / self.trace.speed_at(self.clock.offset(reply_at))


class ConversationDispatcher(TraceDispatcher):
    """--sessions-in-flight: a closed loop over the trace's conversations (an agent and its subagents).

    Worker k of N keeps its share of each stage's conversations in flight (slots k, k + N, ..., and a share
    of a lost worker's, as the master deals them: `schedule.split_shares`). When a conversation's last
    session ends, the user that ended it opens the next one, in the trace's order and cycling with ids
    made unique; its sessions are played as in trace mode from its opening (a subagent at its spawn, a
    join waiting for it), on the trace's clock at the recorded speed. A conversation the plan's end cut
    holds its slot (no burst of first turns before the end), and one that failed frees it a second later
    (a dead server gets N conversations a second, not a tight loop).
    """

    FAILED_SLOT_REST_S = 1.0

    def __init__(self, trace: TraceClock, sessions: Sequence[Session], clock: RunClock, share: WorkerShare) -> None:
        super().__init__(trace, sessions, clock, share, ArrivalPlan.none())
        self._shares: list[SlotShare] = [(share.index, 0, 1)]  # and a lost worker's, dealt by the master
        numbers = conversations(sessions, self._index_of)
        self._members = [  # each conversation's sessions, its agent (no parent in the workload) first
            sorted(np.flatnonzero(numbers == c).tolist(), key=lambda i: sessions[i].parent in self._index_of)
            for c in range(int(numbers.max(initial=-1)) + 1)
        ]
        self._opened = 0
        self._open = 0  # conversations of this worker in flight
        self._left: dict[int, int] = {}  # sessions still running, by conversation (its number in the loop)
        self._conversation_of: dict[int, int] = {}  # a session's key → its conversation
        self._stopped_by: dict[int, set[SessionStop | None]] = {}  # how each open conversation's sessions ended
        self._resting: list[float] = []  # when the slots of failed conversations free up (perf seconds)
        self._waiting: list[Arrival] = []  # opened conversations' subagents no user has claimed

    def _slots(self, now: float) -> int:
        """How many conversations this worker keeps in flight now: its share of the stage's."""
        total = stage_at(self.stages, self.clock.offset(now)).sessions or 0
        return slots_held(total, self._count, self._shares)

    def adopt(self, positions: Sequence[int], slots: Sequence[SlotShare] = ()) -> None:
        """A lost worker's conversation slots, kept from now on too (a closed loop plans no arrival)."""
        self._shares += slots

    def claim(self) -> Arrival | None:
        now = time.perf_counter()
        if now >= self.plan_end:
            return None
        if self._waiting:
            return self._waiting.pop(0)
        self._resting = [t for t in self._resting if t > now]
        if self._open + len(self._resting) >= self._slots(now):
            return None
        number = self._index + self._count * self._opened
        self._opened += 1
        self._open += 1
        play, members = divmod(number, len(self._members))[0], self._members[number % len(self._members)]
        opened = self.trace.trace_time(self.clock.offset(now))
        first = self._sessions[members[0]].offset_s or 0.0
        arrivals = []
        for index in members:
            key = play * len(self._sessions) + index
            start = opened + (self._sessions[index].offset_s or 0.0) - first
            live = LiveSession(_session_copy(self._sessions, key, self.bust_run), trace_start=start, key=key)
            at = self.clock.start_perf + self.trace.run_time(start)
            arrivals.append(Arrival(None, max(now, at), live))
            self._owned.add(key)
            self._conversation_of[key] = number
        self._left[number] = len(members)
        self._waiting += arrivals[1:]
        return arrivals[0]

    def end(self, live: LiveSession) -> None:
        super().end(live)
        number = self._conversation_of.pop(live.key, None)
        if number is None:
            return
        self._left[number] -= 1
        self._stopped_by.setdefault(number, set()).add(live.stopped_by)
        if self._left[number]:
            return
        del self._left[number]
        stops = self._stopped_by.pop(number)
        if "plan end" in stops:
            return  # its slot stays taken to the plan's end
        self._open -= 1
        if "failure" in stops:  # the slot rests before it frees
            self._resting.append(time.perf_counter() + self.FAILED_SLOT_REST_S)

    def backlog(self, now: float) -> int:
        """Subagents waiting for a user, and conversations the stage wants that are not yet open."""
        return len(self._waiting) + max(0, self._slots(now) - self._open) if now < self.plan_end else 0

    @property
    def done(self) -> bool:
        return time.perf_counter() >= self.plan_end and self.busy == 0


def flatten_history(history: Sequence[list[Message]], keep_turns: int | None) -> list[Message]:
    kept = history[-keep_turns:] if keep_turns else history
    return [m for turn in kept for m in turn]


class TurnSender:
    """Sends turns for one user, one request at a time, each with the session's real history."""

    def __init__(
        self,
        clients: Mapping[str, ChatClient],
        dispatcher: Dispatcher,
        sink: RecordSink,
        *,
        models: ModelMix,
        shape: RequestShape,
        tokenizer: Tokenizer,
        history_turns: int | None = None,
        session_header: str | None = None,
        cancel: CancelPlan | None = None,
        block_text: BlockText | None = None,
    ) -> None:
        """`clients`: one per replica, keyed by its URL (`Replicas.hosts`); `session_header`: the header that
        carries the session's id, for a router that keeps a session on one replica; `cancel`: the streams cut
        on purpose; `block_text`: the text of a workload whose turns are prefix blocks."""
        self.clients = clients
        self.replicas = Replicas(tuple(clients))
        self.session_header = session_header
        self.cancel = cancel
        self.block_text = block_text
        self.dispatcher = dispatcher
        self.sink = sink
        self.models = models
        self.shape = shape
        self.tokenizer = tokenizer
        self.history_turns = history_turns

    def play(self, arrival: Arrival) -> None:
        """Play one arrival: a request to a due session (rate modes) or a whole trace session."""
        if isinstance(self.dispatcher, RequestDispatcher):
            self._play_request(self.dispatcher, arrival)
        else:
            assert isinstance(self.dispatcher, TraceDispatcher)
            self._play_trace_session(self.dispatcher, arrival)

    def _play_request(self, dispatcher: RequestDispatcher, arrival: Arrival) -> None:
        self._wait_until("", 0, arrival.at)
        live = dispatcher.session_for(time.perf_counter())
        dispatcher.busy += 1
        try:
            result = self._send(live, arrival.at, arrival.seq)
            dispatcher.release(live, result.ok)
        finally:
            dispatcher.busy -= 1
        if result.stopped:
            raise gevent.GreenletExit

    def _play_trace_session(self, dispatcher: TraceDispatcher, arrival: Arrival) -> None:
        """Turn by turn at the recorded times, a turn that joins subagents once they ended; a failed turn
        ends the session (its history is broken)."""
        live = arrival.session
        assert live is not None
        busy = 0  # the user is busy from the session's first send (until then it only waits for its start)
        try:
            while not live.finished:
                turn = live.session.turns[live.next_turn]
                due = (
                    dispatcher.due(live, time.perf_counter()) if live.next_turn else dispatcher.start(live, arrival.at)
                )
                joined = dispatcher.join(live, turn.waits_for) if turn.waits_for else due
                if due is None:
                    live.stopped_by = "not spawned"  # the reply that spawns it never came
                    return
                if joined is None or due > dispatcher.plan_end:
                    live.stopped_by = "plan end"  # before this turn would be sent: never scheduled
                    return
                scheduled = max(due, joined)
                self._wait_until(live.session.id, live.next_turn, scheduled)
                dispatcher.busy += 1 - busy
                busy = 1
                result = self._send(live, scheduled, arrival.seq if live.next_turn == 0 else None)
                if result.stopped:
                    raise gevent.GreenletExit
                if not result.ok:
                    live.stopped_by = "failure"
                    return
                dispatcher.spawn(live, turn.spawns, time.perf_counter())
        finally:
            dispatcher.busy -= busy
            dispatcher.end(live)

    def _wait_until(self, session_id: str, turn: int, scheduled: float) -> None:
        """Sleep until a request's time; stopped while waiting for a due request, record it not_sent."""
        try:
            gevent.sleep(max(0.0, scheduled - time.perf_counter()))
        except gevent.GreenletExit:
            if scheduled <= time.perf_counter():
                self.sink(self.dispatcher.record(session_id, turn, scheduled, None))
            raise

    def _send(self, live: LiveSession, scheduled: float, seq: int | None) -> StreamResult:
        """One turn: history + the turn's messages, streamed and recorded; the reply joins the history.
        Refused for a field llmload added, it is sent once more without it (timed from its schedule:
        the first try shows as schedule delay). In flight from its send until its record is handed on."""
        index = live.next_turn
        turn = live.session.turns[index]
        new = self._prompt(turn)
        messages = new if turn.blocks is not None else [*flatten_history(live.history, self.history_turns), *new]
        flight = self.dispatcher.take_off(seq, scheduled, live.session.id, index)
        model = turn.model or self.models.for_turn(live.session.id, turn.model_rank)
        host = self.replicas.for_session(live.session.id)
        client = self.clients[host]
        headers = {self.session_header: live.session.id} if self.session_header else None
        cut = self.cancel.cut_for(live.session.id, index) if self.cancel is not None else None
        while True:
            forced = turn.output_tokens is not None and self.shape.forces_length
            body = self.shape.body(model, messages, max_tokens=turn.max_tokens, output_tokens=turn.output_tokens)
            self.dispatcher.on_the_wire[flight] = gevent.getcurrent()
            try:
                result = client.stream_chat(body, deadline=self.dispatcher.deadline, headers=headers, cut=cut)
            finally:
                self.dispatcher.on_the_wire.pop(flight, None)
            if (
                result.ok
                or result.stopped
                or not self.shape.refused(result.http_status, result.error_message or "", body)
            ):
                break
        if result.prompt_tokens is None and result.ok:
            result.prompt_tokens = sum(self.tokenizer.count(m.content) for m in messages)
        record = self.dispatcher.record(live.session.id, index, scheduled, result).model_copy(
            update={
                "requested_output_tokens": turn.output_tokens,
                "output_tokens_forced": forced,
                "model": model,
                "host": host if len(self.clients) > 1 else None,
            }
        )
        if record.error_category in HEALTH_PROBED and not result.stopped:
            record = with_health(record, client.probe_health())
        self.sink(record)
        self.dispatcher.land(flight, result.finished_at - result.sent_at if result.ok else None)
        live.next_turn += 1
        if result.ok:
            live.history.append([*new, Message(role="assistant", content=result.text)])
        return result

    def _prompt(self, turn: Turn) -> list[Message]:
        """The messages a turn adds: its own, or its blocks' text (its whole prompt, history included)."""
        if self.block_text is not None:
            return self.block_text.messages(turn)
        if turn.blocks is not None:
            raise ValueError("a turn of blocks needs the workload's block text (BlockText.of its spec)")
        return turn.messages
