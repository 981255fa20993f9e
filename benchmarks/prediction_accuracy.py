"""How far `llmload predict` is from public measurements of vLLM on GPUs: every point of
tests/data/gputruth predicted from its config file and GPU alone, each figure's ratio predicted /
measured, and per figure the median, the worst and how many fall in the issue's bands. Rewrites the
tables of docs/prediction.md (a few seconds)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from benchmarks import write_between_markers
from llmload.perf.roofline import EFFICIENCY, Efficiency
from llmload.predict.points import accuracy, load_points, predict_point

POINTS = Path(__file__).parent.parent / "tests" / "data" / "gputruth" / "points.yaml"
DOC = Path(__file__).parent.parent / "docs" / "prediction.md"


def _value(value: float) -> str:
    return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    began = time.time()
    points = load_points(POINTS)
    predictions = [predict_point(point, POINTS.parent) for point in points]
    rows = ["| point | GPU | setup | figure | measured | predicted | ratio |", "|---|---|---|---|---:|---:|---:|"]
    for p in predictions:
        setup = p.point.setup.split(",")[0]
        for figure, ratio in p.ratios.items():
            rows.append(
                f"| {p.point.id} | {p.point.gpu} | {setup} | {figure} | {_value(p.point.measured[figure])} | "
                f"{_value(p.predicted[figure])} | {ratio:.2f} |"
            )
    summary = ["| figure | points | median ratio | worst ratio | within band |", "|---|---:|---:|---:|---|"]
    for r in accuracy(predictions):
        summary.append(
            f"| {r.figure} | {r.points} | {r.median_ratio:.2f} | {r.worst_ratio:.2f} | "
            f"{r.within_band}/{r.points} in {r.band[0]:g}–{r.band[1]:g} |"
        )
    sources = ["| point | source |", "|---|---|"] + [f"| {p.id} | {p.source} |" for p in points]
    constants = ["| constant | value | what it is |", "|---|---:|---|"] + [
        f"| `{name}` | {getattr(EFFICIENCY, name):g} | {field.description} |"
        for name, field in Efficiency.model_fields.items()
        if name != "fitted_on"
    ]
    constants.append(f"\nFitted on: {EFFICIENCY.fitted_on}.")
    write_between_markers(DOC, "<!-- constants:begin -->", "<!-- constants:end -->", "\n".join(constants))
    write_between_markers(DOC, "<!-- accuracy:begin -->", "<!-- accuracy:end -->", "\n".join(summary))
    write_between_markers(DOC, "<!-- points:begin -->", "<!-- points:end -->", "\n".join(rows))
    write_between_markers(DOC, "<!-- sources:begin -->", "<!-- sources:end -->", "\n".join(sources))
    print("\n".join(summary))
    print(f"\n{len(points)} points predicted in {time.time() - began:.1f} s; constants: {EFFICIENCY.fitted_on}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
