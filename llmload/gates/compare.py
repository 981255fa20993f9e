"""`llmload compare BASELINE CURRENT`: a regression gate between two runs that does not cry wolf.

Two runs of the same plan never measure the same numbers, so a metric is called a regression
only when the whole bootstrap confidence interval of its degradation lies beyond its limit.
The interval comes from resampling blocks of consecutive requests (an ITL resample pools the gaps
of the requests drawn): each run's own for the rates; for a latency percentile, blocks a few
answers long drawn from one pool of both runs' (the current's scaled to the baseline's median), so
it is as wide as two runs of one server land apart, their queueing episodes and slow drifts
included. Limits and method: docs/gates.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from llmload import rundir
from llmload.errors import InputError
from llmload.models import ANSWERED_STATUSES, GoodputSLO, Percentiles, RequestCounts, RunManifest, Strict, Summary
from llmload.report.goodput import good_requests
from llmload.report.summary import summarize
from llmload.stats.sketch import MIDDLES, Histograms, buckets, quantiles

LATENCY_METRICS = ("ttft", "ttfo", "itl", "tpot", "e2e")
PER_REQUEST_LATENCIES = ("ttft", "ttfo", "tpot", "e2e")  # one value per request (ITL: its gaps)
# RunSample.blocks columns that are counted per second of the plan
RATE_COLUMNS = {"requests_per_s": 0, "output_tokens_per_s": 1, "goodput_requests_per_s": 4,
                "goodput_output_tokens_per_s": 5}  # fmt: skip
RATE_ROWS = (
    ("requests_per_s", "throughput", "req/s"),
    ("output_tokens_per_s", "output", "tok/s"),
    ("goodput_requests_per_s", "goodput", "req/s"),
    ("goodput_output_tokens_per_s", "goodput output", "tok/s"),
)
# per-token costs: the hold's energy (J) or price ($ ×1e6) a second over its output tok/s, so they take
# output tok/s's resamples; the counters and prices themselves are read, not sampled
COST_ROWS = (("joules_per_output_token", "energy_j", 1.0, "J per output token", "J"),
             ("usd_per_1m_output_tokens", "usd", 1e6, "$ per 1M output tokens", "$"))  # fmt: skip
LATENCY_PERCENTILES = (50, 95, 99)
BOOTSTRAP_BLOCKS = 500  # resampled units: runs of consecutive requests (single requests in shorter runs)
# a latency's blocks each last about LATENCY_BLOCK_SPANS E2E p90s, so that a queue that forms and clears
# falls in one (at least MIN_LATENCY_BLOCKS of them): with 500 blocks of 0.7 s, same-server soak pairs were
# called a TTFT p99 regression in 12% of 200 (docs/gates.md)
LATENCY_BLOCK_SPANS = 5.0
MIN_LATENCY_BLOCKS = 10

# --------------------------------------------------------------------------- thresholds


class LatencyRise(Strict):
    """Relative rise a latency percentile may show before it is a regression (0.10 = 10%)."""

    p50: NonNegativeFloat = 0.10
    p95: NonNegativeFloat = 0.10
    p99: NonNegativeFloat = 0.15


class LatencyFloorMs(Strict):
    """Absolute rise (ms) below which a latency change is never a regression: fast targets jitter."""

    ttft: NonNegativeFloat = 5.0
    ttfo: NonNegativeFloat = 5.0
    itl: NonNegativeFloat = 1.0
    tpot: NonNegativeFloat = 1.0
    e2e: NonNegativeFloat = 5.0


class Bootstrap(Strict):
    resamples: PositiveInt = 1000
    confidence: float = Field(default=0.95, gt=0, lt=1)
    seed: int = 0


class Thresholds(Strict):
    """What `llmload compare` tolerates; a YAML file overrides any subset (unknown keys fail)."""

    latency_rise: LatencyRise = LatencyRise()
    latency_floor_ms: LatencyFloorMs = LatencyFloorMs()
    throughput_drop: NonNegativeFloat = Field(default=0.05, description="relative drop of req/s and output tok/s")
    error_rate_rise: NonNegativeFloat = Field(
        default=0.01, description="rise of (failed + unfinished) / answered, as a fraction"
    )
    oom_family_rise: NonNegativeInt = Field(default=0, description="more oom+engine_dead+server_down failures")
    cost_rise: NonNegativeFloat = Field(
        default=0.05, description="relative rise of J per output token and of $ per 1M output tokens"
    )
    prefix_cache_hit_rate_drop: NonNegativeFloat = Field(
        default=0.10, description="drop of the prefix-cache hit rate, as a fraction (0.10 = 10 points)"
    )
    bootstrap: Bootstrap = Bootstrap()


# --------------------------------------------------------------------------- bootstrap


@dataclass(frozen=True)
class Blocked:
    """One latency metric of a run: a histogram per block (llmload.sketch), trimmed to the buckets used."""

    first: int  # bucket of column 0
    counts: np.ndarray  # (blocks, buckets), float for BLAS products with resample counts

    @classmethod
    def of(cls, histograms: Histograms) -> Blocked:
        used = np.flatnonzero(histograms.counts.sum(axis=0))
        first, end = (int(used[0]), int(used[-1]) + 1) if used.size else (0, 1)
        return cls(first, histograms.counts[:, first:end].astype(float))

    @classmethod
    def of_values(cls, values: np.ndarray, block: np.ndarray, blocks: int) -> Blocked:
        """One value per record (TTFT, TPOT, E2E; NaN: none), each in its record's block."""
        keep = ~np.isnan(values)
        index, owner = buckets(values[keep]), block[keep]
        first = int(index.min()) if index.size else 0
        width = int(index.max()) + 1 - first if index.size else 1
        counts = np.bincount(owner * width + index - first, minlength=blocks * width)
        return cls(first, counts.reshape(blocks, width).astype(float))


