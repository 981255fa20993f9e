"""The soak verdict: PASS or FAIL for a run's hold stage (its last), with one reason line per check.

A soak asks whether the target survives a load above its target rate for a long time: nothing
died, almost nothing failed, the load generator delivered the rate, latency met its SLOs, and
nothing kept growing (latency, KV-cache usage, the waiting queue, preemptions), since a steady
upward slope is what ends in an OOM after the test has stopped. Criteria: docs/gates.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

import numpy as np
import pandas as pd
from pydantic import BaseModel

from llmload.cancel import HELD_EXCESS, held_excess, release_line
from llmload.errors import InputError
from llmload.format import figure
from llmload.gates.criteria import AlertAction, AlertCriteria, DriftCriteria, KeepingUpCriteria, SoakCriteria
from llmload.models import (
    ANSWERED_STATUSES,
    OOM_FAMILY,
    CheckKind,
    RunManifest,
    Stage,
    StageSummary,
    Summary,
    Verdict,
)
from llmload.report.summary import sent_reusable_prefix
from llmload.rundir import SERVER_FILE, Run
from llmload.server.kinds import kind as server_kind
from llmload.stats import windows
from llmload.stats.trend import Trend, t_quantile

NO_GPU = (
    "no GPU samples in the hold (give --gpu-metrics URL of a DCGM exporter, or run the target on this machine"
    " with nvidia-smi on the PATH)"
)

NO_SAMPLES = f"no {SERVER_FILE} samples in the hold"
NO_PREFIX_CACHE = "no prefix-cache queries in the hold (vLLM's prefix_cache_queries counter)"

# --------------------------------------------------------------------------- result


class Check(BaseModel):
    name: str
    kind: CheckKind
    status: Literal["pass", "fail", "warn", "skip", "inconclusive"]
    detail: str
    marginal: bool = False
    """Failed, yet a second hold may pass: a drift over its limit at the slope's estimate, not at the
    low end of its confidence interval (overload drifts past the limit at both)."""
    hold_needed_s: float | None = None
    """INCONCLUSIVE: about how long a hold would tell."""
    served_low_qps: float | None = None
    """Keeping up: the rate the server is shown to serve at the check's pass confidence."""

    @property
    def line(self) -> str:
        return f"{self.status.upper()} {self.name}: {self.detail}"


class SoakResult(BaseModel):
    run_id: str
    hold: str
    checks: list[Check]

    @property
    def verdict(self) -> Verdict:
        failed = [c for c in self.checks if c.status == "fail"]
        unsure = [c for c in self.checks if c.status == "inconclusive"]
        return Verdict(
            outcome="fail" if failed else "inconclusive" if unsure else "pass",
            reasons=[c.line for c in self.checks],
            failed_kinds=[c.kind for c in failed],
            inconclusive_kinds=[c.kind for c in unsure],
            hold_needed_s=max((c.hold_needed_s or 0.0 for c in unsure), default=0.0) or None,
            marginal=bool(failed) and all(c.marginal for c in failed),
            served_low_qps=next((c.served_low_qps for c in self.checks if c.kind == "keeping_up"), None),
        )

    @property
    def warnings(self) -> list[str]:
        return [c.line for c in self.checks if c.status == "warn"]


# --------------------------------------------------------------------------- signals over time


@dataclass(frozen=True)
class Hold:
    """The hold: where it starts (unix seconds), its requests and the server samples in it."""

    stage: Stage
    start: float
    drain_s: float
    ok: pd.DataFrame  # ok records sent during the hold
    judged: pd.DataFrame  # the hold's requests the target is judged on: ok, failed or unfinished
    spans: pd.DataFrame  # sent_at and finished_at of every request the run sent: what was in flight when
    server: pd.DataFrame  # server samples taken during the hold (columns may be all null)

    @property
    def unfinished(self) -> int:
        return int((self.judged.status == "unfinished").sum())

    def disturbed(self, criteria: DriftCriteria) -> pd.Series:
        """Windows (by their middle, as `windows` indexes them) in which other work on the load
        generator's machine, or the hypervisor, took more CPU than the criteria allow: the client's
        timestamps and a local target are slowed by something the run did not do."""
        server = self.server
        if server.host_cpu_busy.isna().all():
            return pd.Series(dtype=float)
        other = (server.host_cpu_busy - server.host_cpu_run).clip(lower=0)
        mean = windows.mean
        others = self.windows(server.t, other, criteria.window_s, mean)
        steal = self.windows(server.t, server.host_cpu_steal, criteria.window_s, mean)
        over = pd.concat([others / max(criteria.max_other_cpu, 1e-9), steal / max(criteria.max_steal, 1e-9)], axis=1)
        worst = over.max(axis=1)
        return others[worst.reindex(others.index).fillna(0) > 1]

    @property
    def duration_s(self) -> float:
        return self.stage.duration_s

    def server_series(self, column: str, window_s: float) -> pd.Series | None:
        """The mean of a server figure in each window of the hold; None when no sample has it."""
        samples = self.server.dropna(subset=[column])
        return None if samples.empty else self.windows(samples.t, samples[column], window_s, windows.mean)

    def ok_p99(self, column: str, window_s: float) -> pd.Series:
        """The p99 of the ok requests' latency in each window of the hold, by when they were sent."""
        return self.windows(self.ok.sent_at, self.ok[column], window_s, windows.p99)

    @functools.cached_property
    def answer_span_s(self) -> float:
        """How long requests overlap in time, as the hold began: the E2E p90 of those sent in its first
        quarter (an unfinished one as long as it ran). In-flight counts and window latencies stay
        correlated over about this long; a queue that grows later does not lengthen it."""
        judged = self.judged
        early = judged[judged.sent_at < self.start + self.duration_s / 4]
        values, _ = _censored(early if len(early) else judged, "e2e_ms")
        return float(np.percentile(values, 90)) / 1000 if len(values) else 0.0

    def lag(self, window_s: float) -> int:
        """Neighbouring windows that share requests: the slopes' errors are Newey–West's over them."""
        return math.ceil(self.answer_span_s / window_s)

    def windows(
        self, times: pd.Series, values: pd.Series, window_s: float, reduce: Callable[[pd.Series], float]
    ) -> pd.Series:
        """`reduce` of the values in each full window of the hold, indexed by the window's middle in
        seconds from the hold's start; empty windows are left out."""
        return windows.per_window(
            times, values, window_s, reduce, origin=self.start, windows=self.window_count(window_s)
        )

    def window_count(self, window_s: float) -> int:
        """Full windows in the hold: a 10 s hold holds six of 10/6 s, whatever the float rounding says."""
        return int(self.duration_s / window_s + 1e-9)


