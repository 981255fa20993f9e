"""A run against a server of known capacity, made without a network: the plan's arrivals as llmload
plans them (`ArrivalSchedule`), the server's answers (`servers`), the drain as the run ends it
(`llmload.drain`, sized from the answers seen), and the records a real run writes. It is judged by
the verdict's own code."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from llmload.drain import DEFAULT_CAP_S, drain_end
from llmload.errorrates.servers import Server
from llmload.gates.criteria import SoakCriteria
from llmload.gates.search import CONFIRM_S, PROBE_DRAIN_S, PROBE_S, PROBE_WARMUP_S, confirm_criteria, probe_criteria
from llmload.gates.soak import DEFAULT_HOLD_S
from llmload.gates.verdict import SoakResult, evaluate
from llmload.models import RunManifest, Stage, Summary
from llmload.observe.summary import ServerSamples, read_server
from llmload.records import FRAME_COLUMNS, RunRecords
from llmload.report.summary import summarize
from llmload.rundir import Run
from llmload.schedule import DEFAULT_STAGE_PERCENTS, DEFAULT_STAGE_S, ArrivalProcess, ArrivalSchedule, build_stages
from llmload.stats.percentiles import percentiles

HoldKind = Literal["probe", "confirm", "soak", "soak-30m"]
STARTED_AT = 1_800_000_000.0
NO_SERVER_FILE = Path("/nonexistent/server.jsonl")  # these servers export no /metrics


@dataclass(frozen=True)
class Hold:
    """How a rate is held and judged: the stages before it, its length and its criteria."""

    kind: HoldKind
    stages: tuple[Stage, ...]
    criteria: SoakCriteria
    drain_s: float  # the drain's cap, as the run has it: --drain-timeout's default, or the search's --probe-drain

    @property
    def judged(self) -> Stage:
        return self.stages[-1]


def hold_plan(kind: HoldKind, hold_qps: float) -> Hold:
    """The holds the gates judge: a search probe (10 s warm-up, 30 s hold), the search's confirm (5 min),
    the default soak (25/50/100% × 60 s, then 150% × 5 min) and a 30-minute soak, each at `hold_qps`
    in its hold, with the criteria that hold is judged by (the search's own for a probe and a confirm)."""
    default = SoakCriteria()
    if kind == "probe":
        stages = build_stages(hold_qps, (100,), PROBE_S, warmup_s=PROBE_WARMUP_S)
        return Hold(kind, tuple(stages), probe_criteria(default, PROBE_S), PROBE_DRAIN_S)
    if kind == "confirm":
        stages = build_stages(hold_qps, (100,), CONFIRM_S, warmup_s=PROBE_WARMUP_S)
        return Hold(kind, tuple(stages), confirm_criteria(default, CONFIRM_S), PROBE_DRAIN_S)
    hold_s = DEFAULT_HOLD_S if kind == "soak" else 1800.0
    stages = build_stages(hold_qps / 1.5, DEFAULT_STAGE_PERCENTS, DEFAULT_STAGE_S, hold_duration_s=hold_s)
    return Hold(kind, tuple(stages), default, DEFAULT_CAP_S)


def records(
    hold: Hold, server: Server, process: ArrivalProcess, burstiness: float, seed: int
) -> tuple[RunManifest, pd.DataFrame]:
    """One run's plan and records: every request sent on time (these holds measure the server, not
    the load generator), answered as `server` answers, or `unfinished` when the drain ended first."""
    stages = list(hold.stages)
    schedule = ArrivalSchedule(stages, process, burstiness=burstiness, seed=seed)
    arrivals = np.fromiter(schedule.times(), dtype=float)
    served = server.serve(arrivals, np.random.default_rng(seed + 1_000_003))
    plan_end = stages[-1].end_s
    ends = drain_end(arrivals, served.finished, plan_end, hold.drain_s)
    done = served.finished <= ends
    answered = served.first_token <= ends
    stage_index = np.searchsorted(np.array([s.end_s for s in stages]), arrivals, side="right")
    sent_at = STARTED_AT + arrivals
    finished_at = STARTED_AT + np.where(done, served.finished, ends)
    e2e = (finished_at - sent_at) * 1000
    ttft = np.where(answered, served.first_token - arrivals, np.nan) * 1000
    tokens = np.where(done, served.tokens, np.nan)
    frame = pd.DataFrame(
        {
            "worker": 0,
            "stage": pd.Categorical([stages[i].name for i in np.minimum(stage_index, len(stages) - 1).tolist()]),
            "status": pd.Categorical(np.where(done, "ok", "unfinished")),
            "turn": 0,
            "scheduled_at": sent_at,
            "sent_at": sent_at,
            "finished_at": finished_at,
            "schedule_delay_ms": 0.0,
            "ttft_ms": ttft,
            "ttfo_ms": np.nan,
            "e2e_ms": e2e,
            "tpot_ms": np.divide(e2e - ttft, tokens - 1, out=np.full(len(tokens), np.nan), where=tokens > 1),
            "prompt_tokens": 100.0,
            "output_tokens": tokens,
            "cached_tokens": np.nan,
            "usage_from_server": True,
            "reasoning_tokens": np.nan,
            "reasoning_tokens_counted": None,
            "requested_output_tokens": np.nan,
            "output_tokens_forced": None,
            "error_category": pd.Series("unfinished", index=range(len(done))).where(~done),
            "error_message": pd.Series(
                "still running when the drain after the plan ended", index=range(len(done))
            ).where(~done),
        },
        columns=list(FRAME_COLUMNS),
    )
    manifest = RunManifest(
        run_id=f"errorrates-{seed}", host="http://known-capacity", model=None, workload="(generated)",
        arrival=process, burstiness=burstiness, seed=seed, target_qps=stages[-1].qps / stages[-1].percent * 100,
        stages=stages, drain_s=float(ends - plan_end), started_at=STARTED_AT,
        finished_at=STARTED_AT + float(ends), workers=1, limits={},
    )  # fmt: skip
    return manifest, frame


@functools.cache
def _no_server() -> ServerSamples:
    """What a run without a server.jsonl reads, read once: the same for every run judged."""
    return read_server(NO_SERVER_FILE)


def judge(manifest: RunManifest, frame: pd.DataFrame, criteria: SoakCriteria) -> tuple[SoakResult, Summary]:
    """The soak verdict of a generated run, through the code `llmload verdict` runs: the summary
    (`summarize`), then `evaluate`. Only the ITL histograms, which no check reads, are left out."""
    server = _no_server()
    summary = summarize(
        frame, manifest, itl=percentiles([]), stage_itl_p50=None, server=server, good=None, workload_prefix=None
    )
    run = Run(Path(manifest.run_id), manifest, RunRecords(Path(manifest.run_id), frame), server)
    return evaluate(run, summary, criteria), summary
