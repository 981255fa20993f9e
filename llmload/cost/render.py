"""The cost in words, for report.md and report.html alike: energy per token, or why there is none
(never a 0 that reads as free), and price per 1M tokens with where the price came from."""

from __future__ import annotations

from llmload.format import figure, fmt
from llmload.models import CostFigures, CostSummary


def _usd(value: float | None) -> str:
    return "–" if value is None else f"${figure(value)}"


def _gpus(cost: CostSummary) -> str:
    kinds = f" ({', '.join(cost.gpu_kinds)})" if cost.gpu_kinds else ""
    return f"{cost.gpu_count} GPU{'s' if cost.gpu_count != 1 else ''}{kinds}"


def energy_line(cost: CostSummary) -> str:
    hold = cost.hold
    if hold.energy_j is None:
        seen = f" from {_gpus(cost)}" if cost.gpu_count else ""
        return f"Energy: {cost.energy_note}{seen}; no J per token."
    how = "energy counters" if cost.energy_source == "counter" else "power draw, integrated over the samples"
    if hold.joules_per_output_token is None:
        return (
            f"Energy (judged stages): {fmt(hold.energy_j / 1000, 2)} kJ from the {how} of {_gpus(cost)};"
            " no output tokens to divide it by."
        )
    return (
        f"Energy (judged stages): {fmt(hold.energy_j / 1000, 2)} kJ over {fmt(hold.seconds, 0)} s, from the"
        f" {how} of {_gpus(cost)}: {figure(hold.joules_per_output_token)} J per output token,"
        f" {fmt(hold.output_tokens_per_kj, 0)} output tokens per kJ."
    )


def price_line(cost: CostSummary) -> str | None:
    hold = cost.hold
    if cost.price_source is None:
        return f"Price: {cost.price_note}." if cost.price_note else None
    return (
        f"Price (judged stages): {_usd(hold.usd_per_1m_output_tokens)} per 1M output tokens,"
        f" {_usd(hold.usd_per_1m_input_tokens)} per 1M input tokens (each the whole {_usd(hold.usd)} of the"
        f" stages, at ${figure(cost.gpu_hour_usd or 0)} per GPU-hour: {cost.price_source})."
    )


def cost_lines(cost: CostSummary | None) -> list[str]:
    """The report's sentences on what the answers cost; none for a run before prices were recorded."""
    if cost is None:
        return []
    return [energy_line(cost), *filter(None, [price_line(cost)])]


def _row(name: str, figures: CostFigures) -> str:
    energy = "–" if figures.energy_j is None else fmt(figures.energy_j / 1000, 2)
    return (
        f"| {name} | {fmt(figures.seconds, 0)} | {fmt(figures.output_tokens, 0)} | {energy}"
        f" | {fmt(figures.joules_per_output_token, 3)} | {fmt(figures.output_tokens_per_kj, 0)}"
        f" | {_usd(figures.usd_per_1m_output_tokens)} | {_usd(figures.usd_per_1m_input_tokens)} |"
    )


def cost_table(cost: CostSummary | None) -> list[str]:
    """report.md's cost by stage, when there is energy or a price to put in it."""
    if cost is None or (cost.hold.energy_j is None and cost.hold.usd is None):
        return []
    return [
        "",
        "## Cost by stage",
        "",
        "| stage | s | output tokens | energy kJ | J / output token | output tok / kJ | $ / 1M output | $ / 1M input |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(_row(stage.name, stage) for stage in cost.stages),
        _row("judged stages", cost.hold),
    ]
