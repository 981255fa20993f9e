"""The Pareto frontier drawn (llmload.report.pareto finds it): apart from the points so that a sweep or
a search that has drawn nothing yet (its --help, a refusal) does not import matplotlib."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from llmload.models import ParetoPoint
from llmload.report.html import drawing, legend, svg_data_uri, tight_bbox
from llmload.report.pareto import throughput_axis


def chart(points: Sequence[ParetoPoint]) -> Figure | None:
    """Every point in its configuration's colour, labelled with its rate, hollow where it did not pass;
    the frontier ringed and drawn as the staircase that bounds what the points reach."""
    if not points:
        return None
    fig = Figure(figsize=(10, 5))
    ax = fig.subplots()
    configurations = list(dict.fromkeys(p.configuration for p in points))
    for index, configuration in enumerate(configurations):
        color = f"C{index % 10}"
        mine = [p for p in points if p.configuration == configuration]
        xs, ys = [p.tokens_per_s_per_user for p in mine], [p.output_tokens_per_s_per_gpu for p in mine]
        faces = [color if p.passed else "none" for p in mine]
        ax.scatter(xs, ys, s=36, c=faces, edgecolors=color, linewidths=1.2, zorder=3,
                   label=configuration or "probes")  # fmt: skip
        for p, x, y in zip(mine, xs, ys, strict=True):
            ax.annotate(f"{p.qps:g}", (x, y), xytext=(4, 4), textcoords="offset points", fontsize=7, color="0.3")
    best = sorted((p for p in points if p.on_frontier), key=lambda p: p.tokens_per_s_per_user)
    if best:  # none before a point passed
        xs, ys = [p.tokens_per_s_per_user for p in best], [p.output_tokens_per_s_per_gpu for p in best]
        ax.step(xs, ys, where="pre", color="0.2", linewidth=1, zorder=2)
        ax.scatter(xs, ys, s=130, facecolors="none", edgecolors="0.2", linewidths=1, zorder=2, label="the frontier")
    handles, _ = ax.get_legend_handles_labels()
    if not all(p.passed for p in points):
        handles.append(Line2D([], [], marker="o", linestyle="", markerfacecolor="none", markeredgecolor="0.4",
                              label="hollow: failed or not judged"))  # fmt: skip
    ax.set_xlabel("tok/s per user (1000 / TPOT p50); each point labelled with its rate, req/s")
    ax.set_ylabel(throughput_axis(points))
    legend(ax, handles=handles)
    return fig


def chart_uri(points: Sequence[ParetoPoint], salt: str) -> str | None:
    """The chart as an SVG data: URI, for a page whose policy loads images from nowhere else."""
    with drawing():
        figure = chart(points)
        return svg_data_uri(figure, salt) if figure is not None else None


def write_png(points: Sequence[ParetoPoint], path: Path, title: str) -> None:
    """The chart as a PNG of its own, to paste where an HTML page cannot go."""
    with drawing():
        figure = chart(points)
        if figure is None:
            return
        figure.suptitle(title)
        figure.savefig(path, format="png", dpi=150, bbox_inches=tight_bbox(figure))
