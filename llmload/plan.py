"""A run's plan, built once from the flags and checked before anything starts: the workload, the
stages, the arrivals (a request schedule, or the trace's clock) and the client's limits. The
plan's record in the run directory is run.json (`RunManifest`), written from it at the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
)

from llmload.cancel import CancelPlan
from llmload.client import Limits
from llmload.cost.prices import pricing
from llmload.drain import DEFAULT_CAP_S
from llmload.errors import InputError, validation_message
from llmload.model_mix import ModelMix
from llmload.models import AccessNote, GoodputSLO, PrefixCacheReset, Pricing, RunManifest, ServerIdentity, Stage
from llmload.replicas import Replicas
from llmload.schedule import (
    DEFAULT_STAGES,
    ArrivalProcess,
    ArrivalSchedule,
    TraceClock,
    build_stages,
    expected_arrivals,
    parse_stage_percents,
    trace_period,
    trace_request_times,
    trace_session_starts,
    trace_stages,
)
from llmload.workload import Workload, load_workload

ASSUMED_REQUEST_S = 2.0  # first guess of a request's duration, for the initial user count


# PlanFlags fields whose flag is not `--field-name`
FLAG_NAMES = {
    "stage_duration_s": "stage-duration",
    "hold_duration_s": "hold-duration",
    "warmup_s": "warmup",
    "drain_s": "drain-timeout",
    "connect_s": "timeout-connect",
    "first_token_s": "timeout-first-token",
    "between_tokens_s": "timeout-between-tokens",
    "total_s": "timeout-total",
    "gpu_hour_cost": "gpu-hour-cost",
}


class PlanFlags(BaseModel):
    """What the user asked for (Locust's flags, `llmload soak` and `search` pass them on), each
    within its range: `checked` refuses a value out of it before anything starts."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: str
    target_qps: PositiveFloat | None = None
    stages: str = DEFAULT_STAGES
    stage_duration_s: PositiveFloat = 60.0
    hold_duration_s: PositiveFloat | None = None
    arrival: ArrivalProcess = "poisson"
    burstiness: PositiveFloat = 1.0
    time_scale: PositiveFloat = 1.0
    warmup_s: NonNegativeFloat | None = None
    seed: NonNegativeInt = 0
    first_session: NonNegativeInt = 0
    drain_s: NonNegativeFloat = DEFAULT_CAP_S
    history_turns: PositiveInt | None = None
    max_users: PositiveInt = 2000
    limits: Limits = Field(default_factory=Limits)
    goodput_slo: tuple[str, ...] = ()
    cancel_share: float = Field(default=0.0, ge=0, lt=1)
    cancel_after: str | None = None
    gpu_hour_cost: PositiveFloat | None = None
    gpu_prices: str | None = None

    @classmethod
    def checked(cls, **values: Any) -> PlanFlags:
        """The flags, or an InputError naming each flag out of its range (`--burstiness: ...`)."""
        try:
            return cls(**values)
        except ValidationError as exc:
            raise InputError(validation_message(exc, flags=FLAG_NAMES)) from None


@dataclass(frozen=True)
class RunPlan:
    """Everything the flags decide, checked: InputError names the flag that is wrong."""

    flags: PlanFlags
    workload: Workload
    stages: list[Stage]
    arrivals: ArrivalSchedule | TraceClock  # request arrivals (rate modes), or the trace's clock
    target_qps: float
    goodput_slo: GoodputSLO | None
    cancel: CancelPlan | None = None  # streams cut on purpose
    pricing: Pricing | None = None  # what a GPU-hour costs

    @classmethod
    def build(cls, flags: PlanFlags) -> RunPlan:
        workload = load_workload(flags.workload)
        trace = flags.arrival == "trace"
        target: float | None
        if trace:
            if any(s.offset_s is None for s in workload.sessions):
                raise InputError(
                    f"--arrival trace needs recorded session offsets (offset_s), and {flags.workload} has"
                    " sessions without one: build it from a log with timestamps, or pick another --arrival"
                )
            period = trace_period([s.offset_s or 0.0 for s in workload.sessions])
            target = workload.requests / period * flags.time_scale  # the trace's own rate is 100%
        elif flags.time_scale != 1.0:
            raise InputError("--time-scale applies to --arrival trace only")
        else:
            target = flags.target_qps if flags.target_qps is not None else workload.spec.target_qps
        if target is None:
            raise InputError(f"no target rate: give --target-qps (the workload {flags.workload} names none)")
        warmup = flags.warmup_s if flags.warmup_s is not None else default_warmup_s(workload)
        try:
            stages = build_stages(
                target, parse_stage_percents(flags.stages), flags.stage_duration_s, flags.hold_duration_s, warmup
            )
        except ValueError as exc:
            raise InputError(str(exc)) from None
        arrivals: ArrivalSchedule | TraceClock
        if trace:
            arrivals = TraceClock(stages, flags.time_scale)
            stages = trace_stages(stages, arrivals, workload.sessions)
        else:
            arrivals = ArrivalSchedule(stages, flags.arrival, burstiness=flags.burstiness, seed=flags.seed)
        if trace and flags.first_session:
            raise InputError("--first-session applies to rate modes only (a trace keeps its order)")
        goodput_slo = GoodputSLO.parse(flags.goodput_slo) if flags.goodput_slo else None
        cancel = CancelPlan.parse(flags.cancel_share, flags.cancel_after)
        prices = pricing(flags.gpu_hour_cost, flags.gpu_prices)
        return cls(flags, workload, stages, arrivals, target, goodput_slo, cancel, prices)

    @property
    def end_s(self) -> float:
        return self.stages[-1].end_s

    @property
    def history_turns(self) -> int | None:
        return self.flags.history_turns or self.workload.spec.history_turns

    def manifest(
        self,
        *,
        run_id: str,
        replicas: Replicas,
        models: ModelMix,
        started_at: float,
        workers: int,
        server: ServerIdentity | None = None,
        access: AccessNote | None = None,
        prefix_cache_reset: PrefixCacheReset | None = None,
        session_header: str | None = None,
    ) -> RunManifest:
        """run.json of a run of this plan started at `started_at` (unix seconds)."""
        return RunManifest(
            run_id=run_id,
            host=replicas.primary,
            replicas=list(replicas.hosts) if len(replicas.hosts) > 1 else [],
            session_header=session_header,
            model=models.primary,
            model_mix=models.normalised() if len(models.shares) > 1 else [],
            workload=str(Path(self.flags.workload).absolute()),  # `llmload report` from elsewhere finds it
            arrival=self.flags.arrival,
            burstiness=self.flags.burstiness,
            seed=self.flags.seed,
            first_session=self.flags.first_session,
            target_qps=self.target_qps,
            time_scale=self.flags.time_scale,
            stages=self.stages,
            drain_s=self.flags.drain_s,
            started_at=started_at,
            workers=workers,
            limits={k: float(v) for k, v in vars(self.flags.limits).items()},
            goodput_slo=self.goodput_slo,
            server=server,
            access=access,
            prefix_cache_reset=prefix_cache_reset,
            cancel=self.cancel.note() if self.cancel is not None else None,
            pricing=self.pricing,
        )

    def planned(self) -> int:
        """Planned request arrivals (rate modes) or session starts (trace mode)."""
        if isinstance(self.arrivals, ArrivalSchedule):
            return expected_arrivals(self.stages)
        return len(trace_session_starts(self.arrivals, self.workload.sessions))

    def offsets(self) -> np.ndarray:
        """Every planned request's time, seconds from the start (trace mode: as recorded)."""
        if isinstance(self.arrivals, ArrivalSchedule):
            return np.fromiter(self.arrivals.times(), dtype=float)
        return np.asarray(trace_request_times(self.arrivals, self.workload.sessions), dtype=float)

    def initial_users(self) -> int:
        """Little's law with a guessed request time; the shape grows it when users run short. A user
        holds one request in the rate modes, and a whole session (think times too) in trace mode."""
        peak = max(s.qps for s in self.stages)
        busy_s = ASSUMED_REQUEST_S
        if isinstance(self.arrivals, TraceClock):
            peak /= self.workload.mean_turns
            busy_s = mean_session_span_s(self.workload)
        return min(self.flags.max_users, math.ceil(peak * busy_s * 1.5) + 4)


def mean_session_span_s(workload: Workload) -> float:
    """A session's length on average: its think times plus a guessed time per request."""
    sessions = workload.sessions
    think = sum(t.think_time_s for s in sessions for t in s.turns) / len(sessions)
    return think + workload.mean_turns * ASSUMED_REQUEST_S


def default_warmup_s(workload: Workload) -> float:
    """Long enough for sessions to reach every depth before anything is judged: one mean session
    (0 for single-turn workloads, which have no depth to build)."""
    return 0.0 if workload.mean_turns == 1 else float(math.ceil(mean_session_span_s(workload)))
