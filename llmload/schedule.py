"""Open-loop arrivals: the stages of a ramp and the request arrival times that fill them.

Arrivals are computed ahead from the plan, never from how fast the target answers, so a slow
target cannot slow the offered load (no coordinated omission). Each stage holds exactly its
target count of requests: the arrival process shapes the gaps inside a stage (Poisson, gamma
burstiness, constant), and the count is the stage rate times its length, so a stage judged at
150% was offered 150%. Every worker of a distributed run draws the same global sequence from the
same seed and keeps every N-th arrival, so the merged stream is exactly the planned one.

Trace replay (`trace`) plays recorded times instead: `TraceClock` maps a trace's own clock onto
the run's, each stage playing the trace at its percent of the recorded speed. With
`--sessions-in-flight N` a trace is a closed loop instead (`conversation_stages`): each stage keeps
its percent of N conversations in flight, at the recorded speed, and the rate is the server's answer.
"""

from __future__ import annotations

import argparse
import itertools
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from llmload.models import Session, SessionLinks, Stage, conversations

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|m|s|)\s*$")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "": 1.0}


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """`5m`, `300s`, `300`, `1.5h` → seconds."""
    match = _DURATION.match(text)
    if match is None or float(match.group(1)) < 0 or (float(match.group(1)) == 0 and not allow_zero):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 5m, 300s, 1h)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


ArrivalProcess = Literal["poisson", "constant", "gamma", "trace"]
ARRIVAL_PROCESSES: tuple[str, ...] = ArrivalProcess.__args__  # type: ignore[attr-defined]
DEFAULT_STAGE_PERCENTS: tuple[float, ...] = (25, 50, 100, 150)
DEFAULT_STAGES = ",".join(f"{percent:g}" for percent in DEFAULT_STAGE_PERCENTS)  # as --stages takes them
DEFAULT_STAGE_S = 60.0  # a stage's length: --stage-duration's default, and a soak's ramp stages'
WARMUP_STAGE = "warm-up"


def build_stages(
    target_qps: float,
    percents: Sequence[float] = DEFAULT_STAGE_PERCENTS,
    stage_duration_s: float = DEFAULT_STAGE_S,
    hold_duration_s: float | None = None,
    warmup_s: float = 0.0,
) -> list[Stage]:
    """Stages at `percents` of the target; the last one (the hold) may last longer. A warm-up,
    when asked for, runs first at the first stage's rate and is reported but never judged."""
    if target_qps <= 0:
        raise ValueError(f"target QPS must be > 0, got {target_qps}")
    if not percents or any(p <= 0 for p in percents):
        raise ValueError(f"stage percents must be positive, got {list(percents)}")
    if stage_duration_s <= 0 or (hold_duration_s is not None and hold_duration_s <= 0):
        raise ValueError("stage durations must be > 0")
    if warmup_s < 0:
        raise ValueError(f"--warmup must be ≥ 0, got {warmup_s:g}")
    stages: list[Stage] = []
    start = 0.0
    if warmup_s > 0:
        first = percents[0]
        stages.append(
            Stage(name=WARMUP_STAGE, percent=first, qps=target_qps * first / 100, start_s=0.0, duration_s=warmup_s,
                  warmup=True)
        )  # fmt: skip
        start = warmup_s
    for i, percent in enumerate(percents):
        last = i == len(percents) - 1
        duration = hold_duration_s if last and hold_duration_s is not None else stage_duration_s
        stages.append(
            Stage(name=f"{percent:g}%", percent=percent, qps=target_qps * percent / 100, start_s=start,
                  duration_s=duration)
        )  # fmt: skip
        start += duration
    return stages


def parse_stage_percents(text: str) -> tuple[float, ...]:
    """`"25,50,150"` or `"25%,50%"` → (25.0, 50.0, ...)."""
    try:
        return tuple(float(part.strip().rstrip("%")) for part in text.split(",") if part.strip())
    except ValueError:
        raise ValueError(f"--stages wants comma-separated percents like {DEFAULT_STAGES}; got {text!r}") from None


def stage_at(stages: Sequence[Stage], t_s: float) -> Stage:
    """The stage a time offset falls in (the last stage beyond the plan's end)."""
    for stage in stages:
        if t_s < stage.end_s:
            return stage
    return stages[-1]


def stage_counts(stages: Sequence[Stage]) -> list[int]:
    """Requests each stage holds: rate × length, rounded half up on the running total, so no rounding
    is lost across stages and none drifts (numpy's round-half-to-even made planned 2.5/5/10/15 hold
    2/6/10/14)."""
    totals = np.floor(np.cumsum([s.qps * s.duration_s for s in stages]) + 0.5 + 1e-9).astype(int)
    return np.diff(totals, prepend=0).tolist()