def _preemption_rate(samples: pd.DataFrame) -> pd.DataFrame:
    """Preemptions per second between consecutive samples (a counter reset counts as no preemption)."""
    counter = samples.dropna(subset=["t", "preemptions_total"]).sort_values("t")
    return pd.DataFrame(
        {"t": counter.t, "value": counter.preemptions_total.diff().clip(lower=0) / counter.t.diff()}
    ).dropna()


# --------------------------------------------------------------------------- drift


def _drift(
    name: str,
    unit: str,
    series: pd.Series | None,
    floor: float,
    *,
    hold: Hold,
    criteria: DriftCriteria,
    kind: CheckKind = "drift",
    starved: str | None = None,
    unmeasured: str = "",
    lag: int | None = None,
) -> Check:
    """`starved`: why windows lack values although requests were sent in them (they did not finish):
    then too few windows is a failure, not a skip. `lag`: how many neighbouring windows share requests
    (the slope's errors are Newey–West's over them)."""
    window = f"{criteria.window_s:g} s"
    if series is None:
        return Check(name=name, kind=kind, status="skip", detail=f"not measured ({unmeasured or NO_SAMPLES})")
    disturbed = hold.disturbed(criteria)
    left_out = series.index.isin(disturbed.index)
    note = ""
    if left_out.any():
        took = f"other work took up to {disturbed.max():.0%} of this machine's CPU"
        note = (
            f"; {int(left_out.sum())} window(s) left out: {took} (limit {criteria.max_other_cpu:.0%}, steal"
            f" {criteria.max_steal:.0%})"
        )
        series = series[~left_out]
    if len(series) < criteria.min_windows:
        counted = f"{len(series)} window(s) of {window} with data in the {hold.duration_s:g} s hold"
        if starved is not None:
            return Check(
                name=name, kind=kind, status="fail",
                detail=f"{counted}, a slope needs {criteria.min_windows}: {starved}; a check that cannot be"
                f" measured because requests did not finish is not a pass{note}",
            )  # fmt: skip
        return Check(
            name=name, kind=kind, status="skip", detail=f"{counted}; a slope needs {criteria.min_windows}{note}"
        )
    trend = Trend.fit(series, criteria.confidence, lag=lag)
    rise = trend.slope * hold.duration_s
    limit = max(criteria.relative_rise * max(trend.start, 0.0), floor)
    drifting = trend.low > 0 and rise > limit
    low_rise = trend.low * hold.duration_s
    marginal = drifting and low_rise <= limit
    relative = f" ({rise / trend.start:+.0%})" if trend.start > 0 else ""
    u = f" {unit}" if unit else ""
    return Check(
        name=name,
        kind=kind,
        status="fail" if drifting else "pass",
        marginal=marginal,
        detail=f"{figure(rise, sign=True)}{u} over the {hold.duration_s:g} s hold from {figure(trend.start)}{u}"
        f"{relative}, slope {figure(trend.slope, sign=True)}{u}/s ({criteria.confidence:.1%} CI"
        f" {figure(trend.low, sign=True)} to {figure(trend.high, sign=True)}, "
        f"{len(series)} windows of {window}); limit: CI above 0 and rise > {figure(limit)}{u} "
        f"({criteria.relative_rise:.0%} of the start, at least {floor:g}){note}"
        + (f"; marginal: {figure(low_rise, sign=True)}{u} at the CI's low end" if marginal else ""),
    )


def _keeping_up(hold: Hold, drift: DriftCriteria, criteria: KeepingUpCriteria) -> Check:
    """Server-agnostic: the requests in flight (sent and not yet seen to finish, whatever the server
    exports) over the hold. A target that keeps up holds them level (Little's law: rate × E2E); one
    that does not queues the surplus, and they grow through the hold at (1 − capacity / rate) of the
    rate. So the growth per request sent decides three ways: FAIL when it is above 0 beyond noise,
    PASS when it is below what an overload of `criteria.overload` would give beyond noise, and
    INCONCLUSIVE in between, when the hold is too short to tell. After a step up in rate the count
    rises for about one E2E before it settles, so the windows of the hold's first E2E p50 are left out
    while enough remain. The noise is the larger of two: the windows' own, with Newey–West errors over
    as many windows as an E2E p90 spans (neighbouring windows share requests), and the random walk an
    overloaded queue takes (`Walk`): a one-slot server at 1.13× its capacity held 43
    requests in a 5-minute hold, and finished 42 of them by the luck of short answers."""
    window_s = drift.window_s
    count = hold.window_count(window_s)
    if count < drift.min_windows:
        needed = drift.min_windows * window_s
        return _keeping_up_check(
            "inconclusive", hold_needed_s=needed,
            detail=f"the {hold.duration_s:g} s hold holds {count} window(s) of {window_s:g} s, and telling whether"
            f" the server keeps up needs {drift.min_windows}: hold at least {needed:g} s",
        )  # fmt: skip
    flight = InFlight.of(hold, window_s, drift.min_windows)
    judged_s = flight.judged_s
    if judged_s < criteria.answer_spans * hold.answer_span_s:
        needed = hold.duration_s - judged_s + criteria.answer_spans * hold.answer_span_s
        return _keeping_up_check(
            "inconclusive", hold_needed_s=needed,
            detail=f"{flight.story}; the hold judges {judged_s:g} s, {judged_s / hold.answer_span_s:.1f}× its answers'"
            f" E2E p90 ({hold.answer_span_s:.1f} s), and telling a queue from long answers needs"
            f" {criteria.answer_spans:g}×: hold at least {_minutes(needed)}",
        )  # fmt: skip
    return _growth_check(hold, flight, Growth.fit(hold, flight, drift, criteria), drift, criteria)


