"""`llmload compare --baseline history:DIR CURRENT`: the current run judged against the last N runs under
DIR comparable with it (same workload, server configuration and plan: llmload.history.runs), figure by
figure, by `history_gate` (llmload.history.changes), which weighs the spread between runs as well as
within them.

The gated figures are FIGURES' `gated` ones: TTFT, TPOT, ITL and E2E at p50/p95/p99 (ms, higher is
worse) and output tok/s and goodput (lower is worse). Those two are judged as their reciprocals
(seconds per output token, per good request), so that for every figure a higher value is worse and
a relative limit means the same size of change either way; the table prints them as measured. The
current run's own noise is not passed (`within` None): summary.json keeps no standard error.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

from llmload.errors import InputError
from llmload.history.changes import history_gate
from llmload.history.runs import FIGURES, HistoryRun, comparable, read_runs
from llmload.history.trend import figure_text, relative_text

BASELINE_PREFIX = "history:"
DEFAULT_RUNS = 10
MIN_RUNS = 2  # history_gate's: a spread needs two runs


@dataclass(frozen=True)
class GateRow:
    """One figure judged: the previous runs' median and the current value (as measured), the limit and the
    spread as history_gate gave them (on the judged scale: a reciprocal for lower-is-worse figures)."""

    title: str
    unit: str
    previous: int  # runs that had the figure
    median: float
    current: float
    limit: float
    spread: float
    regressed: bool
    reason: str


@dataclass(frozen=True)
class HistoryJudgement:
    current: HistoryRun
    previous: list[HistoryRun]  # oldest first
    rows: list[GateRow]
    skipped: list[str]  # figures not judged, with why

    @property
    def regressed(self) -> bool:
        return any(row.regressed for row in self.rows)


def _scale(value: float, higher_is_worse: bool) -> float:
    return value if higher_is_worse else 1 / value


def judge(history_dir: Path, current_dir: Path, runs: int = DEFAULT_RUNS) -> HistoryJudgement:
    """The current run against the last `runs` comparable runs under `history_dir` (the current run itself
    left out). An InputError when the current run is not finished, or no run under the directory is
    comparable with it (naming how many there were and why each group differs)."""
    if runs < MIN_RUNS:
        raise InputError(f"--history-runs {runs}: give at least {MIN_RUNS} (the spread between runs needs two)")
    found, _ = read_runs([current_dir])
    mine = [run for run in found if Path(run.path) == current_dir.resolve()]
    if not mine:
        raise InputError(f"{current_dir} is not a finished run (run.json and summary.json)")
    current = mine[0]
    history, unfinished = read_runs([history_dir])
    history = [run for run in history if Path(run.path) != Path(current.path)]
    kept, apart = comparable(history, current)
    if len(kept) < MIN_RUNS:
        reasons = sorted({run.reason for run in apart})
        said = "".join(f"; {reason}" for reason in reasons[:3])
        raise InputError(
            f"{len(kept)} run(s) under {history_dir} comparable with {current_dir} (same workload, server"
            f" configuration and plan), and the gate needs {MIN_RUNS}: {len(history)} finished there,"
            f" {len(apart)} of them not comparable, {len(unfinished)} unfinished or unreadable{said}"
        )
    previous = kept[-runs:]
    rows: list[GateRow] = []
    skipped: list[str] = []
    for figure in (f for f in FIGURES if f.gated):
        value = current.figures.get(figure.key)
        past = [v for run in previous if (v := run.figures.get(figure.key)) is not None]
        if value is None or len(past) < MIN_RUNS:
            why = (
                "not in this run" if value is None else f"in {len(past)} of the previous runs, and it needs {MIN_RUNS}"
            )
            skipped.append(f"{figure.title}: {why}")
            continue
        if not figure.higher_is_worse and (value <= 0 or min(past) <= 0):
            skipped.append(f"{figure.title}: 0 in a run, so it has no reciprocal to judge")
            continue
        result = history_gate([_scale(v, figure.higher_is_worse) for v in past],
                              _scale(value, figure.higher_is_worse), None)  # fmt: skip
        rows.append(
            GateRow(
                figure.title,
                figure.unit,
                len(past),
                statistics.median(past),
                value,
                result.limit,
                result.spread,
                result.regressed,
                result.reason,
            )
        )
    return HistoryJudgement(current, previous, rows, skipped)


def render_text(judgement: HistoryJudgement) -> str:
    """The gate's table: each figure, the previous runs' median, the current value, the verdict and why."""
    previous = judgement.previous
    lines = [
        f"{judgement.current.run_id} against the last {len(previous)} comparable run(s)"
        f" ({previous[0].run_id} … {previous[-1].run_id}): {judgement.current.workload},"
        f" {judgement.current.config}, {judgement.current.plan}",
        "",
        f"{'figure':<24}{'unit':>7}{'runs':>6}{'median':>10}{'current':>10}{'change':>9}  verdict",
    ]
    for row in judgement.rows:
        change = relative_text(row.current / row.median - 1) if row.median else "–"
        verdict = "REGRESSION" if row.regressed else "ok"
        lines.append(
            f"{row.title:<24}{row.unit:>7}{row.previous:>6}{figure_text(row.median, row.unit):>10}"
            f"{figure_text(row.current, row.unit):>10}{change:>9}  {verdict}: {row.reason}"
        )
    lines += [f"not judged: {line}" for line in judgement.skipped]
    lines.append("REGRESSION" if judgement.regressed else "no regression")
    return "\n".join(lines) + "\n"


def history_dir(baseline: str) -> Path | None:
    """The directory of a `history:DIR` baseline; None for a run directory; an InputError for `history:`
    without a directory."""
    if not baseline.startswith(BASELINE_PREFIX):
        return None
    if not baseline[len(BASELINE_PREFIX) :]:
        raise InputError(f"--baseline {baseline!r}: expected {BASELINE_PREFIX}DIR, the folder of earlier runs")
    return Path(baseline[len(BASELINE_PREFIX) :])
