"""From raw records to summary.json and report.md.

Every figure is computed from the raw per-request records (numpy's linear-interpolation
percentiles), never from Locust's statistics, which keep response times to two significant
digits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from llmload.goodput import good_requests
from llmload.models import (
    OOM_FAMILY,
    FailureSummary,
    Goodput,
    LatencySummary,
    Percentiles,
    RequestCounts,
    RunInfo,
    RunManifest,
    ServerSummary,
    StageSummary,
    Summary,
    Throughput,
    TokenPercentiles,
    TokenSummary,
    TurnSummary,
    Verdict,
)
from llmload.observe import SERVER_FILE, server_summary
from llmload.records import RunRecords
from llmload.sketch import METHOD as ITL_METHOD
from llmload.sketch import Histograms

MANIFEST_FILE = "run.json"
SUMMARY_FILE = "summary.json"
REPORT_FILE = "report.md"
VERDICT_FILE = "verdict.json"
CPU_WARNING_PERCENT = 60.0
STEAL_WARNING_PERCENT = 2.0
_QUANTILES = (50, 90, 95, 99, 99.9)
SHORTFALL_RATIO = 0.98  # a stage must send this share of its target's requests
SHORTFALL_DELAY_MS = 100.0  # schedule delay p99 beyond this means the generator fell behind
TURN_MIX_DEEPEST = 8


def percentiles(values: Sequence[float] | np.ndarray | pd.Series) -> Percentiles:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return Percentiles()
    p50, p90, p95, p99, p999 = np.percentile(arr, _QUANTILES).tolist()
    return Percentiles(
        p50=p50, p90=p90, p95=p95, p99=p99, p999=p999, mean=float(arr.mean()), max=float(arr.max()), count=arr.size
    )


def _token_percentiles(values: pd.Series) -> TokenPercentiles:
    p = percentiles(values)
    return TokenPercentiles(p50=p.p50, p95=p.p95, p99=p.p99, max=p.max)


def _quantile(values: pd.Series, q: float) -> float | None:
    arr = values.dropna().to_numpy(dtype=float)
    return float(np.percentile(arr, q)) if arr.size else None


def _turn_mix(turns: pd.Series) -> dict[str, float]:
    """Share of requests by turn number (1-based), deep turns pooled as "8+"."""
    if turns.empty:
        return {}
    numbers = (turns.astype(int) + 1).clip(upper=TURN_MIX_DEEPEST)
    shares = numbers.value_counts(normalize=True).sort_index()
    return {(f"{n}+" if n == TURN_MIX_DEEPEST else str(n)): round(float(v), 4) for n, v in shares.items()}


def goodput(rows: pd.DataFrame, good: pd.Series | None, seconds: float) -> Goodput | None:
    """Goodput of `rows` (status and output_tokens; None without an SLO): the good ones per second,
    and their share of the answered ones; cancelled and never-sent requests are in neither."""
    if good is None:
        return None
    answered = rows.status.isin(["ok", "failed"]).to_numpy(dtype=bool)
    met = answered & good.loc[rows.index].to_numpy(dtype=bool)
    return Goodput(
        requests_per_s=int(met.sum()) / seconds,
        output_tokens_per_s=float(rows.output_tokens[met].fillna(0).sum()) / seconds,
        slo_attainment=int(met.sum()) / int(answered.sum()) if answered.any() else None,
    )


def _stage_summaries(df: pd.DataFrame, manifest: RunManifest, good: pd.Series | None) -> list[StageSummary]:
    """Per stage: target, offered (scheduled) and achieved (sent in the stage's window) rates, goodput
    (of the same window), and what the stage carried (turn depths, prompt lengths). Shortfall is
    judged against the target. Rows are selected with the few columns used: a run can hold 10M records."""
    out = []
    sent_at = df.sent_at.to_numpy(dtype=float)
    is_sent = (df.status != "not_sent").to_numpy(dtype=bool)
    for stage in manifest.stages:
        mine = (df.stage == stage.name).to_numpy(dtype=bool)
        rows = df.loc[mine, ["status", "turn", "schedule_delay_ms", "ttft_ms", "e2e_ms", "prompt_tokens"]]
        window_start = manifest.started_at + stage.start_s
        in_window = is_sent & (sent_at >= window_start) & (sent_at < window_start + stage.duration_s)
        sent_in_window = int(in_window.sum())
        delay_p99 = _quantile(rows.schedule_delay_ms, 99)
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
                cancelled=int((rows.status == "cancelled").sum()),
                not_sent=int((rows.status == "not_sent").sum()),
                schedule_delay_p99_ms=delay_p99,
                ttft_p50_ms=_quantile(ok.ttft_ms, 50),
                ttft_p99_ms=_quantile(ok.ttft_ms, 99),
                e2e_p99_ms=_quantile(ok.e2e_ms, 99),
                prompt_tokens_p50=_quantile(ok.prompt_tokens, 50),
                prompt_tokens_p99=_quantile(ok.prompt_tokens, 99),
                turn_mix=_turn_mix(rows.turn[rows.status != "not_sent"]),
                warmup=stage.warmup,
                goodput=goodput(df.loc[in_window, ["status", "output_tokens"]], good, stage.duration_s),
                shortfall=bool(sent_in_window < needed or (delay_p99 or 0) > SHORTFALL_DELAY_MS),
            )
        )
    return out


def shortfall_reason(stage: StageSummary) -> str:
    """Why a stage is short, with the numbers."""
    return (
        f"stage {stage.name}: achieved {stage.achieved_qps:.2f} of {stage.target_qps:.2f} req/s target"
        f" ({stage.achieved_qps / stage.target_qps:.1%}; limit ≥ {SHORTFALL_RATIO:.0%}), offered"
        f" {stage.offered_qps:.2f}, schedule delay p99 {stage.schedule_delay_p99_ms or 0:.0f} ms"
        f" (limit {SHORTFALL_DELAY_MS:g} ms)"
    )


def _turn_summaries(df: pd.DataFrame) -> list[TurnSummary]:
    out = []
    sent = df.loc[(df.status != "not_sent").to_numpy(dtype=bool), ["turn", "status", "prompt_tokens", "ttft_ms"]]
    for turn, rows in sent.groupby("turn"):
        ok = rows[rows.status == "ok"]
        out.append(
            TurnSummary(
                turn=int(str(turn)) + 1,
                requests=len(rows),
                prompt_tokens_p50=_quantile(ok.prompt_tokens, 50),
                prompt_tokens_p99=_quantile(ok.prompt_tokens, 99),
                ttft_p50_ms=_quantile(ok.ttft_ms, 50),
                ttft_p99_ms=_quantile(ok.ttft_ms, 99),
            )
        )
    return out


def summarize(df: pd.DataFrame, manifest: RunManifest, *, itl: Percentiles, good: pd.Series | None = None) -> Summary:
    """The run's summary. The stage table covers every stage; every other figure leaves out the
    warm-up, which is reported but never judged. `itl`: of the gaps of the same requests as TTFT
    (they are streamed apart from `df`: see summarize_run); `good`: which records met the goodput
    SLO (llmload.goodput.good_requests), None without one."""
    stages = _stage_summaries(df, manifest, good)
    in_warmup = df.stage.isin({s.name for s in manifest.stages if s.warmup})
    if in_warmup.any():
        df = df[~in_warmup]
    # only the columns used: a run can hold 10M records, each copy of the frame a gigabyte
    ok = df.loc[
        (df.status == "ok").to_numpy(dtype=bool),
        ["ttft_ms", "tpot_ms", "e2e_ms", "schedule_delay_ms", "prompt_tokens", "output_tokens", "usage_from_server"],
    ]
    sent = df.schedule_delay_ms[(df.status != "not_sent").to_numpy(dtype=bool)]
    failed = df.loc[(df.status == "failed").to_numpy(dtype=bool), ["error_category", "error_message"]]
    finished = manifest.finished_at or float(df.finished_at.max() if len(sent) else manifest.started_at)
    # over the judged stages (or less, when stopped early): warm-up, start-up and drain would make
    # throughput depend on how a run began and wound down rather than on the target
    judged_start = manifest.started_at + sum(s.duration_s for s in manifest.stages if s.warmup)
    elapsed = max(1e-9, min(finished, manifest.started_at + manifest.stages[-1].end_s) - judged_start)
    output_tokens = float(ok.output_tokens.fillna(0).sum())
    prompt_tokens = float(ok.prompt_tokens.fillna(0).sum())
    categories = failed.error_category.value_counts().to_dict()
    examples = failed.drop_duplicates("error_category").set_index("error_category").error_message.to_dict()
    warnings = [f"{shortfall_reason(s)}: the target was not offered the load asked for" for s in stages if s.shortfall]
    cpu = manifest.load_generator_cpu_max_percent
    if cpu is not None and cpu > CPU_WARNING_PERCENT:
        warnings.append(
            f"load generator CPU reached {cpu:.0f}% (> {CPU_WARNING_PERCENT:.0f}%): timings may include client delay;"
            " add Locust workers (--processes)"
        )
    steal = manifest.cpu_steal_percent
    if steal is not None and steal > STEAL_WARNING_PERCENT:
        warnings.append(
            f"the hypervisor took {steal:.1f}% of the load generator machine's CPU"
            f" (steal > {STEAL_WARNING_PERCENT:.0f}%): latency tails include descheduled vCPUs;"
            " repeat on a quieter or dedicated machine"
        )
    if len(ok) and not ok.usage_from_server.all():
        warnings.append("some responses carried no usage: their token counts were counted client-side")
    return Summary(
        run=RunInfo(
            run_id=manifest.run_id,
            host=manifest.host,
            model=manifest.model,
            workload=manifest.workload,
            arrival=manifest.arrival,
            target_qps=manifest.target_qps,
            started_at=manifest.started_at,
            finished_at=finished,
            workers=manifest.workers,
            load_generator_cpu_max_percent=cpu,
            cpu_steal_percent=steal,
            goodput_slo=manifest.goodput_slo,
            warnings=warnings,
        ),
        requests=RequestCounts(
            scheduled=len(df),
            sent=len(sent),
            ok=len(ok),
            failed=len(failed),
            cancelled=int((df.status == "cancelled").sum()),
            not_sent=int((df.status == "not_sent").sum()),
            warmup=int(in_warmup.sum()),
        ),
        latency_ms=LatencySummary(
            ttft=percentiles(ok.ttft_ms),
            itl=itl,
            tpot=percentiles(ok.tpot_ms),
            e2e=percentiles(ok.e2e_ms),
            schedule_delay=percentiles(sent),
            ttft_from_schedule=percentiles(ok.ttft_ms + ok.schedule_delay_ms),
            e2e_from_schedule=percentiles(ok.e2e_ms + ok.schedule_delay_ms),
        ),
        throughput=Throughput(
            requests_per_s=len(ok) / elapsed,
            output_tokens_per_s=output_tokens / elapsed,
            total_tokens_per_s=(output_tokens + prompt_tokens) / elapsed,
            goodput=goodput(df[["status", "output_tokens"]], good, elapsed),
        ),
        tokens=TokenSummary(prompt=_token_percentiles(ok.prompt_tokens), output=_token_percentiles(ok.output_tokens)),
        stages=stages,
        turns=_turn_summaries(df),
        failures=FailureSummary(
            by_category={str(k): int(v) for k, v in categories.items()},
            oom_family=int(sum(v for k, v in categories.items() if k in OOM_FAMILY)),
            examples={str(k): str(v) for k, v in examples.items()},
        ),
    )


@dataclass(frozen=True)
class RunItl:
    """The gaps of a run's successful requests in one pass over requests.parquet: a histogram per
    window of send time (the report's chart), judged and warm-up apart (the summary pools the judged)."""

    window_s: float
    windows: int
    histograms: Histograms  # group w: window w of the judged stages; windows + w: of the warm-up

    @classmethod
    def count(cls, records: RunRecords, manifest: RunManifest, window_s: float = math.inf) -> RunItl:
        frame = records.frame
        ok = (frame.status == "ok").to_numpy(dtype=bool)
        since = frame.sent_at.to_numpy(dtype=float) - manifest.started_at
        window = np.nan_to_num(np.clip(np.floor(since / window_s), 0, None)).astype(np.int64)
        windows = int(window[ok].max()) + 1 if ok.any() else 1
        warmup = frame.stage.isin([s.name for s in manifest.stages if s.warmup]).to_numpy(dtype=bool)
        return cls(window_s, windows, records.itl(ok, window + windows * warmup, 2 * windows))

    @property
    def judged(self) -> Percentiles:
        return self.histograms.percentiles(slice(0, self.windows))

    def by_window(self) -> np.ndarray:
        """Counts per bucket of each window (rows), warm-up included."""
        counts: np.ndarray = self.histograms.counts[: self.windows] + self.histograms.counts[self.windows :]
        return counts


def summarize_run(records: RunRecords, manifest: RunManifest) -> Summary:
    """summarize() of a run's records, the ITL gaps streamed from requests.parquet."""
    good = good_requests(records, manifest.goodput_slo)
    return summarize(records.frame, manifest, itl=RunItl.count(records, manifest).judged, good=good)


def fmt(value: float | None, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def percent(fraction: float | None, digits: int = 0) -> str:
    """A 0..1 share as a percent."""
    return "–" if fraction is None else f"{100 * fraction:.{digits}f}%"


def _gpu_lines(server: ServerSummary | None) -> list[str]:
    """The GPU table of report.md; nothing for a run that read no GPU."""
    if server is None or not server.gpus:
        return []
    lines = [
        "",
        "## GPU",
        "",
        "| GPU | memory used max | MiB used max | MiB total | utilisation mean % | utilisation max % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for g in server.gpus:
        lines.append(
            f"| {g.gpu} | {percent(g.memory_usage_max)} | {fmt(g.memory_used_max_mib, 0)} "
            f"| {fmt(g.memory_total_mib, 0)} | {fmt(g.utilization_mean_percent, 0)} "
            f"| {fmt(g.utilization_max_percent, 0)} |"
        )
    return [*lines, "", "Over the whole run, warm-up included, sampled with the server's metrics."]


def turn_depths(mix: dict[str, float]) -> str:
    """Turn mix as "turn 1 / 2 / 3 / 4 and deeper" percentages."""
    if not mix:
        return "–"

    def share(key: str) -> float:
        return mix.get(key, 0.0)

    deep = sum(v for k, v in mix.items() if k not in ("1", "2", "3"))
    return "/".join(f"{100 * v:.0f}" for v in (share("1"), share("2"), share("3"), deep))


def _goodput_markdown(summary: Summary) -> list[str]:
    """The goodput section: the SLO rule, the run's figure and each stage's (none without an SLO)."""
    slo, overall = summary.run.goodput_slo, summary.throughput.goodput
    if slo is None or overall is None:
        return []
    lines = [
        "",
        "## Goodput",
        "",
        f"Requests meeting every SLO ({slo.describe()}): {overall.requests_per_s:.2f} req/s, "
        f"{overall.output_tokens_per_s:,.0f} output tok/s, {percent(overall.slo_attainment, 1)} of the answered"
        " requests. Failed requests count against it; cancelled ones are left out.",
        "",
        "| stage | achieved req/s | goodput req/s | goodput output tok/s | SLO met |",
        "|---|---:|---:|---:|---:|",
    ]
    for s in summary.stages:
        if s.goodput is not None:
            name = f"{s.name} (not judged)" if s.warmup else s.name
            lines.append(
                f"| {name} | {s.achieved_qps:.2f} | {s.goodput.requests_per_s:.2f} "
                f"| {s.goodput.output_tokens_per_s:,.0f} | {percent(s.goodput.slo_attainment, 1)} |"
            )
    return lines


def render_markdown(summary: Summary) -> str:
    run, req, lat = summary.run, summary.requests, summary.latency_ms
    lines = [
        f"# llmload run `{run.run_id}`",
        "",
        f"Target `{run.host}` (model `{run.model or '?'}`), workload `{run.workload}`, {run.arrival} arrivals, "
        f"target {run.target_qps:g} req/s, {run.workers} load-generator process(es), "
        f"{run.finished_at - run.started_at:.0f} s.",
        "",
    ]
    if summary.verdict is not None:
        verdict = "PASS" if summary.verdict.passed else "FAIL"
        lines += [f"**Verdict: {verdict}**", "", *[f"- {r}" for r in summary.verdict.reasons], ""]
    lines += [
        "## Requests",
        "",
        "| scheduled | sent | ok | failed | cancelled | not sent | OOM family | warm-up (not judged) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {req.scheduled} | {req.sent} | {req.ok} | {req.failed} | {req.cancelled} | {req.not_sent} "
        f"| {summary.failures.oom_family} | {req.warmup} |",
        "",
        "Cancelled requests were cut by the operator or the drain timeout: not failures, not in the error rate."
        " Warm-up requests are counted apart and left out of every figure but the stage table.",
        "",
        "## Latency (ms, successful requests, from send)",
        "",
        "| metric | p50 | p90 | p95 | p99 | p99.9 | mean | max | n |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in (
        ("TTFT", lat.ttft),
        ("ITL", lat.itl),
        ("TPOT", lat.tpot),
        ("E2E", lat.e2e),
        ("schedule delay", lat.schedule_delay),
        ("TTFT from schedule", lat.ttft_from_schedule),
        ("E2E from schedule", lat.e2e_from_schedule),
    ):
        cells = " | ".join(fmt(v) for v in (p.p50, p.p90, p.p95, p.p99, p.p999, p.mean, p.max))
        lines.append(f"| {name} | {cells} | {p.count} |")
    lines += ["", f"ITL: every gap of every successful request, pooled; {ITL_METHOD}."]
    tp, tok = summary.throughput, summary.tokens
    lines += [
        "",
        f"Throughput: {tp.requests_per_s:.2f} req/s, {tp.output_tokens_per_s:,.0f} output tok/s, "
        f"{tp.total_tokens_per_s:,.0f} total tok/s. Prompt tokens p50/p95/p99/max: "
        f"{fmt(tok.prompt.p50, 0)}/{fmt(tok.prompt.p95, 0)}/{fmt(tok.prompt.p99, 0)}/{fmt(tok.prompt.max, 0)}; "
        f"output: {fmt(tok.output.p50, 0)}/{fmt(tok.output.p95, 0)}/{fmt(tok.output.p99, 0)}/"
        f"{fmt(tok.output.max, 0)}.",
        *_gpu_lines(summary.server),
        "",
        "## Stages",
        "",
        "| stage | target req/s | offered | achieved | scheduled | ok | failed | cancelled | not sent | delay p99 ms "
        "| TTFT p50 | TTFT p99 | E2E p99 | prompt tok p50 | prompt tok p99 | turns 1/2/3/4+ % | shortfall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for s in summary.stages:
        name = f"{s.name} (not judged)" if s.warmup else s.name
        lines.append(
            f"| {name} | {s.target_qps:.2f} | {s.offered_qps:.2f} | {s.achieved_qps:.2f} | {s.scheduled} | {s.ok} "
            f"| {s.failed} | {s.cancelled} | {s.not_sent} | {fmt(s.schedule_delay_p99_ms)} | {fmt(s.ttft_p50_ms)} "
            f"| {fmt(s.ttft_p99_ms)} | {fmt(s.e2e_p99_ms)} | {fmt(s.prompt_tokens_p50, 0)} "
            f"| {fmt(s.prompt_tokens_p99, 0)} | {turn_depths(s.turn_mix)} | {'**yes**' if s.shortfall else 'no'} |"
        )
    if any(s.warmup for s in summary.stages):
        lines += ["", "The warm-up fills sessions to every depth; it is reported, and left out of every other figure."]
    lines += _goodput_markdown(summary)
    lines += [
        "",
        "## By turn (history growth)",
        "",
        "| turn | requests | prompt tokens p50 | prompt tokens p99 | TTFT p50 ms | TTFT p99 ms |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for t in summary.turns:
        lines.append(
            f"| {t.turn} | {t.requests} | {fmt(t.prompt_tokens_p50, 0)} | {fmt(t.prompt_tokens_p99, 0)} "
            f"| {fmt(t.ttft_p50_ms)} | {fmt(t.ttft_p99_ms)} |"
        )
    lines += ["", "## Failures", ""]
    if summary.failures.by_category:
        lines += ["| category | count | example |", "|---|---:|---|"]
        for category, count in sorted(summary.failures.by_category.items(), key=lambda kv: -kv[1]):
            example = summary.failures.examples.get(category, "").replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {category} | {count} | {example[:160]} |")
    else:
        lines.append("None.")
    if run.warnings:
        lines += ["", "## Warnings", "", *[f"- {w}" for w in run.warnings]]
    return "\n".join(lines) + "\n"


def load_manifest(run_dir: Path) -> RunManifest:
    return RunManifest.model_validate_json((run_dir / MANIFEST_FILE).read_bytes())


def write_report(run_dir: Path) -> Summary:
    """(Re)build summary.json, report.md and report.html of a run directory from what the run wrote:
    its manifest, records, server samples and verdict; and requests.parquet when it is not fresh."""
    from llmload.report_html import chart_window_s, render_html  # it builds on this module

    manifest = load_manifest(run_dir)
    records = RunRecords.load(run_dir)
    finished = manifest.finished_at or float(records.frame.finished_at.max())
    itl = RunItl.count(records, manifest, chart_window_s(manifest, finished))  # one pass: summary and chart
    summary = summarize(records.frame, manifest, itl=itl.judged, good=good_requests(records, manifest.goodput_slo))
    summary.server = server_summary(run_dir / SERVER_FILE)
    if (run_dir / VERDICT_FILE).is_file():
        summary.verdict = Verdict.model_validate_json((run_dir / VERDICT_FILE).read_bytes())
    (run_dir / SUMMARY_FILE).write_bytes(orjson.dumps(summary.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    (run_dir / REPORT_FILE).write_text(render_markdown(summary))
    render_html(run_dir, records, itl)
    return summary