def _keeping_up_check(
    status: Literal["pass", "fail", "inconclusive"],
    detail: str,
    hold_needed_s: float | None = None,
    served_low_qps: float | None = None,
) -> Check:
    """One of keeping up's outcomes, each under the check's one name and kind."""
    return Check(
        name="keeping up", kind="keeping_up", status=status, detail=detail, hold_needed_s=hold_needed_s,
        served_low_qps=served_low_qps,
    )  # fmt: skip


@dataclass(frozen=True)
class InFlight:
    """The requests in flight in each window of the hold once the count settled, and how many requests
    the hold sent and saw complete: what keeping up judges."""

    series: pd.Series  # the mean in flight per window, indexed by the window's middle
    window_s: float
    skipped: str  # the words for the windows left out while the count settled, or ""
    sent: int
    completed: int
    hold_s: float

    @classmethod
    def of(cls, hold: Hold, window_s: float, min_windows: int) -> InFlight:
        """The windows of the hold's first E2E p50 left out while `min_windows` remain (the count
        rises for about one E2E after a step up in rate)."""
        end = hold.start + hold.duration_s
        spans = hold.spans
        series = windows.in_flight(
            spans.sent_at.to_numpy(), spans.finished_at.to_numpy(), window_s, origin=hold.start,
            windows=hold.window_count(window_s),
        )  # fmt: skip
        values, _ = _censored(hold.judged, "e2e_ms")
        settle_s = float(np.median(values)) / 1000 if len(values) else 0.0
        settled = series[series.index - window_s / 2 >= settle_s]
        skipped = ""
        if 0 < len(settled) < len(series) and len(settled) >= min_windows:
            skipped = f" from +{settled.index[0] - window_s / 2:g} s (after the hold's E2E p50, {settle_s:.1f} s)"
            series = settled
        sent = int(((spans.sent_at >= hold.start) & (spans.sent_at < end)).sum())
        done = spans.loc[spans.status.isin(["ok", "failed"])]
        completed = int(((done.finished_at >= hold.start) & (done.finished_at < end)).sum())
        return cls(series, window_s, skipped, sent, completed, hold.duration_s)

    @property
    def rate(self) -> float:
        return max(self.sent, 1) / self.hold_s

    @property
    def judged_s(self) -> float:
        return len(self.series) * self.window_s

    @property
    def story(self) -> str:
        first, last = float(self.series.iloc[0]), float(self.series.iloc[-1])
        return (
            f"in flight went from {figure(first)} to {figure(last)} during the hold (mean of its first and last"
            f" {self.window_s:g} s windows{self.skipped}); {self.completed} requests completed in it against"
            f" {self.sent} sent ({self.completed / self.hold_s:.2f} vs {self.sent / self.hold_s:.2f} req/s)"
        )


@dataclass(frozen=True)
class Growth:
    """The in-flight count's slope through the hold, as a share of the rate, with the bounds keeping up
    decides on: `low` at `fail_confidence`, `high` at `pass_confidence`."""

    trend: Trend
    error: float  # the slope's error: the windows' own, or a queue's random walk where that is larger
    by_walk: bool  # the random walk set the error
    low: float
    high: float

    @classmethod
    def fit(cls, hold: Hold, flight: InFlight, drift: DriftCriteria, criteria: KeepingUpCriteria) -> Growth:
        """The slope, and what the hold left in flight (sent − completed), must each rule the overload out."""
        series, rate = flight.series, flight.rate
        trend = Trend.fit(series, drift.confidence, lag=hold.lag(flight.window_s), adaptive=True)
        walk = Walk.of(hold, rate, flight.completed / hold.duration_s)
        calm = walk.ruled_out(series, trend, flight.window_s)
        walk_error = 0.0 if calm else walk.slope_error(flight.judged_s)
        error = max(trend.error, walk_error)
        low = (trend.slope - t_quantile(criteria.fail_confidence, trend.dof) * error) / rate
        walk_variance = 0.0 if calm else walk.completions * hold.duration_s
        deficit_high = _deficit_bound(flight.sent, flight.completed, series, walk_variance)
        high = max((trend.slope + t_quantile(criteria.pass_confidence, trend.dof) * error) / rate, deficit_high)
        return cls(trend, error, walk_error > trend.error, low, high)

    def words(self, flight: InFlight) -> str:
        rate, slope = flight.rate, self.trend.slope  # slope / rate: of the requests sent, the share left in flight
        source = "a queue’s random walk" if self.by_walk else "the windows’ own"
        return (
            f"growth {slope / rate:+.1%} of the rate ({figure(slope * 60, sign=True)} requests in flight a minute,"
            f" bounds {self.low:+.1%} to {self.high:+.1%}, {len(flight.series)} windows of {flight.window_s:g} s;"
            f" its error {self.error / rate:.1%} of the rate, {source})"
        )


