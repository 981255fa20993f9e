"""A run's plan, built once from the flags and checked before anything starts: the workload, the
stages, the arrivals (a request schedule, or the trace's clock) and the client's limits. The
plan's record in the run directory is run.json (`RunManifest`), written from it at the start.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, ClassVar

import numpy as np
from pydantic import (
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
)

from llmload import drain
from llmload.cancel import CancelPlan
from llmload.client import Limits
from llmload.cost.prices import pricing
from llmload.errors import InputError
from llmload.flagmodel import Flag, FlagModel
from llmload.model_mix import ModelMix
from llmload.models import (
    GOODPUT_SYNTAX,
    LABEL_SYNTAX,
    AccessNote,
    GoodputSLO,
    PrefixCacheReset,
    Pricing,
    RunManifest,
    ServerIdentity,
    SessionLinks,
    Stage,
    conversations,
    parse_labels,
)
from llmload.packaged import SAMPLE_WORKLOAD, WORKLOAD_HELP
from llmload.replicas import Replicas
from llmload.schedule import (
    DEFAULT_STAGE_S,
    DEFAULT_STAGES,
    ArrivalPlan,
    ArrivalProcess,
    ArrivalSchedule,
    TraceClock,
    build_stages,
    conversation_stages,
    expected_arrivals,
    parse_duration,
    parse_stage_percents,
    trace_period,
    trace_request_times,
    trace_session_starts,
    trace_stages,
)
from llmload.workload import Workload, load_workload
from llmload.workload.blocks import BlockText
from llmload.workload.pacing import paced
from llmload.workload.scale import factor_for_max_prompt, scaled

ASSUMED_REQUEST_S = 2.0  # first guess of a request's duration, for the initial user count


class PlanFlags(FlagModel):
    """What the user asked for, each within its range: `checked` refuses a value out of it before
    anything starts. Each field is a flag of Locust's command line (llmload.flagmodel: its parser entry,
    its reading and its text on a command line `llmload soak` and `search` start): adding a plan flag
    is adding a field here. The fields of PER_REQUEST are listed with the requests' flags in --help."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    PER_REQUEST: ClassVar[tuple[str, ...]] = ("cancel_share", "cancel_after", "gpu_hour_cost", "gpu_prices")

    workload: Annotated[str, Flag(WORKLOAD_HELP)] = str(SAMPLE_WORKLOAD)
    target_qps: Annotated[PositiveFloat | None, Flag("100%% request rate (default: the workload's)")] = None
    stages: Annotated[str, Flag("stage rates as %% of --target-qps")] = DEFAULT_STAGES
    stage_duration_s: Annotated[PositiveFloat, Flag("seconds per stage", name="stage-duration")] = DEFAULT_STAGE_S
    hold_duration_s: Annotated[PositiveFloat | None, Flag("seconds of the last stage", name="hold-duration")] = None
    arrival: Annotated[ArrivalProcess, Flag("trace: the sessions' recorded times")] = "poisson"
    burstiness: Annotated[PositiveFloat, Flag("gamma shape: <1 burstier, 1 = Poisson")] = 1.0
    time_scale: Annotated[PositiveFloat, Flag("trace replay speed (2 = twice as fast)")] = 1.0
    warmup_s: Annotated[
        NonNegativeFloat | None,
        Flag(
            "unjudged lead-in at the first stage's rate, e.g. 30s (default: a mean session's length for"
            " multi-turn workloads, 0 for single-turn)",
            name="warmup",
            parse=functools.partial(parse_duration, allow_zero=True),
        ),
    ] = None
    seed: Annotated[NonNegativeInt, Flag("seed of the arrival process")] = 0
    first_session: Annotated[
        NonNegativeInt,
        Flag("replay the workload from this session on, cycling (rate modes; a search gives each probe its own)"),
    ] = 0
    history_turns: Annotated[PositiveInt | None, Flag("send only the last N turns of history")] = None
    max_users: Annotated[PositiveInt, Flag("cap on concurrent sessions (users)")] = 2000
    drain_s: Annotated[
        NonNegativeFloat,
        Flag(
            f"the longest (s) in-flight requests may run on after the plan; {drain.RULE} (%(default)g)",
            name="drain-timeout",
        ),
    ] = drain.DEFAULT_CAP_S
    # the client's limits (llmload.client.Limits), flag by flag
    timeout_connect: PositiveFloat = Limits.connect_s
    timeout_first_token: PositiveFloat = Limits.first_token_s
    timeout_between_tokens: PositiveFloat = Limits.between_tokens_s
    timeout_total: PositiveFloat = Limits.total_s
    goodput_slo: Annotated[
        tuple[str, ...], Flag(f"per-request SLOs goodput counts against: {GOODPUT_SYNTAX}", metavar="SPEC")
    ] = ()
    cancel_share: Annotated[
        float,
        Field(ge=0, lt=1),
        Flag(
            "cut this share of the streams on purpose, as users who close a tab (not failures, never judged);"
            " the verdict then checks the server lets go of what they held",
            metavar="FRACTION",
        ),
    ] = 0.0
    cancel_after: Annotated[
        str | None,
        Flag(
            "where each cut stream is cut: after that many output tokens or seconds, drawn as `workload synth`"
            " takes lengths (tokens:32, seconds:lognormal:median=2,sigma=0.5)",
            metavar="tokens:DIST|seconds:DIST",
        ),
    ] = None
    cache_bust: Annotated[
        bool,
        Flag(
            "open every play of a session with a marker of the run and the play, so that replays of the workload"
            " (in this run, a search's other probes, an earlier run) find none of each other's prefixes in the"
            " server's cache; the sessions of one play still share theirs"
        ),
    ] = False
    think_time_only: Annotated[
        bool,
        Flag(
            "--arrival trace: send each follow-up turn its think time after the reply this run's server gave,"
            " not at the time the trace recorded it (which holds the recorded server's speed)",
            name="use-think-time-only",
        ),
    ] = False
    sessions_in_flight: Annotated[
        PositiveInt | None,
        Flag(
            "--arrival trace as a closed loop: keep N of the trace's conversations (an agent with its subagents) in"
            " flight, each stage its percent of N, each replaced by the next in the trace's order when it ends,"
            " the trace recycled (with --cache-bust, unwarmed); the rate is then the server's answer, not a target",
            metavar="N",
        ),
    ] = None
    max_think_s: Annotated[
        PositiveFloat | None,
        Flag(
            "cap each think time, e.g. 60s: an agent's idle gaps hold sessions open for nothing",
            name="max-think-time",
            parse=parse_duration,
            metavar="DURATION",
        ),
    ] = None
    scale_tokens: Annotated[
        float,
        Field(gt=0, le=1),
        Flag(
            "send every length of the workload (prompts, their prefix blocks, outputs) times F, keeping its shared"
            " prefixes and growth per turn: a trace of long prompts replayed on a small model",
            metavar="F",
        ),
    ] = 1.0
    scale_to_max_prompt: Annotated[
        PositiveInt | None,
        Flag(
            "as --scale-tokens, by the factor that makes the workload's longest prompt at most N tokens (of a"
            " workload of prefix blocks, the largest that keeps its blocks whole); the run records the factor",
            metavar="N",
        ),
    ] = None
    gpu_hour_cost: Annotated[
        PositiveFloat | None,
        Flag(
            "the price of one GPU-hour (of the server's hour when no GPU is seen): the report gives $ per 1M"
            " output and input tokens; without it, the GPU's entry of llmload's price table (--gpu-prices)",
            metavar="USD",
        ),
    ] = None
    gpu_prices: Annotated[
        str | None,
        Flag(
            "a YAML file of USD per GPU-hour by words of the GPU's name (H100: 2.5), over llmload's table",
            metavar="FILE",
        ),
    ] = None
    label: Annotated[
        tuple[str, ...],
        Flag(
            f"the team's own name for the run, in run.json's labels and shown by `llmload history`: {LABEL_SYNTAX}",
            metavar="KEY=VALUE",
        ),
    ] = ()

    @property
    def limits(self) -> Limits:
        return Limits(self.timeout_connect, self.timeout_first_token, self.timeout_between_tokens, self.timeout_total)


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
    labels: dict[str, str] = field(default_factory=dict)  # --label: run.json's labels

    @classmethod
    def build(cls, flags: PlanFlags) -> RunPlan:
        workload = load_workload(flags.workload)
        if flags.scale_to_max_prompt is not None:
            if flags.scale_tokens != 1:
                raise InputError("give --scale-tokens or --scale-to-max-prompt, not both")
            # the factor, not the target, is what the run's flags record: a report reloads the workload with it
            flags = flags.model_copy(
                update={"scale_tokens": factor_for_max_prompt(workload, flags.scale_to_max_prompt)}
            )
        workload = paced(
            scaled(workload, flags.scale_tokens), think_time_only=flags.think_time_only, max_think_s=flags.max_think_s
        )
        trace = flags.arrival == "trace"
        target: float | None
        if flags.sessions_in_flight is not None and not trace:
            raise InputError("--sessions-in-flight applies to --arrival trace only: it keeps the trace's conversations")
        if flags.sessions_in_flight is not None:
            target = 0.0  # a closed loop asks for no rate
        elif trace:
            if any(s.offset_s is None for s in workload.sessions):
                raise InputError(
                    f"--arrival trace needs recorded session offsets (offset_s), and {flags.workload} has"
                    " sessions without one: build it from a log with timestamps, or pick another --arrival"
                )
            period = trace_period(workload.sessions)
            target = workload.requests / period * flags.time_scale  # the trace's own rate is 100%
        elif flags.time_scale != 1.0:
            raise InputError("--time-scale applies to --arrival trace only")
        elif flags.think_time_only:
            raise InputError(
                "--use-think-time-only applies to --arrival trace only: rate modes send every follow-up its think"
                " time after the reply"
            )
        else:
            target = flags.target_qps if flags.target_qps is not None else workload.spec.target_qps
        if target is None:
            raise InputError(f"no target rate: give --target-qps (the workload {flags.workload} names none)")
        warmup = flags.warmup_s if flags.warmup_s is not None else default_warmup_s(workload)
        try:
            stages = build_stages(  # a closed loop's rate is a placeholder: its stages keep sessions, below
                target or 1.0, parse_stage_percents(flags.stages), flags.stage_duration_s, flags.hold_duration_s, warmup
            )
        except ValueError as exc:
            raise InputError(str(exc)) from None
        arrivals: ArrivalSchedule | TraceClock
        if flags.sessions_in_flight is not None:
            stages = conversation_stages(stages, flags.sessions_in_flight)
            arrivals = TraceClock(stages, flags.time_scale)
        elif trace:
            arrivals = TraceClock(stages, flags.time_scale)
            stages = trace_stages(stages, arrivals, workload.sessions)
        else:
            arrivals = ArrivalSchedule(stages, flags.arrival, burstiness=flags.burstiness, seed=flags.seed)
        if trace and flags.first_session:
            raise InputError("--first-session applies to rate modes only (a trace keeps its order)")
        goodput_slo = GoodputSLO.parse(flags.goodput_slo) if flags.goodput_slo else None
        cancel = CancelPlan.parse(flags.cancel_share, flags.cancel_after)
        prices = pricing(flags.gpu_hour_cost, flags.gpu_prices)
        return cls(flags, workload, stages, arrivals, target, goodput_slo, cancel, prices, parse_labels(flags.label))

    @functools.cached_property
    def block_text(self) -> BlockText | None:
        """The text of the workload's block turns: one per process, so its users share its cache."""
        return BlockText.of(self.workload.spec)

    @property
    def end_s(self) -> float:
        return self.stages[-1].end_s

    @property
    def history_turns(self) -> int | None:
        return self.flags.history_turns or self.workload.spec.history_turns

    def _ranked(self) -> bool:
        """Whether the workload's turns ask for models by rank (ModelMix.for_turn), so no weight applies."""
        return any(turn.model_rank is not None for session in self.workload.sessions for turn in session.turns)

    def unused_weights(self, models: ModelMix) -> str | None:
        """Why the weights given to --model split nothing, for the console at the run's start: the workload's
        turns ask for models by rank. None where they split the sessions, or none was given (each 1)."""
        if len(models.shares) < 2 or all(share.weight == 1.0 for share in models.shares) or not self._ranked():
            return None
        given = " ".join(f"--model {share.name}:{share.weight:g}" for share in models.shares)
        return (
            f"{given}: the weights are not used: the workload's turns ask for models by rank (model_rank: the"
            " trace's main model the first --model, its others the next ones), so run.json lists no mix"
        )

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
            # a workload of ranked turns (an agentic trace's models) asks for each model by rank, not weight
            model_mix=models.normalised() if len(models.shares) > 1 and not self._ranked() else [],
            workload=str(Path(self.flags.workload).absolute()),  # `llmload report` from elsewhere finds it
            workload_sha256=self.workload.content_sha256(),  # runs of one workload, renamed or edited (history)
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
            labels=self.labels,
            flags=self.flags.model_dump(mode="json"),
        )

    @property
    def closed_loop(self) -> bool:
        """--sessions-in-flight: conversations kept in flight, no arrival planned ahead."""
        return self.flags.sessions_in_flight is not None

    def planned(self) -> int:
        """Planned request arrivals (rate modes) or session starts (trace mode; none in a closed loop)."""
        if isinstance(self.arrivals, ArrivalSchedule):
            return expected_arrivals(self.stages)
        return 0 if self.closed_loop else len(trace_session_starts(self.arrivals, self.workload.sessions))

    def arrival_plan(self) -> ArrivalPlan:
        """The arrivals planned ahead, as the workers share them (every request, or every session start of a
        trace); none in a closed loop, whose conversations open as slots free up."""
        return ArrivalPlan.none() if self.closed_loop else ArrivalPlan.of(self.arrivals, self.workload.sessions)

    def offsets(self) -> np.ndarray:
        """Every planned request's time, seconds from the start (trace mode: as recorded; none in a closed loop)."""
        if isinstance(self.arrivals, ArrivalSchedule):
            return np.fromiter(self.arrivals.times(), dtype=float)
        if self.closed_loop:
            return np.empty(0)
        return np.asarray(trace_request_times(self.arrivals, self.workload.sessions), dtype=float)

    def initial_users(self) -> int:
        """Little's law with a guessed request time; the shape grows it when users run short. A user
        holds one request in the rate modes, and a whole session (think times too) in trace mode: in a
        closed loop, one a session the conversations kept in flight hold at once."""
        if self.closed_loop:
            sessions = self.workload.sessions
            widest = int(max(np.bincount(conversations(sessions, SessionLinks.of(sessions).by_id))))
            return min(self.flags.max_users, max(s.sessions or 1 for s in self.stages) * widest + 4)
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