@dataclass(frozen=True)
class RunSample:
    """A run reduced to what is resampled: per-request vectors and each latency metric pooled."""

    name: str
    manifest: RunManifest
    summary: Summary
    requests: int
    plan_s: float  # the judged stages' total duration: warm-up, start-up and drain vary from run to run
    # per judged block: ok, output tokens of the ok, failed, ok + failed, and with a goodput SLO the
    # requests meeting it and their output tokens (blocks × 4 or 6)
    blocks: np.ndarray
    latency: dict[str, Blocked]
    goodput_slo: GoodputSLO | None = None

    @property
    def throughput(self) -> dict[str, float]:
        """Successful requests (and good ones, with a goodput SLO) and their output tokens per second
        of the plan."""
        sums = self.blocks.sum(axis=0) / self.plan_s
        return {key: float(sums[column]) for key, column in RATE_COLUMNS.items() if column < len(sums)}


def common_goodput_slo(baseline: RunManifest, current: RunManifest) -> tuple[GoodputSLO | None, list[str]]:
    """The goodput rule both runs are counted against: the current run's, else the baseline's; a
    warning when they differ (goodput under different rules does not compare)."""
    slo = current.goodput_slo or baseline.goodput_slo
    if baseline.goodput_slo is not None and current.goodput_slo is not None and baseline.goodput_slo != slo:
        return slo, [
            f"the runs' goodput SLOs differ ({baseline.goodput_slo.describe()} vs {current.goodput_slo.describe()}):"
            " both are counted against the current run's"
        ]
    return slo, []