def _growth_check(
    hold: Hold, flight: InFlight, growth: Growth, drift: DriftCriteria, criteria: KeepingUpCriteria
) -> Check:
    """FAIL when the count grows beyond noise, PASS when the growth an overload of `criteria.overload`
    gives is ruled out, else INCONCLUSIVE with the hold that would tell."""
    story, numbers, rate = flight.story, growth.words(flight), flight.rate
    tell = 1 - 1 / (1 + criteria.overload)  # the growth an overload of `overload` gives
    served = rate * (1 - max(growth.high, 0.0))  # what the server is shown to serve, at pass confidence
    if growth.low > 0 and growth.trend.slope * flight.judged_s > drift.min_rise.in_flight:
        return _keeping_up_check(
            "fail",
            detail=f"{story.replace('went from', 'grew from', 1)}; {numbers}: requests pile up (above 0 at"
            f" {criteria.fail_confidence:.1%}), the server does not keep up at {figure(rate)} req/s",
            served_low_qps=served,
        )
    if growth.high < tell:
        return _keeping_up_check(
            "pass",
            detail=f"{story}; {numbers}: rules out an overload of {criteria.overload:.0%} (growth {tell:.1%}) at"
            f" {criteria.pass_confidence:.1%}",
            served_low_qps=served,
        )
    tells, needed = _detectable(
        growth.error, growth.trend.dof, rate, criteria, judged_s=flight.judged_s, hold_s=hold.duration_s,
        walk=growth.by_walk,
    )  # fmt: skip
    return _keeping_up_check(
        "inconclusive", detail=f"{story}; {numbers}: {tells}", hold_needed_s=needed, served_low_qps=served
    )


# The 0.5% quantile of a saturated queue's calm: the variance of its per-window means about their
# least-squares line over a free walk's (L/15 × its variance per second), by the windows judged, for the
# calmest such queue, a walk held at zero; simulated (llmload.errorrates.walk.calm_quantiles, checked by
# tests/test_errorrates.py). A series calmer than this is no saturated queue, at 99.5%.
WALK_CALM_WINDOWS = (6, 10, 20, 50, 100, 300)
WALK_CALM_QUANTILE = (0.0146, 0.0382, 0.0725, 0.1037, 0.1216, 0.1347)


@dataclass(frozen=True)
class Walk:
    """The random walk the requests in flight would take were the server at or over its capacity:
    arrivals − completions, neither held back by the other. Its variance per second is `arrivals` (c_a²
    × rate) + `completions` (c_s² × completion rate), c_a² and c_s² the squared coefficients of variation
    of the gaps between sends and of the service times (E2E less the queueing in TTFT above its 5th
    percentile). Against such a walk a one-slot server at 1.13× its capacity, 43 requests in a 5-minute
    hold, looked level by the luck of short answers; a series far calmer than the walk is no walk, and
    the server is not saturated."""

    arrivals: float
    completions: float

    @classmethod
    def of(cls, hold: Hold, rate: float, completion_rate: float) -> Walk:
        judged = hold.judged
        sends = np.sort(hold.spans.sent_at[(hold.spans.sent_at >= hold.start)].to_numpy(dtype=float))
        gaps = np.diff(sends[sends < hold.start + hold.duration_s])
        arrivals_cv2 = float(gaps.var() / gaps.mean() ** 2) if len(gaps) > 1 and gaps.mean() > 0 else 1.0
        ok = judged[judged.status == "ok"]
        ttft = ok.ttft_ms.to_numpy(dtype=float)
        base = float(np.nanpercentile(ttft, 5)) if np.isfinite(ttft).any() else 0.0
        service = ok.e2e_ms.to_numpy(dtype=float) - ttft + base
        service = service[np.isfinite(service)]
        service_cv2 = float(service.var() / service.mean() ** 2) if len(service) > 9 and service.mean() > 0 else 1.0
        return cls(arrivals_cv2 * rate, service_cv2 * max(completion_rate, rate))

    def slope_error(self, judged_s: float) -> float:
        """The least-squares slope's standard error over `judged_s`: 6/5 of a walk's variance over the span
        for the completions, 1/5 for the arrivals (counted exactly over the hold: a bridge)."""
        return math.sqrt((self.arrivals / 5 + 6 / 5 * self.completions) / judged_s)

    def ruled_out(self, series: pd.Series, trend: Trend, window_s: float) -> bool:
        """Whether the in-flight series is far calmer about its line than this walk would be (below its 0.5%
        quantile): the server emptied its queue again and again, and is not saturated."""
        n = len(series)
        x = series.index.to_numpy(dtype=float)
        residuals = series.to_numpy(dtype=float) - (trend.start + trend.slope * x)
        expected = (self.arrivals + self.completions) * n * window_s / 15
        if expected <= 0:
            return True
        calm = float(residuals @ residuals) / (n - 2) / expected
        return calm < float(np.interp(np.log(n), np.log(WALK_CALM_WINDOWS), WALK_CALM_QUANTILE))


def _deficit_bound(sent: int, completed: int, series: pd.Series, walk_variance: float, z: float = 2.326) -> float:
    """The upper 99% bound of (sent − completed) / sent over the hold: the share of its requests the hold
    left in flight, a test on cumulative arrivals minus completions. Its noise: the walk the completions
    take were the server saturated (`walk_variance`, requests²), and the requests in flight at either end
    (twice their variance over the hold). A queue that starts empty hugs zero for a while, and the
    slope through its wander can read level where the count it left behind does not: a one-slot server
    at 1.1× its capacity passed 11% of 30-minute soaks on the slope alone."""
    if sent <= 0:
        return math.inf
    noise = math.sqrt(walk_variance + 2 * float(series.var(ddof=0)))
    return (sent - completed + z * noise) / sent


