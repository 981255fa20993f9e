"""summary.json's `cost`: each stage's and the hold's energy and price per token. The tokens are the
throughput's (successful requests of the stage, over its planned seconds), so J per output token is
the mean power over output tok/s, and `compare` can give it output tok/s's interval."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from llmload.cost.energy import WindowEnergy, window_energy
from llmload.cost.prices import table_entry
from llmload.models import NO_ENERGY, CostFigures, CostSummary, Pricing, RunManifest, StageCost

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Price:
    """What the run's GPUs cost an hour together (None: not priced), and what to say about it."""

    usd_per_hour: float | None
    gpu_hour_usd: float | None = None
    source: str | None = None
    note: str | None = None


def run_price(pricing: Pricing | None, names: list[str | None]) -> Price:
    """The hourly price of `names` (one per GPU seen): --gpu-hour-cost each (one server-hour with no
    GPU seen), else each GPU's table entry; none when any GPU has no entry."""
    if pricing is None:
        return Price(None)
    units = len(names) or 1
    if pricing.gpu_hour_usd is not None:
        source = "--gpu-hour-cost" if names else "--gpu-hour-cost, as the server's hour (no GPU was seen)"
        return Price(pricing.gpu_hour_usd * units, pricing.gpu_hour_usd, source)
    if not names:
        return Price(None, note="no GPU was seen to price: --gpu-hour-cost USD prices the server's hour")
    entries = [table_entry(name, pricing.table) if name else None for name in names]
    missing = sorted({str(name) for name, entry in zip(names, entries, strict=True) if entry is None})
    if missing:
        return Price(
            None,
            note=f"no price for {', '.join(missing)} in {pricing.table_source}: give --gpu-hour-cost USD"
            " or --gpu-prices FILE",
        )
    total = sum(pricing.table[entry] for entry in entries if entry is not None)
    used = ", ".join(f"{entry} ${pricing.table[entry]:g}" for entry in dict.fromkeys(e for e in entries if e))
    return Price(total, total / units, f"{pricing.table_source}: {used}")


def _per(amount: float | None, tokens: float, scale: float = 1.0) -> float | None:
    return amount / tokens * scale if amount is not None and tokens > 0 else None


def _figures(seconds: float, output: float, prompt: float, energy: WindowEnergy, price: Price) -> CostFigures:
    usd = price.usd_per_hour * seconds / SECONDS_PER_HOUR if price.usd_per_hour is not None else None
    return CostFigures(
        seconds=seconds,
        output_tokens=output,
        input_tokens=prompt,
        energy_j=energy.joules,
        joules_per_output_token=_per(energy.joules, output),
        output_tokens_per_kj=output / energy.joules * 1000 if energy.joules else None,
        usd=usd,
        usd_per_1m_output_tokens=_per(usd, output, 1e6),
        usd_per_1m_input_tokens=_per(usd, prompt, 1e6),
    )


def cost_summary(df: pd.DataFrame, manifest: RunManifest, gpus: pd.DataFrame, hold_s: float) -> CostSummary:
    """The run's cost: `df` its records (stage, status, output_tokens, prompt_tokens), `gpus` its GPU
    rows (llmload.observe.summary), `hold_s` the judged seconds the throughput is counted over."""
    ok = df.loc[(df.status == "ok").to_numpy(dtype=bool), ["stage", "output_tokens", "prompt_tokens"]]
    tokens = ok.groupby("stage", observed=True)[["output_tokens", "prompt_tokens"]].sum()
    names = gpus.groupby("gpu", sort=False).name.first().tolist() if not gpus.empty else []
    price = run_price(manifest.pricing, [name if isinstance(name, str) else None for name in names])
    stages = []
    for stage in manifest.stages:
        start = manifest.started_at + stage.start_s
        output, prompt = (float(tokens[c].get(stage.name, 0.0)) for c in ("output_tokens", "prompt_tokens"))
        energy = window_energy(gpus, start, start + stage.duration_s)
        figures = _figures(stage.duration_s, output, prompt, energy, price)
        stages.append(StageCost(name=stage.name, **figures.model_dump()))
    judged_names = {stage.name for stage in manifest.judged_stages}
    judged = [s for s in stages if s.name in judged_names]
    start = manifest.judged_started_at
    hold_energy = window_energy(gpus, start, start + hold_s)
    output = sum(s.output_tokens for s in judged)
    prompt = sum(s.input_tokens for s in judged)
    return CostSummary(
        gpu_count=len(names) or None,
        gpu_kinds=sorted({name for name in names if isinstance(name, str)}),
        energy_source=hold_energy.source,
        energy_note=None if hold_energy.joules is not None else NO_ENERGY,
        gpu_hour_usd=price.gpu_hour_usd,
        price_source=price.source,
        price_note=price.note,
        hold=_figures(hold_s, output, prompt, hold_energy, price),
        stages=stages,
    )