def load_run(run_dir: Path, goodput_slo: GoodputSLO | None = None) -> RunSample:
    """The run reduced to blocks; goodput counted against `goodput_slo` (the same rule for both runs
    of a comparison), none when None."""
    run = rundir.load(run_dir)
    manifest, records, frame = run.manifest, run.records, run.records.frame
    n = len(frame)
    if not n:
        raise InputError(f"{run_dir}: no request records")
    block = np.arange(n) * min(n, BOOTSTRAP_BLOCKS) // n  # records as written: neighbours in time
    blocks = int(block[-1]) + 1
    judged = frame.stage.isin([s.name for s in manifest.judged_stages]).to_numpy(dtype=bool)
    ok = judged & (frame.status == "ok").to_numpy(dtype=bool)
    spans = _latency_block_count(frame)
    span = np.arange(n) * spans // n
    itl = records.itl(ok, span, spans)
    good = good_requests(records, goodput_slo)
    # summarize_run's, but one ITL pass for both: the gaps are counted by block, not by stage
    summary = summarize(frame, manifest, itl=itl.percentiles(), stage_itl_p50=None, server=run.server, good=good)
    tokens = frame.output_tokens.fillna(0).to_numpy(dtype=float)
    per_record = [
        ok,
        np.where(ok, tokens, 0.0),
        judged & frame.status.isin(["failed", "unfinished"]).to_numpy(dtype=bool),
        judged & frame.status.isin(ANSWERED_STATUSES).to_numpy(dtype=bool),  # cancelled: not an error
    ]
    if good is not None:
        met = judged & good.to_numpy(dtype=bool)
        per_record += [met, np.where(met, tokens, 0.0)]
    latency = {
        m: Blocked.of_values(np.where(ok, frame[f"{m}_ms"].to_numpy(dtype=float), np.nan), span, spans)
        for m in PER_REQUEST_LATENCIES
    }
    latency["itl"] = Blocked.of(itl)
    return RunSample(
        name=str(run_dir),
        manifest=manifest,
        summary=summary,
        requests=n,
        plan_s=sum(stage.duration_s for stage in manifest.judged_stages),
        blocks=np.column_stack([np.bincount(block, weights=column, minlength=blocks) for column in per_record]),
        latency=latency,
        goodput_slo=goodput_slo,
    )


def _latency_block_count(frame: pd.DataFrame) -> int:
    """How many blocks a run's latencies are cut into: each about LATENCY_BLOCK_SPANS E2E p90s long."""
    sent = frame.sent_at.dropna()
    e2e = frame.e2e_ms[frame.status == "ok"].dropna()
    if sent.empty or e2e.empty:
        return min(len(frame), BOOTSTRAP_BLOCKS)
    wanted = float(sent.max() - sent.min()) / (LATENCY_BLOCK_SPANS * float(np.percentile(e2e, 90)) / 1000)
    return min(len(frame), int(np.clip(round(wanted), MIN_LATENCY_BLOCKS, BOOTSTRAP_BLOCKS)))


def _ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    return np.divide(numerator, denominator, out=np.full(len(numerator), np.nan), where=denominator > 0)


def bootstrap(run: RunSample, settings: Bootstrap, stream: int) -> dict[str, np.ndarray]:
    """The run's rates and error rate in each of `settings.resamples` seeded resamples of its blocks
    (as many blocks as the run has, drawn with replacement)."""
    rng = np.random.default_rng([settings.seed, stream])
    blocks = len(run.blocks)
    counts = rng.multinomial(blocks, np.full(blocks, 1 / blocks), size=settings.resamples).astype(float)
    sums = (counts @ run.blocks).T
    out = {key: sums[column] / run.plan_s for key, column in RATE_COLUMNS.items() if column < len(sums)}
    out["error_rate"] = _ratio(sums[2], sums[3])
    return out


def _scaled(blocked: Blocked, factor: float) -> Blocked:
    """The same histograms with every value multiplied by `factor` (each bucket moved whole)."""
    width = blocked.counts.shape[1]
    moved = buckets(MIDDLES[blocked.first : blocked.first + width] * factor)  # in order, as the buckets are
    targets, starts = np.unique(moved, return_index=True)
    counts = np.zeros((len(blocked.counts), int(targets[-1] - targets[0]) + 1))
    counts[:, targets - targets[0]] = np.add.reduceat(blocked.counts, starts, axis=1)
    return Blocked(int(targets[0]), counts)