def _detectable(
    error: float, dof: int, rate: float, criteria: KeepingUpCriteria, *, judged_s: float, hold_s: float, walk: bool
) -> tuple[str, float]:
    """What this hold can tell and the hold that would tell `criteria.overload`: the slope's error falls
    as the judged span to the power 1/2 when a random walk sets it, 3/2 when the windows' own noise does."""
    z = t_quantile(criteria.pass_confidence, dof) + t_quantile(criteria.fail_confidence, dof)
    share = z * error / rate  # the growth this hold tells from level
    overload = 1 / (1 - share) - 1 if share < 1 else math.inf
    tell = 1 - 1 / (1 + criteria.overload)
    needed = hold_s - judged_s + judged_s * (share / tell) ** (2 if walk else 2 / 3)
    can = f"an overload of {overload:.0%} or more" if math.isfinite(overload) else "no overload"
    words = (
        f"this {hold_s:g} s hold at {figure(rate)} req/s can tell {can}; about {_minutes(needed)} would tell"
        f" {criteria.overload:.0%} (a longer hold, or answers that vary less)"
    )
    return words, needed


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} minutes" if seconds >= 120 else f"{seconds:.0f} s"


# --------------------------------------------------------------------------- checks


def _oom_check(by_category: Mapping[Hashable, int]) -> Check:
    """The whole run, warm-up included: an engine that died before the hold is not healthy in it."""
    oom = {str(k): int(v) for k, v in sorted(by_category.items()) if k in OOM_FAMILY}
    count = sum(oom.values())
    kinds = f" ({', '.join(f'{k}: {v}' for k, v in oom.items())})" if oom else ""
    return Check(
        name="OOM-family failures",
        kind="failures",
        status="fail" if count else "pass",
        detail=f"{count} in the run{kinds}; limit 0 ({' + '.join(sorted(OOM_FAMILY))})",
    )


def _rate_checks(stage: StageSummary, criteria: SoakCriteria, hold: Hold) -> list[Check]:
    sent = stage.ok + stage.failed + stage.unfinished
    failures = stage.failed + stage.unfinished
    rate = failures / sent if sent else 1.0
    ratio = stage.achieved_qps / stage.target_qps if stage.target_qps else 0.0
    # in whole requests, as the report's shortfall flag counts: 29 of a 30-request hold is 96.7%, yet
    # the most a 98% limit can ask of 30 requests is 29
    sent_in_hold = round(stage.achieved_qps * stage.duration_s)
    needed = math.floor(criteria.min_achieved_ratio * stage.target_qps * stage.duration_s + 1e-9)
    return [
        Check(
            name="error rate",
            kind="failures",
            status="fail" if rate > criteria.max_error_rate or not sent else "pass",
            detail=f"{rate:.2%} ({stage.failed} failed + {stage.unfinished} unfinished of {sent} sent) in the hold;"
            f" limit {criteria.max_error_rate:.2%}",
        ),
        _finished_check(stage, criteria, hold),
        Check(
            name="achieved rate",
            kind="rate",
            status="fail" if sent_in_hold < needed or stage.lost else "pass",
            detail=(
                f"{stage.achieved_qps:.2f} of {stage.target_qps:.2f} req/s target in the hold ({ratio:.1%}; "
                f"offered {stage.offered_qps:.2f}; {sent_in_hold} requests sent); limit ≥ "
                f"{criteria.min_achieved_ratio:.0%} of the target ({needed} requests)"
                if hold.stage.sessions is None
                else f"{stage.achieved_qps:.2f} req/s in the hold ({sent_in_hold} requests sent) from"
                f" {hold.stage.sessions} conversations kept in flight: a closed loop, whose rate is the server's"
                " answer, not a target"
            )
            + (
                f"; {stage.lost} of the hold's requests were lost with a worker (never sent, or in flight when it"
                " died): the target was not offered the whole load"
                if stage.lost
                else ""
            ),
        ),
    ]


def _finished_check(stage: StageSummary, criteria: SoakCriteria, hold: Hold) -> Check:
    """Every request sent in the hold is judged: one still running when the drain ended is a request
    the target did not answer in time, never left out."""
    sent = stage.ok + stage.failed + stage.unfinished
    finished = stage.ok + stage.failed
    if not stage.unfinished:
        return Check(
            name="finished", kind="failures", status="pass",
            detail=f"{finished} of {sent} sent in the hold finished before the {hold.drain_s:g} s drain ended",
        )  # fmt: skip
    ran = (hold.judged.finished_at - hold.judged.sent_at)[hold.judged.status == "unfinished"]
    behind = stage.unfinished / sent > criteria.max_error_rate
    verdict = f": the server did not keep up at {stage.target_qps:g} req/s" if behind else ""
    return Check(
        name="finished",
        kind="failures",
        status="fail" if behind else "pass",
        detail=f"{finished} of {sent} sent in the hold; {stage.unfinished} still running after the {hold.drain_s:g} s"
        f" drain (they had run {ran.min():.1f}–{ran.max():.1f} s){verdict}; limit {criteria.max_error_rate:.2%} of"
        " those sent",
    )


