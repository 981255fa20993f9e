"""A run's summary (summary.json), computed once from its records and handed to the verdict, the
Markdown and the HTML.

Every figure is computed from the raw per-request records (numpy's linear-interpolation
percentiles), never from Locust's statistics, which keep response times to two significant
digits. ITL gaps are counted in log-linear histograms (llmload.stats.sketch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmload.cancel import aftermath
from llmload.cost.summary import cost_summary
from llmload.models import (
    ANSWERED_STATUSES,
    OOM_FAMILY,
    FailureSummary,
    Goodput,
    LatencySummary,
    OutputLengths,
    Percentiles,
    ReasoningSummary,
    RequestCounts,
    ReusablePrefix,
    RunInfo,
    RunManifest,
    ShareSpread,
    StageSummary,
    Summary,
    Throughput,
    TokenSummary,
    TurnSummary,
    WorkerSummary,
)
from llmload.observe.summary import ServerSamples, series_max, server_summary, window_increase
from llmload.records import RunRecords
from llmload.report.goodput import good_requests
from llmload.report.groups import fuller_replicas, group_figures, slower_replicas
from llmload.report.warnings import SHORTFALL_DELAY_MS, SHORTFALL_RATIO, SPECULATION_ON_SYNTHETIC_TEXT, run_warnings
from llmload.rundir import Run
from llmload.stats.percentiles import mean, percentiles, quantile, token_percentiles
from llmload.stats.sketch import BUCKETS, Histograms
from llmload.workload.prefix import ConversationCodes, sent_prefix, server_block_size

TURN_MIX_DEEPEST = 8


def _turn_mix(turns: pd.Series) -> dict[str, float]:
    """Share of requests by turn number (1-based), deep turns pooled as "8+"."""
    if turns.empty:
        return {}
    numbers = (turns.astype(int) + 1).clip(upper=TURN_MIX_DEEPEST)
    shares = numbers.value_counts(normalize=True).sort_index()
    return {(f"{n}+" if n == TURN_MIX_DEEPEST else str(n)): round(float(v), 4) for n, v in shares.items()}


def goodput(rows: pd.DataFrame, good: pd.Series | None, seconds: float) -> Goodput | None:
    """Goodput of `rows` (status and output_tokens; None without an SLO): the good ones per second,
    and their share of the answered ones (an unfinished request never met its SLO); cancelled and
    never-sent requests are in neither."""
    if good is None:
        return None
    answered = rows.status.isin(ANSWERED_STATUSES).to_numpy(dtype=bool)
    met = answered & good.loc[rows.index].to_numpy(dtype=bool)
    return Goodput(
        requests_per_s=int(met.sum()) / seconds,
        output_tokens_per_s=float(rows.output_tokens[met].fillna(0).sum()) / seconds,
        slo_attainment=int(met.sum()) / int(answered.sum()) if answered.any() else None,
    )


def _stage_summaries(
    df: pd.DataFrame,
    manifest: RunManifest,
    good: pd.Series | None,
    itl_p50: Sequence[float | None],
    server: pd.DataFrame,
    *,
    reasoned: bool,
) -> list[StageSummary]:
    """Per stage: target, offered (scheduled) and achieved (sent in the stage's window) rates, goodput
    (of the same window), what the stage carried (turn depths, prompt lengths), and the preemptions
    vLLM counted in its window; TTFO when the run had reasoning. Shortfall is judged against the target.
    Rows are selected with the few columns used: a run can hold 10M records."""
    out = []
    sent_at = df.sent_at.to_numpy(dtype=float)
    is_sent = df.sent_at.notna().to_numpy(dtype=bool)  # not not_sent, nor lost before it was sent
    for stage, stage_itl_p50 in zip(manifest.stages, itl_p50, strict=True):
        mine = (df.stage == stage.name).to_numpy(dtype=bool)
        columns = ["status", "turn", "sent_at", "schedule_delay_ms", "ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms",
                   "prompt_tokens", "output_tokens"]  # fmt: skip
        rows = df.loc[mine, columns]
        window_start = manifest.started_at + stage.start_s
        window_end = window_start + stage.duration_s
        in_window = is_sent & (sent_at >= window_start) & (sent_at < window_end)
        sent_in_window = int(in_window.sum())
        delay_p99 = quantile(rows.schedule_delay_ms, 99)
        ok = rows[rows.status == "ok"]
        needed = math.floor(SHORTFALL_RATIO * stage.qps * stage.duration_s + 1e-9)
        out.append(
            StageSummary(
                name=stage.name,
                target_qps=stage.qps,
                offered_qps=len(rows) / stage.duration_s,
                achieved_qps=sent_in_window / stage.duration_s,
                duration_s=stage.duration_s,
                scheduled=len(rows),
                ok=len(ok),
                failed=int((rows.status == "failed").sum()),
                unfinished=int((rows.status == "unfinished").sum()),
                cancelled=int((rows.status == "cancelled").sum()),
                abandoned=int((rows.status == "abandoned").sum()),
                not_sent=int((rows.status == "not_sent").sum()),
                lost=int((rows.status == "lost").sum()),
                schedule_delay_p99_ms=delay_p99,
                ttft_p50_ms=quantile(ok.ttft_ms, 50),
                ttft_p99_ms=quantile(ok.ttft_ms, 99),
                ttfo_p50_ms=quantile(ok.ttfo_ms, 50) if reasoned else None,
                ttfo_p99_ms=quantile(ok.ttfo_ms, 99) if reasoned else None,
                e2e_p50_ms=quantile(ok.e2e_ms, 50),
                e2e_p99_ms=quantile(ok.e2e_ms, 99),
                e2e_mean_ms=mean(ok.e2e_ms),
                itl_p50_ms=stage_itl_p50,
                tpot_p50_ms=quantile(ok.tpot_ms, 50),
                preemptions=window_increase(server[server.t <= window_end], "preemptions_total", window_start),
                output_tokens_per_s=float(ok.output_tokens.fillna(0).sum()) / stage.duration_s,
                prompt_tokens_p50=quantile(ok.prompt_tokens, 50),
                prompt_tokens_p99=quantile(ok.prompt_tokens, 99),
                turn_mix=_turn_mix(rows.turn[rows.sent_at.notna()]),
                warmup=stage.warmup,
                goodput=goodput(df.loc[in_window, ["status", "output_tokens"]], good, stage.duration_s),
                shortfall=bool(sent_in_window < needed or (delay_p99 or 0) > SHORTFALL_DELAY_MS),
            )
        )
    return out


def _turn_summaries(df: pd.DataFrame) -> list[TurnSummary]:
    out = []
    columns = ["turn", "status", "prompt_tokens", "cached_tokens", "ttft_ms"]
    sent = df.loc[df.sent_at.notna().to_numpy(dtype=bool), columns]
    for turn, rows in sent.groupby("turn"):
        ok = rows[rows.status == "ok"]
        told = ok[ok.cached_tokens.notna()]
        out.append(
            TurnSummary(
                turn=int(str(turn)) + 1,
                requests=len(rows),
                prompt_tokens_p50=quantile(ok.prompt_tokens, 50),
                prompt_tokens_p99=quantile(ok.prompt_tokens, 99),
                ttft_p50_ms=quantile(ok.ttft_ms, 50),
                ttft_p99_ms=quantile(ok.ttft_ms, 99),
                cached_share=float(told.cached_tokens.sum() / told.prompt_tokens.sum()) if len(told) else None,
            )
        )
    return out


def summarize(
    df: pd.DataFrame,
    manifest: RunManifest,
    *,
    itl: Percentiles,
    stage_itl_p50: Sequence[float | None] | None,
    server: ServerSamples,
    good: pd.Series | None = None,
    workload_prefix: ReusablePrefix | None = None,
) -> Summary:
    """The run's summary. The stage table covers every stage; every other figure leaves out the
    warm-up, which is reported but never judged. `itl`: of the gaps of the same requests as TTFT,
    and `stage_itl_p50` each stage's median gap (both streamed apart from `df`: see summarize_run;
    None: not counted); `server`: its samples (server.jsonl); `good`: which records met the goodput
    SLO (llmload.goodput.good_requests), None without one; `workload_prefix`: what the prompts the
    judged stages sent could have hit in the prefix cache (`sent_reusable_prefix`)."""
    itl_p50 = stage_itl_p50 if stage_itl_p50 is not None else [None] * len(manifest.stages)
    reasoned = had_reasoning(df)
    stages = _stage_summaries(df, manifest, good, itl_p50, server.frame, reasoned=reasoned)
    in_warmup = ~df.stage.isin({s.name for s in manifest.judged_stages})
    judged = df[~in_warmup] if in_warmup.any() else df
    # only the columns used: a run can hold 10M records, each copy of the frame a gigabyte
    ok = judged.loc[
        (judged.status == "ok").to_numpy(dtype=bool),
        ["ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "schedule_delay_ms", "prompt_tokens", "output_tokens",
         "usage_from_server", "reasoning_tokens", "reasoning_tokens_counted", "requested_output_tokens",
         "output_tokens_forced"],
    ]  # fmt: skip
    sent = judged.schedule_delay_ms[judged.sent_at.notna().to_numpy(dtype=bool)]
    requests = _request_counts(judged, ok=len(ok), sent=len(sent), warmup=int(in_warmup.sum()))
    finished = manifest.finished_at or float(judged.finished_at.max() if len(sent) else manifest.started_at)
    # over the judged stages (or less, when stopped early): warm-up, start-up and drain would make
    # throughput depend on how a run began and wound down rather than on the target
    elapsed = max(1e-9, min(finished, manifest.started_at + manifest.stages[-1].end_s) - manifest.judged_started_at)
    lag_max_ms = series_max(server.frame.client_lag_ms)
    lengths = _output_lengths(ok)
    warnings = run_warnings(
        manifest, stages, ok, lag_max_ms=lag_max_ms, sent=len(sent), unfinished=requests.unfinished, lengths=lengths
    )
    return Summary(
        run=_run_info(manifest, finished=finished, lag_max_ms=lag_max_ms, warnings=warnings),
        requests=requests,
        latency_ms=_latency_summary(ok, sent, itl, reasoned=reasoned),
        throughput=_throughput(judged, ok, good, elapsed),
        tokens=TokenSummary(prompt=token_percentiles(ok.prompt_tokens), output=token_percentiles(ok.output_tokens)),
        reasoning=_reasoning(ok) if reasoned else None,
        stages=stages,
        turns=_turn_summaries(judged),
        failures=_failure_summary(judged),
        output_lengths=lengths,
        server=server_summary(server, manifest.judged_started_at, workload_prefix),
        workers=_worker_summaries(df, manifest),
        by_model=group_figures(judged, "model", elapsed, {s.name: s.weight for s in manifest.model_mix})
        if manifest.model_mix or judged.model.nunique() > 1  # a mix asked for, or the workload's turns name models
        else [],
        cancel=manifest.cancel,
        server_release=manifest.server_release,
        cut_aftermath=aftermath(judged) if manifest.cancel is not None else None,
        cost=cost_summary(df, manifest, server.gpus, elapsed),
        by_host=group_figures(judged, "host", elapsed, dict.fromkeys(manifest.replicas, 1 / len(manifest.replicas)))
        if manifest.replicas
        else [],
    )


def _run_info(manifest: RunManifest, *, finished: float, lag_max_ms: float | None, warnings: list[str]) -> RunInfo:
    return RunInfo(
        run_id=manifest.run_id,
        host=manifest.host,
        model=manifest.model,
        workload=manifest.workload,
        token_scale=manifest.flags.get("scale_tokens", 1.0),
        arrival=manifest.arrival,
        target_qps=manifest.target_qps,
        sessions_in_flight=manifest.flags.get("sessions_in_flight"),
        started_at=manifest.started_at,
        finished_at=finished,
        workers=manifest.workers,
        load_generator_cpu_max_percent=manifest.load_generator_cpu_max_percent,
        cpu_steal_percent=manifest.cpu_steal_percent,
        load_generator_lag_max_ms=lag_max_ms,
        goodput_slo=manifest.goodput_slo,
        server=manifest.server,
        access=manifest.access,
        warnings=warnings,
    )


def _request_counts(judged: pd.DataFrame, *, ok: int, sent: int, warmup: int) -> RequestCounts:
    """The judged requests by status; `failed` what the target is judged to have failed (errors; the
    requests it had not finished when the drain ended are `unfinished`)."""
    status = judged.status
    return RequestCounts(
        scheduled=len(judged),
        sent=sent,
        ok=ok,
        failed=int((status == "failed").sum()),
        unfinished=int((status == "unfinished").sum()),
        cancelled=int((status == "cancelled").sum()),
        abandoned=int((status == "abandoned").sum()),
        not_sent=int((status == "not_sent").sum()),
        lost=int((status == "lost").sum()),
        warmup=warmup,
    )


def _latency_summary(ok: pd.DataFrame, sent: pd.Series, itl: Percentiles, *, reasoned: bool) -> LatencySummary:
    return LatencySummary(
        ttft=percentiles(ok.ttft_ms),
        itl=itl,
        tpot=percentiles(ok.tpot_ms),
        e2e=percentiles(ok.e2e_ms),
        schedule_delay=percentiles(sent),
        ttft_from_schedule=percentiles(ok.ttft_ms + ok.schedule_delay_ms),
        e2e_from_schedule=percentiles(ok.e2e_ms + ok.schedule_delay_ms),
        ttfo=percentiles(ok.ttfo_ms) if reasoned else None,
    )


def _throughput(judged: pd.DataFrame, ok: pd.DataFrame, good: pd.Series | None, elapsed: float) -> Throughput:
    output_tokens = float(ok.output_tokens.fillna(0).sum())
    prompt_tokens = float(ok.prompt_tokens.fillna(0).sum())
    return Throughput(
        requests_per_s=len(ok) / elapsed,
        output_tokens_per_s=output_tokens / elapsed,
        total_tokens_per_s=(output_tokens + prompt_tokens) / elapsed,
        goodput=goodput(judged[["status", "output_tokens"]], good, elapsed),
    )


def _failure_summary(judged: pd.DataFrame) -> FailureSummary:
    """Failed and unfinished requests by category, with one message of each."""
    failed = judged.loc[
        judged.status.isin(["failed", "unfinished"]).to_numpy(dtype=bool), ["error_category", "error_message"]
    ]
    categories = failed.error_category.value_counts().to_dict()
    examples = failed.drop_duplicates("error_category").set_index("error_category").error_message.to_dict()
    return FailureSummary(
        by_category={str(k): int(v) for k, v in categories.items()},
        oom_family=int(sum(v for k, v in categories.items() if k in OOM_FAMILY)),
        examples={str(k): str(v) for k, v in examples.items()},
    )


def _worker_summaries(df: pd.DataFrame, manifest: RunManifest) -> list[WorkerSummary]:
    """Each worker of a distributed run: its records counted (the whole run) beside what the master saw."""
    if not manifest.fleet:
        return []
    frame = pd.DataFrame({
        "worker": df.worker.to_numpy(),
        "sent": df.sent_at.notna().to_numpy(dtype=bool),  # its lost requests in flight too: the worker sent them
        "ok": (df.status == "ok").to_numpy(dtype=bool),
        "failed": df.status.isin(["failed", "unfinished"]).to_numpy(dtype=bool),
    })  # fmt: skip
    counts = frame.groupby("worker").sum().reindex([w.index for w in manifest.fleet], fill_value=0)
    return [
        WorkerSummary.model_validate(worker.model_dump() | {k: int(counts[k][worker.index]) for k in counts.columns})
        for worker in manifest.fleet
    ]


def had_reasoning(df: pd.DataFrame) -> bool:
    """Whether any successful request thought before answering: only then do reports show TTFO and
    reasoning (without reasoning TTFO is TTFT, a figure told twice)."""
    ok = (df.status == "ok").to_numpy(dtype=bool)
    return bool((df.reasoning_tokens.to_numpy(dtype=float)[ok] > 0).any())


def _reasoning(ok: pd.DataFrame) -> ReasoningSummary:
    """Reasoning and answer tokens per successful request, and how many counts were the client's."""
    thought = ok.reasoning_tokens.fillna(0).astype(float)
    return ReasoningSummary(
        requests=int((thought > 0).sum()),
        reasoning_tokens=token_percentiles(thought),
        reasoning_tokens_mean=float(thought.mean()),
        answer_tokens=token_percentiles(ok.output_tokens.astype(float) - thought),
        counted=int(ok.reasoning_tokens_counted[thought > 0].fillna(False).astype(bool).sum()),
    )


