"""How far a prediction held: a simulated search and staged run (predicted) against the same on the
real server (measured), as one table of ratios with the goals they are judged by.

The goals are the ones a team deciding what to deploy needs: the highest passing rate within 10%,
TTFT, ITL and E2E medians within 0.85–1.15 of the real ones at each stage, and preemptions that
begin at the same stage. Any caller with two searches or two run directories (the fidelity
benchmark, a sweep's prediction column) builds the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from llmload.models import SearchResult
from llmload.rundir import require_summary

RATE_TOLERANCE = 0.10
LATENCY_RATIOS = (0.85, 1.15)


@dataclass(frozen=True)
class StageFigures:
    """What one judged stage of a run measured, as the table compares it."""

    name: str
    ttft_p50_ms: float | None
    itl_p50_ms: float | None
    e2e_p50_ms: float | None
    preemptions: float | None


def stage_figures(run_dir: Path) -> list[StageFigures]:
    """Each judged stage's TTFT, ITL (every gap) and E2E medians over its successful requests, and the
    preemptions vLLM counted during it, as its summary.json holds them."""
    return [
        StageFigures(s.name, s.ttft_p50_ms, s.itl_p50_ms, s.e2e_p50_ms, s.preemptions)
        for s in require_summary(run_dir).stages
        if not s.warmup
    ]


class FidelityRow(BaseModel):
    """One compared figure: predicted (the simulator) against measured (the real server)."""

    figure: str
    predicted: float | str | None
    measured: float | str | None
    ratio: float | None = None
    goal: str
    met: bool | None = None


def _ratio(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured if predicted is not None and measured else None


def compare_search(predicted: SearchResult, measured: SearchResult) -> FidelityRow:
    ratio = _ratio(predicted.passing_qps, measured.passing_qps)
    return FidelityRow(
        figure="highest passing rate (req/s)",
        predicted=predicted.passing_qps,
        measured=measured.passing_qps,
        ratio=ratio,
        goal=f"within {RATE_TOLERANCE:.0%}",
        met=None if ratio is None else abs(ratio - 1) <= RATE_TOLERANCE + 1e-9,
    )


def preemption_start(stages: Sequence[StageFigures]) -> str:
    """The first stage during which vLLM preempted, or 'none'."""
    return next((s.name for s in stages if s.preemptions), "none")


def compare_stages(predicted: Sequence[StageFigures], measured: Sequence[StageFigures]) -> list[FidelityRow]:
    """Per stage, the medians' ratios; then the stage where preemptions start."""
    low, high = LATENCY_RATIOS
    rows = []
    for sim, real in zip(predicted, measured, strict=True):
        for label, attr in (("TTFT", "ttft_p50_ms"), ("ITL", "itl_p50_ms"), ("E2E", "e2e_p50_ms")):
            p, m = getattr(sim, attr), getattr(real, attr)
            ratio = _ratio(p, m)
            rows.append(
                FidelityRow(
                    figure=f"{real.name}: {label} p50 (ms)",
                    predicted=p,
                    measured=m,
                    ratio=ratio,
                    goal=f"{low:g}–{high:g}",
                    met=None if ratio is None else low <= ratio <= high,
                )
            )
    sim_start, real_start = preemption_start(predicted), preemption_start(measured)
    rows.append(
        FidelityRow(
            figure="preemptions start at stage",
            predicted=sim_start,
            measured=real_start,
            goal="same stage",
            met=sim_start == real_start,
        )
    )
    return rows


def _cell(value: float | str | None) -> str:
    if value is None:
        return "–"
    return value if isinstance(value, str) else f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"


def _ratio_cell(row: FidelityRow) -> str:
    return "–" if row.ratio is None else f"{row.ratio:.2f}"


def _again_cell(row: FidelityRow) -> str:
    """A repeat's ratio, or for a stage name the second run's and the first's."""
    return f"{row.predicted} / {row.measured}" if isinstance(row.predicted, str) else _ratio_cell(row)


def render_fidelity(rows: Sequence[FidelityRow], repeat: Sequence[FidelityRow] | None = None) -> str:
    """The rows as a Markdown table: figure, predicted, measured, ratio, goal, met. `repeat`, the same
    rows for a second real run against the first, adds its ratios: how far the server moves by itself,
    the floor under any prediction's error."""
    head, rule = "| figure | predicted (sim) | measured (real) | ratio |", "|---|---:|---:|---:|"
    if repeat is not None:
        head, rule = head + " real again / real |", rule + "---:|"
    lines = [head + " goal | met |", rule + "---|---|"]
    for i, row in enumerate(rows):
        met = "–" if row.met is None else "yes" if row.met else "**no**"
        cells = [row.figure, _cell(row.predicted), _cell(row.measured), _ratio_cell(row)]
        if repeat is not None:
            cells.append(_again_cell(repeat[i]))
        lines.append("| " + " | ".join([*cells, row.goal, met]) + " |")
    return "\n".join(lines)
