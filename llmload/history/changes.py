"""Change points in a figure's series across runs, and the gate of one run against the runs before it.

Both work on log-values when every value is positive (a latency, a throughput: steps are relative, and
run-to-run noise is closer to normal in logs), on the values themselves otherwise (an error rate or an
OOM count that is sometimes 0).

Change points (`find_change_points`) follow Apache Otava's (formerly Hunter's) split-and-merge, Fleming
et al., "Hunter: Using Change Point Detection to Hunt for Performance Regressions", ICPE 2023
(https://doi.org/10.1145/3578244.3583719): the split step cuts the series recursively at its best single
split while Student's two-sample t-test between the two sides gives p < SPLIT_P_VALUE (Otava's first
pass: ten times the final level), or at its best pair of splits when the middle against the two ends
does (a level that came and went, which E-divisive finds by searching a segment's end as well as its
start); the merge step then drops, one at a time, the change point whose t-test against its
neighbouring segments is weakest until every one has p < MAX_P_VALUE. The splits are ruptures' exact
least-squares segmentation (`ruptures.Dynp(model="l2")`; one split: the one with the largest pooled t
statistic). Otava itself is not used: 0.8.0, its only release on PyPI, pins numpy to
exactly 2.2.0 and brings BigQuery, Postgres and Slack clients.

The gate (`history_gate`) is the one-sided prediction interval of a new run from the previous runs'
log-values (Student's t with N − 1 degrees of freedom), widened when the current run's own noise is
larger than the runs' spread.

MAX_P_VALUE, MIN_SEGMENT and GATE_LEVEL were set by simulation against the harness's servers of known
capacity (`python -m benchmarks.history_changes`; docs/gates.md, "Change points across releases").
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import ruptures
from scipy import stats

MAX_P_VALUE = 0.0002  # a change point is kept when its t-test p is below this (stationary 30-run series: ≤ 1%)
SPLIT_P_VALUE = 10 * MAX_P_VALUE  # Otava's first pass: weak change points, filtered by the merge step
MIN_SEGMENT = 3  # runs on each side of a split: a step can be found once 3 runs after it exist
STEP_CONFIDENCE = 0.95  # two-sided, of the step's interval
GATE_LEVEL = 0.995  # one-sided level of the gate's prediction interval: ≤ 1% false alarms on a steady figure


@dataclass(frozen=True)
class ChangePoint:
    index: int  # position in the series of the first run after the step
    before: float  # mean of the segment before
    after: float  # mean of the segment after
    step: float  # relative change: after / before - 1
    step_low: float  # 95% interval of the relative step
    step_high: float
    p_value: float


@dataclass(frozen=True)
class GateResult:
    regressed: bool
    limit: float  # the value above which `current` counts as a regression
    spread: float  # between-run relative standard deviation of `previous`
    reason: str  # one sentence a release manager reads


def _scaled(values: np.ndarray) -> tuple[np.ndarray, bool]:
    """The values on the scale they are tested on: their logs when all are positive (True), else themselves."""
    if bool((values > 0).all()):
        return np.log(values), True
    return values, False


def _pooled(left: np.ndarray, right: np.ndarray) -> tuple[float, float, int]:
    """Difference of the means (right − left), its standard error from the pooled variance, and the
    degrees of freedom: Student's two-sample t-test."""
    df = len(left) + len(right) - 2
    ss = float(((left - left.mean()) ** 2).sum() + ((right - right.mean()) ** 2).sum())
    se = math.sqrt(ss / df * (1 / len(left) + 1 / len(right))) if df > 0 else math.inf
    return float(right.mean() - left.mean()), se, df


def _p_value(left: np.ndarray, right: np.ndarray) -> float:
    """Two-sided p of Student's t-test that both sides have one mean; 0 for two constant sides that
    differ, 1 for identical ones."""
    diff, se, df = _pooled(left, right)
    if se == 0:
        return 0.0 if diff else 1.0
    return float(2 * stats.t.sf(abs(diff) / se, df)) if math.isfinite(se) else 1.0


def _best_cuts(x: np.ndarray, cuts: int) -> list[int]:
    """The `cuts` breakpoints that split x best, MIN_SEGMENT apart: ruptures' exact segmentation by
    dynamic programming (`ruptures.Dynp`) with the least-squares cost."""
    return ruptures.Dynp(model="l2", min_size=MIN_SEGMENT, jump=1).fit(x).predict(n_bkps=cuts)[:-1]


def _split(x: np.ndarray, start: int, end: int, found: list[int]) -> None:
    """Otava's split step on x[start:end]: its best single split when the t-test between the two sides
    gives p < SPLIT_P_VALUE, else its best pair of splits when the middle against the two ends does (a
    level that came and went: E-divisive's search over the segment's end as well as its start), then
    each piece in turn."""
    if end - start < 2 * MIN_SEGMENT:
        return
    segment = x[start:end]
    (cut,) = _best_cuts(segment, 1)
    if _p_value(segment[:cut], segment[cut:]) < SPLIT_P_VALUE:
        cuts = [cut]
    elif end - start >= 3 * MIN_SEGMENT:
        first, second = _best_cuts(segment, 2)
        outside = np.r_[segment[:first], segment[second:]]
        if _p_value(outside, segment[first:second]) >= SPLIT_P_VALUE:
            return
        cuts = [first, second]
    else:
        return
    bounds = [start, *(start + c for c in cuts), end]
    found.extend(bounds[1:-1])
    for left, right in itertools.pairwise(bounds):
        _split(x, left, right, found)