def _censored(judged: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """A latency of the hold's answered requests, and which values are only lower bounds: an ok request's
    is exact, an unfinished one's is at least as long as it had run (its TTFT or TTFO exact if that
    token came); a request that thought to its end without answering has a TTFO of at least its E2E."""
    rows = judged[judged.status.isin(["ok", "unfinished"])]
    known = rows[column].notna() & ((rows.status == "ok") | (column in ("ttft_ms", "ttfo_ms")))
    values = rows[column].where(known, (rows.finished_at - rows.sent_at) * 1000)
    return values.to_numpy(dtype=float), (~known).to_numpy(dtype=bool)


def _p99_bounds(values: np.ndarray, censored: np.ndarray) -> tuple[float, float]:
    """The p99 with every lower bound taken as it is, and with every lower bound unbounded: the true
    p99 lies between them (inf when an unfinished request decides it)."""
    low = float(np.percentile(values, 99))
    with np.errstate(invalid="ignore"):
        high = float(np.percentile(np.where(censored, np.inf, values), 99))
    return low, high if math.isfinite(high) else math.inf


def _slo_check(name: str, hold: Hold, column: str, slo: float | None, flag: str) -> Check:
    if slo is None:
        return Check(name=name, kind="slo", status="skip", detail=f"no SLO given ({flag})")
    values, censored = _censored(hold.judged, column)
    if not len(values):
        return Check(name=name, kind="slo", status="fail", detail=f"no successful request in the hold; SLO {slo:g} ms")
    low, high = _p99_bounds(values, censored)
    if low > slo:
        at_least = "≥ " if censored.any() else ""
        return Check(name=name, kind="slo", status="fail", detail=f"{at_least}{low:.1f} ms in the hold; SLO {slo:g} ms")
    if high <= slo:
        return Check(name=name, kind="slo", status="pass", detail=f"{high:.1f} ms in the hold; SLO {slo:g} ms")
    return Check(
        name=name, kind="slo", status="fail",
        detail=f"cannot be judged: {int(censored.sum())} request(s) of the hold did not finish (or answer), so the"
        " p99 is"
        f" {low:.1f} ms or more, unbounded; SLO {slo:g} ms: not a pass",
    )  # fmt: skip


def _goodput_check(stage: StageSummary, minimum: float | None, manifest: RunManifest) -> Check:
    name = "goodput ratio"
    if minimum is None:
        return Check(name=name, kind="goodput", status="skip", detail="no minimum given (--min-goodput-ratio)")
    if manifest.goodput_slo is None or stage.goodput is None:
        return Check(
            name=name,
            kind="goodput",
            status="fail",
            detail="the run has no goodput SLO (--goodput-slo) to count against",
        )
    ratio = stage.goodput.slo_attainment
    if ratio is None:
        return Check(
            name=name, kind="goodput", status="fail", detail=f"no request answered in the hold; limit ≥ {minimum:.0%}"
        )
    return Check(
        name=name,
        kind="goodput",
        status="fail" if ratio < minimum else "pass",
        detail=f"{ratio:.1%} of the answered requests met every SLO ({manifest.goodput_slo.describe()}; an unfinished"
        f" one never does): goodput {stage.goodput.requests_per_s:.2f} req/s in the hold; limit ≥ {minimum:.0%}",
    )


def _prefix_cache_check(run: Run, summary: Summary, gap: float | None) -> Check:
    """The server's prefix-cache hit rate against the share the prompts the run sent could hit: a cache
    too small, evicting, or a router that breaks session affinity loses hits the workload offers. Both
    over the judged stages; the hit rate from the requests' usage (`cached_tokens`) where the server
    gives it, else from its /metrics counters. Asked for and not measured, it cannot tell."""
    name, kind = "prefix-cache hit rate", cast(CheckKind, "prefix_cache")
    if gap is None:
        return Check(name=name, kind=kind, status="skip", detail="off (no gap set: --max-prefix-cache-gap)")
    server = summary.server
    reuse = server.workload_prefix if server is not None else None
    if reuse is None:  # a run whose server.jsonl read nothing has no server block to hold it
        reuse = sent_reusable_prefix(run)
    judged = run.records.frame
    judged = judged[judged.stage.isin([s.name for s in run.manifest.judged_stages]) & (judged.status == "ok")]
    told = judged[judged.cached_tokens.notna()]
    hit, source = (
        (float(told.cached_tokens.sum() / told.prompt_tokens.sum()), "the requests' usage (cached_tokens)")
        if len(told) and told.prompt_tokens.sum() > 0
        else (server.prefix_cache_hit_rate if server is not None else None, "the server's /metrics counters")
    )
    if hit is None:
        unknown = "the server's hit rate: neither cached_tokens in the usage nor prefix-cache counters in /metrics"
        return Check(name=name, kind=kind, status="inconclusive", detail=f"cannot tell without {unknown}")
    could = reuse.ceiling if reuse is not None else None
    if could is None or could.share is None:
        unknown = "what the prompts sent could hit: the workload file is gone, or no prompt was counted"
        return Check(name=name, kind=kind, status="inconclusive", detail=f"cannot tell without {unknown}")
    below = could.share - hit
    return Check(
        name=name,
        kind=kind,
        status="fail" if below > gap else "pass",
        detail=f"{hit:.1%} from cache, by {source}, where the prompts sent could hit {could.share:.1%} in"
        f" {could.blocks}: {max(below, 0) * 100:.1f} points below; limit {gap * 100:g}",
    )


def _release_check(run: Run) -> Check:
    """A run that cut streams (--cancel-share): the server must let go of what they held, while the run goes
    (it runs no more than the run has in flight) and after it (nothing left running, KV usage back where
    it was; llmload.cancel)."""
    name, kind = "release after cancelled streams", cast(CheckKind, "release")
    release, samples, records = run.manifest.server_release, run.server.frame, run.records.frame
    excess = held_excess(
        samples.t.to_numpy(dtype=float), samples.running.to_numpy(dtype=float),
        samples.waiting.to_numpy(dtype=float), records.sent_at.to_numpy(dtype=float),
        records.finished_at.to_numpy(dtype=float),
    )  # fmt: skip
    if excess is None or release is None or release.released is None:
        why = release_line(release) if release is not None else NO_SAMPLES
        return Check(name=name, kind=kind, status="skip", detail=why if excess is not None else NO_SAMPLES)
    during = (
        f"while the run went, the server ran a median {excess:+g} requests beyond the run's own in flight"
        f" (limit {HELD_EXCESS:+g}: it serves this run alone)"
    )
    failed = excess >= HELD_EXCESS or not release.released
    return Check(name=name, kind=kind, status="fail" if failed else "pass", detail=f"{during}; {release_line(release)}")


def _hold_length_check(hold: Hold, share: float | None) -> Check:
    """A hold only judges requests much shorter than itself: a probe of 10 s whose answers take 5 s
    has seen two generations of them, too few to tell a level queue from a growing one."""
    name = "hold length"
    if share is None:
        return Check(name=name, kind="hold_length", status="skip", detail="off (max_e2e_share_of_hold)")
    values, censored = _censored(hold.judged, "e2e_ms")
    if not len(values):
        return Check(name=name, kind="hold_length", status="skip", detail="no request answered in the hold")
    p99_s = float(np.percentile(values, 99)) / 1000
    at_least = "≥ " if censored.any() else ""
    long = p99_s > share * hold.duration_s
    return Check(
        name=name,
        kind="hold_length",
        status="inconclusive" if long else "pass",
        hold_needed_s=p99_s / share if long else None,
        detail=f"E2E p99 {at_least}{p99_s:.2f} s is {p99_s / hold.duration_s:.0%} of the {hold.duration_s:g} s hold"
        f" (limit {share:.0%})" + (": a hold this short cannot judge requests this long: hold longer" if long else ""),
    )


def _alert(
    name: str,
    series: pd.Series | None,
    level: float | None,
    action: AlertAction,
    window_s: float,
    *,
    unmeasured: str = "no data in the hold",
    below: bool = False,
) -> Check:
    """Fires when a window's value passes the level: above it, or `below` it."""
    if level is None:
        return Check(name=name, kind="alert", status="skip", detail="off (no level set)")
    if series is None or series.empty:
        return Check(name=name, kind="alert", status="skip", detail=f"not measured: {unmeasured}")
    at = int(series.argmin() if below else series.argmax())
    worst_at, worst = float(series.index[at]), float(series.iloc[at])
    fired = worst < level if below else worst > level
    passed_side = "≥" if below else "≤"
    fired_side = "<" if below else ">"
    return Check(
        name=name,
        kind="alert",
        status=action if fired else "pass",
        detail=f"worst {window_s:g} s window {figure(worst)} (+{worst_at:g} s into the hold) "
        f"{fired_side if fired else passed_side} level {level:g}{f' ({action})' if fired else ''}",
    )


def _hit_rates(hold: Hold, window_s: float) -> pd.Series | None:
    """The prefix-cache hit rate of each window of the hold: the growth of vLLM's hit and query
    counters in it (a counter reset counts as no growth)."""
    counters = hold.server.dropna(subset=["t", "prefix_cache_queries_total"]).sort_values("t")
    if len(counters) < 2:
        return None
    grown = counters[["prefix_cache_hits_total", "prefix_cache_queries_total"]].diff().clip(lower=0)
    hits = hold.windows(counters.t, grown.prefix_cache_hits_total, window_s, windows.total)
    queries = hold.windows(counters.t, grown.prefix_cache_queries_total, window_s, windows.total)
    rates = (hits / queries[queries > 0]).dropna()
    return rates if len(rates) else None


def _hold(run: Run, stage: Stage) -> Hold:
    start = run.manifest.started_at + stage.start_s
    end = start + stage.duration_s
    df, server = run.records.frame, run.server.frame
    in_window = (df.sent_at >= start) & (df.sent_at < end)
    return Hold(
        stage=stage,
        start=start,
        drain_s=run.manifest.drain_s,
        ok=df.loc[(df.status == "ok") & in_window, ["sent_at", "ttft_ms", "e2e_ms"]],
        judged=df.loc[
            (df.stage == stage.name) & df.status.isin(ANSWERED_STATUSES),
            ["status", "sent_at", "finished_at", "ttft_ms", "ttfo_ms", "e2e_ms"],
        ],
        spans=df.loc[df.sent_at.notna(), ["status", "sent_at", "finished_at"]],
        server=server[(server.t >= start) & (server.t < end)],
    )


def _starved(hold: Hold, criteria: DriftCriteria) -> str | None:
    """Why the latency drifts may lack windows although the hold sent requests in enough of them: some
    did not finish. None when nothing is unfinished or too few windows had sends anyway."""
    if not hold.unfinished:
        return None
    judged = hold.judged
    sent = hold.windows(judged.sent_at, pd.Series(1.0, index=judged.index), criteria.window_s, windows.total)
    if len(sent) < criteria.min_windows:
        return None
    return (
        f"requests were sent in {len(sent)} windows, but {hold.unfinished} of {len(judged)} were still running"
        f" after the {hold.drain_s:g} s drain"
    )


def evaluate(run: Run, summary: Summary, criteria: SoakCriteria) -> SoakResult:
    """Every check of the hold, from the run and its summary (computed once, at the end of the run);
    raises InputError when the run has no record to judge."""
    manifest, df = run.manifest, run.records.frame
    if df.empty:
        raise InputError(f"{run.path}: no request records")
    stage = manifest.stages[-1]
    hold = _hold(run, stage)
    hold_summary = summary.stages[-1]
    starved = _starved(hold, criteria.drift)
    judged_failures = df[df.status.isin(["failed", "unfinished"])].error_category.value_counts().to_dict()
    checks = [
        _oom_check(judged_failures),
        *_rate_checks(hold_summary, criteria, hold),
        _keeping_up(hold, criteria.drift, criteria.keeping_up),
        _hold_length_check(hold, criteria.max_e2e_share_of_hold),
        _slo_check("p99 TTFT SLO", hold, "ttft_ms", criteria.slo_ttft_p99_ms, "--slo-ttft-p99-ms"),
        _slo_check("p99 TTFO SLO", hold, "ttfo_ms", criteria.slo_ttfo_p99_ms, "--slo-ttfo-p99-ms"),
        _slo_check("p99 E2E SLO", hold, "e2e_ms", criteria.slo_e2e_p99_ms, "--slo-e2e-p99-ms"),
        _goodput_check(hold_summary, criteria.min_goodput_ratio, manifest),
        _prefix_cache_check(run, summary, criteria.max_prefix_cache_gap),
        *_drift_checks(hold, criteria.drift, manifest, starved),
        *_alert_checks(hold, criteria.alerts, manifest),
    ]
    if manifest.cancel is not None:
        checks.append(_release_check(run))
    if starved is None:
        checks = _latency_drift_behind_an_unknown_queue(checks)
    return SoakResult(run_id=manifest.run_id, hold=stage.name, checks=checks)


def _unmeasured(manifest: RunManifest, field: str, otherwise: str = NO_SAMPLES) -> str:
    """Why a server figure is missing from the hold: a kind of server that does not export it is named."""
    server = manifest.server
    if server is not None and field in server_kind(server.kind).not_exported():
        return f"not exported by {server.label}"
    return otherwise


def _drift_checks(hold: Hold, drift: DriftCriteria, manifest: RunManifest, starved: str | None) -> list[Check]:
    """Nothing may keep growing through the hold: the latencies, KV-cache usage, the waiting queue, preemptions."""
    window_s, floors, lag = drift.window_s, drift.min_rise, hold.lag(drift.window_s)
    check = functools.partial(_drift, hold=hold, criteria=drift)
    rates = _preemption_rate(hold.server)
    preemptions = hold.windows(rates.t, rates.value, window_s, windows.mean) if len(rates) else None
    return [
        check("p99 TTFT drift", "ms", hold.ok_p99("ttft_ms", window_s), floors.ttft_p99_ms, starved=starved, lag=lag),
        check("p99 E2E drift", "ms", hold.ok_p99("e2e_ms", window_s), floors.e2e_p99_ms, starved=starved, lag=lag),
        check(
            "KV-cache usage drift", "", hold.server_series("kv_cache_usage", window_s), floors.kv_cache_usage,
            unmeasured=_unmeasured(manifest, "kv_cache_usage"),
        ),
        check(
            "waiting-queue drift", "requests", hold.server_series("waiting", window_s), floors.waiting,
            unmeasured=_unmeasured(manifest, "waiting"),
        ),
        check(
            "preemption-rate drift", "/s", preemptions, floors.preemptions_per_s,
            unmeasured=_unmeasured(manifest, "preemptions_total"),
        ),
    ]  # fmt: skip


def _alert_checks(hold: Hold, alerts: AlertCriteria, manifest: RunManifest) -> list[Check]:
    """A window of the hold past a level: the server near its limits, whatever the trend."""
    window_s, levels, actions = min(alerts.window_s, hold.duration_s), alerts.levels, alerts.actions
    return [
        _alert(
            "KV-cache usage alert", hold.server_series("kv_cache_usage", window_s),
            levels.kv_cache_usage, actions.kv_cache_usage, window_s, unmeasured=_unmeasured(manifest, "kv_cache_usage"),
        ),
        _alert(
            "waiting-queue alert", hold.server_series("waiting", window_s), levels.waiting, actions.waiting,
            window_s, unmeasured=_unmeasured(manifest, "waiting"),
        ),
        _alert("p99 E2E alert", hold.ok_p99("e2e_ms", window_s), levels.e2e_p99_ms, actions.e2e_p99_ms, window_s),
        _alert(
            "GPU memory alert", hold.server_series("gpu_memory_usage", window_s),
            levels.gpu_memory_used, actions.gpu_memory_used, window_s, unmeasured=NO_GPU,
        ),
        _alert(
            "prefix-cache hit-rate alert", _hit_rates(hold, window_s), levels.prefix_cache_hit_rate,
            actions.prefix_cache_hit_rate, window_s, below=True,
            unmeasured=_unmeasured(manifest, "prefix_cache_queries_total", NO_PREFIX_CACHE),
        ),
    ]  # fmt: skip


LATENCY_DRIFTS = ("p99 TTFT drift", "p99 E2E drift")


def _latency_drift_behind_an_unknown_queue(checks: list[Check]) -> list[Check]:
    """A latency rise is a drift only where the queue in front of it is known to be level: when keeping
    up cannot tell (a slow queue wanders for longer than the hold), the rise may be that wander, and a
    healthy one-slot server at 0.85 of its capacity failed 5% of its soaks on it. So the drift cannot
    tell either (INCONCLUSIVE, never a PASS)."""
    if next(c for c in checks if c.kind == "keeping_up").status != "inconclusive":
        return checks
    note = "; but whether the queue in front of it is level cannot be told in this hold (keeping up), so the rise"
    note += " may be its wander"
    unsure = {"status": "inconclusive", "marginal": False}
    return [
        c.model_copy(update={**unsure, "detail": c.detail + note})
        if c.name in LATENCY_DRIFTS and c.status == "fail"
        else c
        for c in checks
    ]