def _output_lengths(ok: pd.DataFrame) -> OutputLengths | None:
    """The requested exact lengths of the successful requests that had one, against what they got."""
    asked = ok[ok.requested_output_tokens.notna()]
    if asked.empty:
        return None
    return OutputLengths(
        requested=len(asked),
        forced=int(asked.output_tokens_forced.fillna(False).astype(bool).sum()),
        requested_tokens=token_percentiles(asked.requested_output_tokens.astype(float)),
        output_tokens=token_percentiles(asked.output_tokens.astype(float)),
    )


@dataclass(frozen=True)
class RunItl:
    """The gaps of a run's successful requests in one pass over requests.parquet: a histogram per
    (window of send time, stage) that holds any, so the report's chart sums a window's, the summary
    a stage's and the judged stages' (a window meets one stage or two: few more histograms than windows)."""

    window_s: float
    window: np.ndarray  # of each histogram
    stage: np.ndarray  # of each histogram: its index in the manifest's stages
    judged_stage: np.ndarray  # of each stage: whether it is judged
    histograms: Histograms

    @classmethod
    def count(cls, records: RunRecords, manifest: RunManifest, window_s: float = math.inf) -> RunItl:
        frame = records.frame
        names = [s.name for s in manifest.stages]
        stage = pd.Categorical(frame.stage, categories=names).codes.astype(np.int64)  # -1: no stage of the plan
        ok = (frame.status == "ok").to_numpy(dtype=bool) & (stage >= 0)
        since = frame.sent_at.to_numpy(dtype=float) - manifest.started_at
        window = np.nan_to_num(np.clip(np.floor(since / window_s), 0, None)).astype(np.int64)
        pair = window * len(names) + stage
        pairs = np.flatnonzero(np.bincount(pair[ok]))  # those that hold a request, ascending
        groups = np.where(ok, np.searchsorted(pairs, pair), 0)
        judged = np.isin(names, [s.name for s in manifest.judged_stages])
        histograms = records.itl(ok, groups, len(pairs))
        return cls(window_s, pairs // len(names), pairs % len(names), judged, histograms)

    @property
    def judged(self) -> Percentiles:
        return self.histograms.percentiles(self.judged_stage[self.stage])

    def stage_p50(self) -> list[float | None]:
        """Each stage's median gap, in the manifest's order."""
        return [self.histograms.percentiles(self.stage == i).p50 for i in range(len(self.judged_stage))]

    def by_window(self) -> np.ndarray:
        """Counts per bucket of each window (rows), warm-up included."""
        counts = np.zeros((int(self.window.max(initial=0)) + 1, BUCKETS), dtype=np.int64)
        np.add.at(counts, self.window, self.histograms.counts)
        return counts


def summarize_run(run: Run, window_s: float = math.inf) -> tuple[Summary, RunItl]:
    """The run's summary and the ITL histograms of `window_s` windows it was computed from (the
    HTML's latency chart draws them): one pass over the gaps for both."""
    records, manifest = run.records, run.manifest
    itl = RunItl.count(records, manifest, window_s)
    summary = summarize(
        records.frame, manifest, itl=itl.judged, stage_itl_p50=itl.stage_p50(), server=run.server,
        good=good_requests(records, manifest.goodput_slo), workload_prefix=sent_reusable_prefix(run),
    )  # fmt: skip
    summary.cached_share_by_conversation = _cached_by_conversation(run)
    if run.cut_off is not None:
        summary.run.warnings.insert(0, run.cut_off)
    if summary.server is not None and summary.server.spec_decode is not None and _synthetic(run):
        summary.run.warnings.append(SPECULATION_ON_SYNTHETIC_TEXT)
    if manifest.replicas:  # over sessions: their ids are read apart from the frame
        judged = records.frame.stage.isin({s.name for s in manifest.judged_stages}).to_numpy(dtype=bool)
        columns = ["host", "status", "ttft_ms", "tpot_ms"]
        sessions = records.frame.loc[judged, columns].assign(session_id=records.session_ids()[judged].to_numpy())
        summary.run.warnings.extend(slower_replicas(sessions))
        summary.run.warnings.extend(fuller_replicas(summary.server.replicas if summary.server is not None else []))
    return summary, itl


def _cached_by_conversation(run: Run) -> ShareSpread | None:
    """Each conversation's share of prompt tokens the server says it served from cache (judged successful
    requests whose usage gives cached_tokens), spread over the conversations; None when no usage says."""
    frame = run.records.frame
    judged = frame.stage.isin({s.name for s in run.manifest.judged_stages}) & (frame.status == "ok")
    told = (judged & frame.cached_tokens.notna() & (frame.prompt_tokens > 0)).to_numpy(dtype=bool)
    if not told.any():
        return None
    ids = run.records.session_ids()[told]
    by_name = ConversationCodes().of([str(name) for name in ids.cat.categories])  # per distinct id, not per row
    rows = frame.loc[told, ["cached_tokens", "prompt_tokens"]].assign(conversation=by_name[ids.cat.codes.to_numpy()])
    sums = rows.groupby("conversation")[["cached_tokens", "prompt_tokens"]].sum()
    return ShareSpread.of((sums.cached_tokens / sums.prompt_tokens).to_numpy(dtype=float))


def _synthetic(run: Run) -> bool:
    """Whether the run's workload is made-up text (`workload synth`), not prompts from a log."""
    workload = run.workload()
    source = workload.spec.source if workload is not None else None
    return source is not None and source.format.startswith("synthetic")


def sent_reusable_prefix(run: Run) -> ReusablePrefix | None:
    """The share of prompt tokens an infinite prefix cache could serve, over the prompts the run sent
    (warm-up ones fill the cache) and counted over the judged stages', as the server's hit rate is;
    rendered with ChatML (its tokens are prefix the server reuses; the served model's own template
    is not recorded) in 16-token blocks, vLLM's default, and in the server's own blocks where its usage
    shows them (`server_block_size`). None without the workload file (moved, or the report rebuilt
    elsewhere) or when the run sent what it does not hold."""
    workload = run.workload()
    if workload is None:
        return None
    frame = run.records.frame
    sent = ((frame.status != "not_sent") & frame.sent_at.notna()).to_numpy(dtype=bool)
    rows = frame.loc[sent, ["turn", "sent_at", "output_tokens"]].assign(
        session_id=run.records.session_ids()[sent].to_numpy(),
        counted=frame.stage[sent].isin([stage.name for stage in run.manifest.judged_stages]).to_numpy(dtype=bool),
    )
    bust_run = run.manifest.run_id if run.manifest.flags.get("cache_bust") else None
    server_block = server_block_size(frame.cached_tokens.to_numpy())
    prefix = sent_prefix(workload, rows, template="chatml", bust_run=bust_run, server_block=server_block)
    return prefix if isinstance(prefix, ReusablePrefix) else None