def latency_noise(baseline: RunSample, current: RunSample, settings: Bootstrap) -> dict[str, np.ndarray]:
    """How far apart two runs land by chance, per latency percentile: resampled current − baseline,
    both drawing their blocks from one pool of the two runs' blocks, the current's scaled by the
    ratio of the medians (a run that is slower throughout adds no noise by being slower), minus the
    pool's own difference of scale.

    A run's own resamples cannot show it where a tail is made of rare episodes (a queue that forms
    for a few seconds): a baseline that happened to have none gives the same p99 in every resample,
    and its interval against a run that had some was too narrow. The pool shares the episodes out,
    as another run of the same server would."""
    rng = np.random.default_rng([settings.seed, 2])
    sizes = (len(baseline.latency["e2e"].counts), len(current.latency["e2e"].counts))
    pool = sum(sizes)
    base_draws, cur_draws = (
        rng.multinomial(size, np.full(pool, 1 / pool), size=settings.resamples).astype(float) for size in sizes
    )
    qs = np.array(LATENCY_PERCENTILES)
    out = {}
    for metric, base in baseline.latency.items():
        b50, c50 = (_latency(run.summary, metric).p50 for run in (baseline, current))
        scale = c50 / b50 if b50 and c50 and math.isfinite(c50 / b50) else 1.0
        cur = _scaled(current.latency[metric], 1 / scale)
        first = min(base.first, cur.first)
        width = max(base.first + base.counts.shape[1], cur.first + cur.counts.shape[1]) - first
        stacked = np.zeros((pool, width))
        for rows, blocked in ((slice(0, sizes[0]), base), (slice(sizes[0], pool), cur)):
            stacked[rows, blocked.first - first : blocked.first - first + blocked.counts.shape[1]] = blocked.counts
        pooled = quantiles(stacked.sum(axis=0), qs, first)[0]
        noise = scale * (quantiles(cur_draws @ stacked, qs, first) - pooled)
        noise -= quantiles(base_draws @ stacked, qs, first) - pooled
        out.update({f"{metric}.p{q}": noise[:, i] for i, q in enumerate(LATENCY_PERCENTILES)})
    return out


# --------------------------------------------------------------------------- comparison


class Row(BaseModel):
    """One compared figure; `worse` is +1 when a rise is bad (latency), -1 when a drop is (throughput)."""

    metric: str
    unit: str
    worse: Literal[1, -1]
    baseline: float | None
    current: float | None
    ci: tuple[float, float] | None = Field(description="confidence interval of current − baseline")
    limit: float = Field(description="degradation allowed, in the metric's unit")
    regressed: bool | None = Field(description="None when either run has no value")
    detectable: float | None = Field(
        default=None,
        description="the smallest degradation these runs could call a regression (half the time): the limit plus"
        " the interval's reach below its estimate; 'no regression' never hides 'could not tell'",
    )

    @property
    def delta(self) -> float | None:
        return None if self.baseline is None or self.current is None else self.current - self.baseline

    @property
    def delta_percent(self) -> float | None:
        delta = self.delta
        return None if delta is None or not self.baseline else 100 * delta / self.baseline


class Comparison(BaseModel):
    baseline: str
    current: str
    confidence: float
    rows: list[Row]
    warnings: list[str]
    requests: tuple[RequestCounts, RequestCounts] | None = Field(
        default=None, description="each run's judged requests (baseline, current): the error rate's split"
    )

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regressed]


def _row(
    metric: str,
    unit: str,
    worse: Literal[1, -1],
    *,
    values: tuple[float | None, float | None],
    diffs: np.ndarray | None,
    limit: float,
    confidence: float,
) -> Row:
    """Regressed when the degradation's whole interval exceeds the limit; a count has no interval."""
    base, cur = values
    ci = None
    detectable = None
    if base is not None and cur is not None:
        tail = 50 * (1 - confidence)
        lo, hi = (cur - base, cur - base) if diffs is None else np.nanpercentile(diffs, [tail, 100 - tail]).tolist()
        ci = (lo, hi)
        # a bootstrap interval can miss its own estimate (a median of near-equal values): reach is never below 0
        reach = (cur - base) - lo if worse == 1 else hi - (cur - base)
        detectable = limit + max(0.0, reach) if math.isfinite(reach) else None
    return Row(
        metric=metric, unit=unit, worse=worse, baseline=base, current=cur, ci=ci, limit=limit,
        regressed=None if ci is None else bool(min(worse * ci[0], worse * ci[1]) > limit), detectable=detectable,
    )  # fmt: skip