class ArrivalSchedule:
    """The global request arrival times of a staged, open-loop run, in seconds from its start.

    A stage of n requests draws n + 1 gaps from the arrival process and scales them to fill the
    stage: for Poisson this is exactly a Poisson process conditioned on its count (uniform order
    statistics); for gamma, the burstiness (shape, as in vLLM's bench: 1 = Poisson, < 1 burstier,
    > 1 smoother) shapes the gaps the same way. Constant arrivals sit half a gap in from each end.
    """

    def __init__(
        self, stages: Sequence[Stage], process: ArrivalProcess = "poisson", *, burstiness: float = 1.0, seed: int = 0
    ) -> None:
        if process not in ("poisson", "constant", "gamma"):
            raise ValueError(f"unknown arrival process {process!r}: poisson, constant or gamma")
        if burstiness <= 0:
            raise ValueError(f"burstiness must be > 0, got {burstiness}")
        self.stages = list(stages)
        self.process = process
        self.burstiness = burstiness
        self.seed = seed

    @property
    def end_s(self) -> float:
        return self.stages[-1].end_s

    def _stage_times(self, stage: Stage, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.process == "constant":
            fractions = (np.arange(n) + 0.5) / n
        else:
            shape = 1.0 if self.process == "poisson" else self.burstiness
            gaps = rng.gamma(shape, 1.0 / shape, n + 1)
            fractions = np.cumsum(gaps)[:-1] / gaps.sum()
        return stage.start_s + stage.duration_s * fractions

    def times(self) -> Iterator[float]:
        """All arrival offsets (s) inside the plan, in order."""
        rng = np.random.default_rng(self.seed)
        for stage, n in zip(self.stages, stage_counts(self.stages), strict=True):
            if n > 0:
                yield from self._stage_times(stage, n, rng).tolist()

    def share(self, index: int, count: int) -> Iterator[float]:
        """The arrivals worker `index` of `count` sends: every count-th of the global stream."""
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} outside 0..{count - 1}")
        return itertools.islice(self.times(), index, None, count)