def _merge(x: np.ndarray, cuts: list[int]) -> list[tuple[int, float]]:
    """Otava's merge step: while the weakest change point (its segment against the next) has p at or
    above MAX_P_VALUE, drop it; the survivors with their p."""
    cuts = sorted(cuts)
    while cuts:
        bounds = [0, *cuts, len(x)]
        p = [_p_value(x[bounds[i] : bounds[i + 1]], x[bounds[i + 1] : bounds[i + 2]]) for i in range(len(cuts))]
        weakest = int(np.argmax(p))
        if p[weakest] < MAX_P_VALUE:
            return list(zip(cuts, p, strict=True))
        del cuts[weakest]
    return []


def _step(values: np.ndarray, x: np.ndarray, logs: bool, before: slice, after: slice) -> tuple[float, ...]:
    """Means before and after, the relative step and its STEP_CONFIDENCE interval: Student's t interval
    of the difference of the log-means, set around the ratio of the means (on the values themselves
    when they are not all positive, relative to the mean before)."""
    mean_before, mean_after = float(values[before].mean()), float(values[after].mean())
    diff, se, df = _pooled(x[before], x[after])
    reach = float(stats.t.ppf(0.5 + STEP_CONFIDENCE / 2, df)) * se
    if mean_before == 0:
        return mean_before, mean_after, math.inf, math.inf, math.inf
    step = mean_after / mean_before - 1
    if logs:
        return mean_before, mean_after, step, (1 + step) * math.exp(-reach) - 1, (1 + step) * math.exp(reach) - 1
    return mean_before, mean_after, step, (diff - reach) / mean_before, (diff + reach) / mean_before


def find_change_points(values: Sequence[float]) -> list[ChangePoint]:
    """The runs where a figure's level steps, in order: `values` are the figure in run order (finite,
    no NaN; any unit, any length; fewer than 2 × MIN_SEGMENT values have none).

    Each change point's `index` is the first run after the step; `before` and `after` are the means of
    the segments between its neighbouring change points (or the series' ends); `step` is after / before
    − 1, math.inf when `before` is 0, with its 95% interval; `p_value` is the t-test's between those
    segments. Raises ValueError for a value that is not finite.

    Measured (docs/gates.md): on stationary 30-run series of soak figures a change point is reported in
    ≤ 1% of series; a 10% step in TTFT p99 or E2E p50 is found at its run ± 1 once 3 runs after it exist."""
    series = np.asarray(values, dtype=float)
    if not np.isfinite(series).all():
        raise ValueError("a figure's series must be finite: drop the runs without it first")
    x, logs = _scaled(series)
    found: list[int] = []
    _split(x, 0, len(x), found)
    kept = _merge(x, found)
    bounds = [0, *(cut for cut, _ in kept), len(x)]
    out = []
    for i, (cut, p) in enumerate(kept):
        before, after = slice(bounds[i], cut), slice(cut, bounds[i + 2])
        mean_before, mean_after, step, low, high = _step(series, x, logs, before, after)
        out.append(ChangePoint(cut, mean_before, mean_after, step, low, high, p))
    return out


def history_gate(previous: Sequence[float], current: float, within: float | None) -> GateResult:
    """Whether `current` (this run's value of a figure where higher is worse) is a regression against
    `previous` (the figure in the last N comparable runs, oldest first, N ≥ 2, finite).

    The limit is the one-sided GATE_LEVEL prediction bound of a new run from the previous runs' log-values
    (Student's t, N − 1 degrees of freedom): mean + t × √(max(s², within²) + s²/N), s their standard
    deviation. s already holds the previous runs' own noise, so `within` (this run's relative standard
    error, as its bootstrap measures it; None when unknown) widens the bound only where this run is
    noisier than the runs were apart. When a previous value is not positive, the same on the values
    themselves, `within` relative to their mean. `spread` is s (for logs: the relative standard
    deviation). Raises ValueError for fewer than 2 previous runs or a value that is not finite."""
    prev = np.asarray(previous, dtype=float)
    if len(prev) < 2:
        raise ValueError(f"the gate against history needs at least 2 previous runs, got {len(prev)}")
    if not (np.isfinite(prev).all() and math.isfinite(current)) or (within is not None and not math.isfinite(within)):
        raise ValueError("the gate against history needs finite values")
    x, logs = _scaled(prev)
    n = len(x)
    center, s = float(x.mean()), float(x.std(ddof=1))
    t = float(stats.t.ppf(GATE_LEVEL, n - 1))
    if logs:
        own = within or 0.0
        limit = math.exp(center + t * math.sqrt(max(s, own) ** 2 + s**2 / n))
        typical, spread = math.exp(center), s
    else:
        own = (within or 0.0) * abs(center)
        limit = center + t * math.sqrt(max(s, own) ** 2 + s**2 / n)
        typical, spread = center, s / abs(center) if center else 0.0
    # at the limit within float rounding is not above it (identical previous runs put it at their value)
    regressed = current > limit and not math.isclose(current, limit, rel_tol=1e-9)
    noise = f"{spread:.1%} apart from run to run" + (f", this run's own noise {within:.1%}" if within else "")
    verdict = "above" if regressed else "within"
    reason = (
        f"{current:.4g} is {verdict} the limit {limit:.4g}: the last {n} runs' typical {typical:.4g}, {noise},"
        f" allow up to {limit / typical - 1:+.1%} at {GATE_LEVEL:.1%} one-sided"
        if typical
        else f"{current:.4g} is {verdict} the limit {limit:.4g} set by the last {n} runs"
    )
    return GateResult(regressed, limit, spread, reason + ".")