def _plan_warnings(base: RunManifest, cur: RunManifest) -> list[str]:
    def plan(m: RunManifest) -> tuple[object, ...]:
        return (m.workload, m.arrival, m.target_qps, [(s.percent, s.duration_s) for s in m.stages])

    if plan(base) == plan(cur):
        return []
    return [
        f"the runs' plans differ (workload, arrival, target req/s, stages): {plan(base)} vs {plan(cur)}; "
        "their deltas compare different loads"
    ]


def _latency(summary: Summary, metric: str) -> Percentiles:
    """A latency of the summary; a run without reasoning has no TTFO block, its TTFO is its TTFT."""
    figures = getattr(summary.latency_ms, metric)
    return summary.latency_ms.ttft if figures is None else figures


def _cost_rows(
    baseline: RunSample,
    current: RunSample,
    boots: tuple[dict[str, np.ndarray], dict[str, np.ndarray]],
    judge: Callable[..., Row],
    rise: float,
) -> list[Row]:
    """J per output token and $ per 1M output tokens, where both runs have them: each run's amount a
    second over its resampled output tok/s."""
    if baseline.summary.cost is None or current.summary.cost is None:
        return []
    holds = (baseline.summary.cost.hold, current.summary.cost.hold)
    rows = []
    for key, amount, scale, name, unit in COST_ROWS:
        b, c = (getattr(hold, key) for hold in holds)
        if b is None or c is None:
            continue
        base, cur = (
            scale * getattr(hold, amount) / hold.seconds / boot["output_tokens_per_s"]
            for hold, boot in zip(holds, boots, strict=True)
        )
        rows.append(judge(name, unit, 1, values=(b, c), diffs=cur - base, limit=rise * b))
    return rows


def compare_runs(baseline: RunSample, current: RunSample, thresholds: Thresholds) -> Comparison:
    settings = thresholds.bootstrap
    base_boot, cur_boot = bootstrap(baseline, settings, 0), bootstrap(current, settings, 1)
    noise = latency_noise(baseline, current, settings)
    base, cur = baseline.summary, current.summary
    judge = functools.partial(_row, confidence=settings.confidence)
    rows = []
    reasoned = base.latency_ms.ttfo is not None or cur.latency_ms.ttfo is not None
    for metric in LATENCY_METRICS:
        if metric == "ttfo" and not reasoned:
            continue
        for q in LATENCY_PERCENTILES:
            key = f"p{q}"
            b, c = (getattr(_latency(s, metric), key) for s in (base, cur))
            floor = getattr(thresholds.latency_floor_ms, metric)
            limit = max(getattr(thresholds.latency_rise, key) * (b or 0.0), floor)
            diffs = None if b is None or c is None else (c - b) + noise[f"{metric}.{key}"]
            rows.append(judge(f"{metric.upper()} {key}", "ms", 1, values=(b, c), diffs=diffs, limit=limit))
    for key, name, unit in RATE_ROWS:
        if key not in baseline.throughput or key not in current.throughput:
            continue
        b, c = (r.throughput[key] for r in (baseline, current))
        diffs = cur_boot[key] - base_boot[key]
        rows.append(judge(name, unit, -1, values=(b, c), diffs=diffs, limit=thresholds.throughput_drop * b))
    rows += _cost_rows(baseline, current, (base_boot, cur_boot), judge, thresholds.cost_rise)
    answered = (s.requests.ok + s.requests.failed + s.requests.unfinished for s in (base, cur))  # cancelled: never
    b, c = (
        (s.requests.failed + s.requests.unfinished) / n if n else None
        for s, n in zip((base, cur), answered, strict=True)
    )
    diffs = cur_boot["error_rate"] - base_boot["error_rate"]
    rows.append(judge("error rate", "%", 1, values=(b, c), diffs=diffs, limit=thresholds.error_rate_rise))
    oom = (float(base.failures.oom_family), float(cur.failures.oom_family))
    rows.append(judge("OOM-family failures", "count", 1, values=oom, diffs=None, limit=thresholds.oom_family_rise))
    hits = [None if s.server is None else s.server.prefix_cache_hit_rate for s in (base, cur)]
    rows.append(
        judge(
            "prefix-cache hit rate",
            "%",
            -1,
            values=(hits[0], hits[1]),
            diffs=None,
            limit=thresholds.prefix_cache_hit_rate_drop,
        )
    )
    return Comparison(
        baseline=baseline.name,
        current=current.name,
        confidence=settings.confidence,
        rows=rows,
        warnings=_plan_warnings(baseline.manifest, current.manifest),
        requests=(base.requests, cur.requests),
    )