class TraceClock:
    """Maps trace time (seconds on the trace's clock) to run time (seconds from the run's start).

    Each stage plays the trace at `percent / 100 × time_scale` of its recorded speed, so a 150%
    stage replays 1.5× as fast and `time_scale` 2 halves every gap; a stage that keeps a number of
    conversations in flight (`Stage.sessions`) plays it at `time_scale`, its percent being that number's.
    """

    def __init__(self, stages: Sequence[Stage], time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError(f"--time-scale must be > 0, got {time_scale:g}")
        self.stages = list(stages)
        self.speeds = [(1.0 if s.sessions is not None else s.percent / 100) * time_scale for s in self.stages]
        # trace time at the start of each stage, and at the end of the plan
        self.starts = np.concatenate(
            ([0.0], np.cumsum([s.duration_s * v for s, v in zip(stages, self.speeds, strict=True)]))
        )

    @property
    def trace_end(self) -> float:
        """How much trace time the whole plan plays."""
        return float(self.starts[-1])

    def run_time(self, trace_s: float) -> float:
        """Run offset of a trace time; beyond the plan it runs on at the last stage's speed."""
        k = min(int(np.searchsorted(self.starts, trace_s, side="right")) - 1, len(self.stages) - 1)
        k = max(k, 0)
        return float(self.stages[k].start_s + (trace_s - self.starts[k]) / self.speeds[k])

    def trace_time(self, run_s: float) -> float:
        """The trace time a run offset plays (inverse of `run_time`)."""
        k = self.stages.index(stage_at(self.stages, run_s))
        return float(self.starts[k] + (run_s - self.stages[k].start_s) * self.speeds[k])

    def speed_at(self, run_s: float) -> float:
        """Trace seconds per run second at a run offset."""
        return self.speeds[self.stages.index(stage_at(self.stages, run_s))]


def conversation_stages(stages: Sequence[Stage], sessions_in_flight: int) -> list[Stage]:
    """--sessions-in-flight: each stage keeps its percent of the conversations in flight (at least one),
    and asks for no rate (a closed loop: the rate is the server's answer)."""
    return [
        s.model_copy(update={"qps": 0.0, "sessions": max(1, round(sessions_in_flight * s.percent / 100))})
        for s in stages
    ]


SlotShare = tuple[int, int, int]
"""Conversation slots of a closed loop that one worker keeps: `(k, r, q)` names those of worker k's own
(slots k, k + N, k + 2N, ... of N workers) whose rank among them is r mod q. Worker k starts with
`(k, 0, 1)`; a lost worker's shares are split among the workers left (`split_shares`)."""


def slots_held(total: int, workers: int, shares: Sequence[SlotShare]) -> int:
    """How many of a stage's `total` conversations in flight `shares` keep, of `workers` workers' slots."""
    held = 0
    for k, r, q in shares:
        own = max(0, -(-(total - k) // workers))
        held += max(0, -(-(own - r) // q))
    return held


def split_shares(shares: Sequence[SlotShare], parts: int) -> list[list[SlotShare]]:
    """`shares` dealt `parts` ways, as the workers were dealt slots: part i takes every parts-th slot of
    each share from its i-th, so together the parts hold exactly what `shares` held, at every total."""
    return [[(k, r + q * i, q * parts) for k, r, q in shares] for i in range(parts)]


def expected_arrivals(stages: Sequence[Stage]) -> int:
    return sum(stage_counts(stages))


def session_span(session: Session) -> float:
    """From a session's first turn to its last on the trace's clock: the last turn's recorded time, else
    the think times (their replies' durations are the server's)."""
    last = session.turns[-1].at_s
    return last if last is not None else sum(turn.think_time_s for turn in session.turns)


def trace_period(sessions: Sequence[Session]) -> float:
    """How long one pass of a trace lasts before it repeats: its last start plus one mean gap, or until its
    last request when a session runs on past that (an agent's trace starts at 0 and runs for an hour)."""
    starts = [s.offset_s or 0.0 for s in sessions]
    first, last = min(starts), max(starts)
    gap = (last - first) / (len(starts) - 1) if len(starts) > 1 else 1.0
    end = max(start + session_span(session) for start, session in zip(starts, sessions, strict=True))
    return max(last + max(gap, 1e-3), end)


def trace_session_starts(trace: TraceClock, sessions: Sequence[Session]) -> list[tuple[float, int]]:
    """(trace time, global index) of every session start inside the plan, in order. The trace
    repeats when the plan is longer than it; index ≥ len(sessions) marks a repeat."""
    starts = [s.offset_s or 0.0 for s in sessions]
    period = trace_period(sessions)
    plan: list[tuple[float, int]] = []
    for cycle in itertools.count():
        if min(starts) + cycle * period >= trace.trace_end:
            break
        plan += [
            (start + cycle * period, cycle * len(sessions) + i)
            for i, start in enumerate(starts)
            if start + cycle * period < trace.trace_end
        ]
    return sorted(plan)


@dataclass(frozen=True)
class ArrivalPlan:
    """Every planned arrival of the run, the whole fleet's, in order: its run offset, and its key, the
    place in the global request sequence (rate modes) or the global index of the session it starts
    (trace mode). Worker k of N owns the keys that are k mod N; a lost worker's positions go to the
    others (llmload.fleet), named by their position in this plan."""

    offsets: np.ndarray  # run seconds, sorted
    keys: np.ndarray  # int64, one per arrival
    trace_starts: np.ndarray | None = None  # trace mode: each session's start on the trace's clock
    groups: np.ndarray | None = None  # trace mode: the key of the conversation each arrival belongs to

    @classmethod
    def none(cls) -> ArrivalPlan:
        """A closed loop's: it plans no arrival ahead."""
        nothing = np.empty(0, dtype=np.int64)
        return cls(nothing.astype(float), nothing)

    @classmethod
    def of(
        cls, arrivals: ArrivalSchedule | TraceClock, sessions: Sequence[Session], links: SessionLinks | None = None
    ) -> ArrivalPlan:
        """The plan of `arrivals`. `links`: the sessions' links where the caller holds them (the trace
        dispatcher), so they are built once; else built here for a trace's conversations."""
        if isinstance(arrivals, ArrivalSchedule):
            offsets = np.fromiter(arrivals.times(), dtype=float)
            return cls(offsets, np.arange(len(offsets), dtype=np.int64))
        starts = trace_session_starts(arrivals, sessions)
        trace_s = np.array([t for t, _ in starts], dtype=float)
        run_s = np.array([arrivals.run_time(t) for t in trace_s], dtype=float)
        keys = np.array([i for _, i in starts], dtype=np.int64)
        conversation = conversations(sessions, (links if links is not None else SessionLinks.of(sessions)).by_id)
        count, conversations_count = len(sessions), int(conversation.max(initial=-1)) + 1
        return cls(run_s, keys, trace_s, keys // count * conversations_count + conversation[keys % count])

    def owned(self, index: int, count: int) -> np.ndarray:
        """The positions worker `index` of `count` sends: every count-th key (in trace mode, every
        count-th conversation: a subagent goes with the agent that joins it)."""
        if not 0 <= index < count:
            raise ValueError(f"worker index {index} outside 0..{count - 1}")
        return np.flatnonzero((self.keys if self.groups is None else self.groups) % count == index)


def trace_request_times(trace: TraceClock, sessions: Sequence[Session]) -> list[float]:
    """Run offsets of every request the trace holds inside the plan (a turn's recorded time, else
    its session's offset plus think times): the load each stage of a trace replay is asked for."""
    times: list[float] = []
    for start, index in trace_session_starts(trace, sessions):
        at = start
        for k, turn in enumerate(sessions[index % len(sessions)].turns):
            if k:
                at = start + turn.at_s if turn.at_s is not None else at + turn.think_time_s
            if at < trace.trace_end:
                times.append(trace.run_time(at))
    return times


def trace_stages(stages: Sequence[Stage], trace: TraceClock, sessions: Sequence[Session]) -> list[Stage]:
    """The stages of a trace replay, each with the request rate the trace holds at its speed."""
    times = np.asarray(trace_request_times(trace, sessions))
    return [
        s.model_copy(update={"qps": int(((times >= s.start_s) & (times < s.end_s)).sum()) / s.duration_s})
        for s in stages
    ]


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
