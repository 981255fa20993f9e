"""A history: the comparable runs in time order, each figure's series over them with its change points
(llmload.history.changes), the runs listed apart; history.json is `History`, and the console's trend
table is `render_text`."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from llmload.errors import InputError
from llmload.format import figure as said
from llmload.history.changes import find_change_points
from llmload.history.runs import FIGURES, ApartRun, Figure, HistoryRun, comparable, read_runs

HISTORY_JSON = "history.json"
HISTORY_HTML = "history.html"


class RunRef(BaseModel):
    """A run as a change point names it."""

    run_id: str
    started_at: float
    labels: dict[str, str] = Field(default_factory=dict)


class Change(BaseModel):
    """A change point of one figure's series: the run where the step happened (the first after it), the
    means before and after, the step relative to before with its 95% interval, and the runs of the
    segments either side (from the change before it, to the change after it)."""

    run: RunRef
    index: int = Field(description="the run's position in the history's runs (0: the oldest)")
    before: float
    after: float
    step: float = Field(description="after / before - 1")
    step_low: float
    step_high: float
    p_value: float
    runs_before: list[str] = Field(description="run ids of the segment before the step, oldest first")
    runs_after: list[str] = Field(description="run ids of the segment from the step on")


class FigureTrend(BaseModel):
    """One figure over the history's runs: its values in run order (None where a run has none), and what
    the table prints of them."""

    key: str
    title: str
    unit: str
    higher_is_worse: bool
    values: list[float | None]
    first: float
    last: float
    min: float
    max: float
    median_before_last: float | None = Field(description="median of the runs before the last; None: one run")
    last_vs_median: float | None = Field(description="last / median_before_last - 1")
    changes: list[Change]

    def worse(self, change: Change) -> bool:
        """Whether the step made this figure worse (higher latency, lower throughput)."""
        return (change.step > 0) == self.higher_is_worse


class History(BaseModel):
    """history.json: the runs of one comparable group, oldest first (the group of the newest finished
    run), each figure's trend over them, and the runs listed apart with why."""

    directories: list[str]
    runs: list[HistoryRun]
    apart: list[ApartRun]
    trends: list[FigureTrend]


def _trend(figure: Figure, runs: Sequence[HistoryRun]) -> FigureTrend | None:
    values = [run.figures.get(figure.key) for run in runs]
    present = [(i, value) for i, value in enumerate(values) if value is not None]
    if not present:
        return None
    series = [value for _, value in present]
    changes = []
    points = find_change_points(series)
    bounds = [0, *(point.index for point in points), len(series)]
    segment_ids = [runs[i].run_id for i, _ in present]
    for n, point in enumerate(points):
        at = runs[present[point.index][0]]
        changes.append(
            Change(
                run=RunRef(run_id=at.run_id, started_at=at.started_at, labels=at.labels),
                index=present[point.index][0],
                before=point.before,
                after=point.after,
                step=point.step,
                step_low=point.step_low,
                step_high=point.step_high,
                p_value=point.p_value,
                runs_before=segment_ids[bounds[n] : bounds[n + 1]],
                runs_after=segment_ids[bounds[n + 1] : bounds[n + 2]],
            )
        )
    median = statistics.median(series[:-1]) if len(series) > 1 else None
    return FigureTrend(
        key=figure.key, title=figure.title, unit=figure.unit, higher_is_worse=figure.higher_is_worse, values=values,
        first=series[0], last=series[-1], min=min(series), max=max(series), median_before_last=median,
        last_vs_median=series[-1] / median - 1 if median else None, changes=changes,
    )  # fmt: skip


def build_history(directories: Sequence[Path]) -> History:
    """The history of the runs under `directories` (see History); an InputError when none finished."""
    runs, apart = read_runs(directories)
    where = ", ".join(map(str, directories))
    if not runs:
        found = f": {len(apart)} unfinished or unreadable, listed with --json" if apart else ""
        raise InputError(f"no finished run (a directory with run.json and summary.json) under {where}{found}")
    tracked, others = comparable(runs, runs[-1])
    trends = [trend for figure in FIGURES if (trend := _trend(figure, tracked)) is not None]
    return History(directories=[str(d) for d in directories], runs=tracked, apart=apart + others, trends=trends)


def figure_text(value: float | None, unit: str) -> str:
    """A figure as the table says it: a share as a percent, else three significant digits."""
    if value is None:
        return "–"
    return f"{100 * value:.2f}%" if unit == "share" else said(value)


def relative_text(value: float | None) -> str:
    """A relative change, `+15.2%`."""
    return "–" if value is None else f"{100 * value:+.1f}%"


def change_words(trend: FigureTrend, change: Change) -> str:
    """`run nightly-7 (release=1.4.2) 2026-11-02 10:00: +15.2% [+9.8%, +20.1%] worse, 6 runs before, 4 from it`."""
    labels = ", ".join(f"{k}={v}" for k, v in change.run.labels.items())
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(change.run.started_at))
    interval = f"[{relative_text(change.step_low)}, {relative_text(change.step_high)}]"
    means = f"{figure_text(change.before, trend.unit)} → {figure_text(change.after, trend.unit)}"
    return (
        f"run {change.run.run_id}{f' ({labels})' if labels else ''} {when}: {relative_text(change.step)} {interval}"
        f" {'worse' if trend.worse(change) else 'better'}, {means}, p = {change.p_value:.2g};"
        f" {len(change.runs_before)} run(s) before, {len(change.runs_after)} from it"
    )


def render_text(history: History) -> str:
    """The console's trend table: per figure first, last, min, max, the last against the median of the runs
    before it, and its change points; then the runs listed apart."""
    runs = history.runs
    lines = [
        f"{len(runs)} comparable run(s), {runs[0].when} to {runs[-1].when} UTC: workload {runs[-1].workload},"
        f" {runs[-1].config}, {runs[-1].plan}",
        "",
        f"{'figure':<24}{'unit':>7}{'first':>10}{'last':>10}{'min':>10}{'max':>10}{'last vs median':>16}  changes",
    ]
    for trend in history.trends:
        vs = relative_text(trend.last_vs_median)
        lines.append(
            f"{trend.title:<24}{trend.unit:>7}" + "".join(
                f"{figure_text(v, trend.unit):>10}" for v in (trend.first, trend.last, trend.min, trend.max)
            ) + f"{vs:>16}  {len(trend.changes) or 'none'}"
        )  # fmt: skip
    changed = [(trend, change) for trend in history.trends for change in trend.changes]
    if changed:
        lines += ["", "Change points:"]
        lines += [f"  {trend.title}: {change_words(trend, change)}" for trend, change in changed]
    if history.apart:
        lines += ["", f"Listed apart ({len(history.apart)}):"]
        lines += [f"  {run.run_id} ({run.kind}): {run.reason}" for run in history.apart]
    return "\n".join(lines) + "\n"