# --------------------------------------------------------------------------- rendering

HEADER = ("metric", "baseline", "current", "Δ", "Δ %", "CI of Δ", "allowed", "detectable", "result")


def _number(value: float | None, unit: str, *, sign: bool = False) -> str:
    if value is None:
        return "–"
    if unit == "%":
        value *= 100
    digits = 0 if unit == "count" else 2 if unit in ("req/s", "%") else 3 if unit in ("J", "$") else 1
    return f"{value:{'+' if sign else ''},.{digits}f}"


def _cells(row: Row) -> tuple[str, ...]:
    pct = row.delta_percent
    ci = (
        "–"
        if row.ci is None
        else f"[{_number(row.ci[0], row.unit, sign=True)}, {_number(row.ci[1], row.unit, sign=True)}]"
    )
    result = "n/a" if row.regressed is None else "REGRESSION" if row.regressed else "ok"
    return (
        f"{row.metric} ({row.unit})",
        _number(row.baseline, row.unit),
        _number(row.current, row.unit),
        _number(row.delta, row.unit, sign=True),
        "–" if pct is None else f"{pct:+.1f}%",
        ci,
        _number(row.worse * row.limit, row.unit, sign=True),
        _number(None if row.detectable is None else row.worse * row.detectable, row.unit, sign=True),
        result,
    )


def _verdict_lines(comparison: Comparison) -> list[str]:
    conf = f"{comparison.confidence:.0%}"
    note = (
        "Latency of successful requests, from send; throughput per second of the planned stages "
        f"(start-up and drain excluded); CI: {conf} bootstrap interval of current − baseline."
    )
    if comparison.requests is not None:
        note += (
            " Requests judged: "
            + "; ".join(
                f"{name} {r.ok} ok, {r.failed} failed, {r.unfinished} unfinished (still running when the drain ended)"
                for name, r in zip(("baseline", "current"), comparison.requests, strict=True)
            )
            + " — the error rate counts failed and unfinished."
        )
    if not comparison.regressions:
        return [
            note,
            "",
            f"No regression: no metric's {conf} interval of degradation lies beyond its limit. These runs could"
            " call a change a regression only from its `detectable` size (half the time; a longer run sees smaller"
            " ones): no regression is not 'could not tell'.",
        ]
    return [
        note,
        "",
        f"REGRESSION in {', '.join(r.metric for r in comparison.regressions)}: "
        f"the whole {conf} interval of the degradation lies beyond the allowed change.",
    ]


def render_text(comparison: Comparison) -> str:
    table = [HEADER, *(_cells(r) for r in comparison.rows)]
    widths = [max(len(row[i]) for row in table) for i in range(len(HEADER))]
    lines = [f"baseline {comparison.baseline}  vs  current {comparison.current}", ""]
    for row in table:
        lines.append(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    lines += ["", *_verdict_lines(comparison), *(f"warning: {w}" for w in comparison.warnings)]
    return "\n".join(lines) + "\n"


def render_markdown(comparison: Comparison) -> str:
    verdict = "FAIL" if comparison.regressions else "PASS"
    lines = [
        f"### llmload regression gate: **{verdict}**",
        "",
        f"Baseline `{comparison.baseline}` vs current `{comparison.current}`.",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|---|" + "---:|" * (len(HEADER) - 2) + "---|",
    ]
    for row in comparison.rows:
        cells = list(_cells(row))
        if row.regressed:
            cells[-1] = f"**{cells[-1]}**"
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *_verdict_lines(comparison), *(f"\n> warning: {w}" for w in comparison.warnings)]
    return "\n".join(lines) + "\n"
