"""A window's GPU energy from server.jsonl's GPU rows: each GPU's total-energy counter where it has
one (its growth over the window), else its power draw integrated over the samples (trapezoids).
Both are read at the window's ends by interpolating between the samples around them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from llmload.models import EnergySource


@dataclass(frozen=True)
class WindowEnergy:
    joules: float | None  # None: some GPU gave neither a counter nor power in the window
    source: EnergySource | None


def _at_edges(t: np.ndarray, values: np.ndarray, start: float, end: float) -> tuple[np.ndarray, np.ndarray]:
    """The series over [start, end], its ends interpolated (held flat beyond the first and last sample)."""
    inside = (t > start) & (t < end)
    times = np.concatenate([[start], t[inside], [end]])
    return times, np.interp(times, t, values)


def _counter_growth(t: np.ndarray, joules: np.ndarray, start: float, end: float) -> float:
    """The counter's growth over the window; the part the samples do not cover at the mean power of
    the part they do; a fall (the driver reloaded) counts as no growth in that step."""
    _, values = _at_edges(t, joules, start, end)
    covered = min(end, t[-1]) - max(start, t[0])
    grown = float(np.clip(np.diff(values), 0, None).sum())
    return grown * (end - start) / covered if covered > 0 else float("nan")


def _power_integral(t: np.ndarray, watts: np.ndarray, start: float, end: float) -> float:
    times, values = _at_edges(t, watts, start, end)
    return float(np.trapezoid(values, times))


def window_energy(gpus: pd.DataFrame, start: float, end: float) -> WindowEnergy:
    """Every GPU's energy over [start, end] (unix seconds), summed; the source is `power` when any GPU
    had no counter. `gpus`: one row per GPU per sample (t, gpu, power_w, energy_j)."""
    total = 0.0
    source: EnergySource = "counter"
    for _, rows in gpus.groupby("gpu", sort=False):
        counter = rows.loc[rows.energy_j.notna(), ["t", "energy_j"]]
        power = rows.loc[rows.power_w.notna(), ["t", "power_w"]]
        if len(counter) >= 2:
            joules = _counter_growth(counter.t.to_numpy(), counter.energy_j.to_numpy(), start, end)
        elif len(power) >= 2:
            joules, source = _power_integral(power.t.to_numpy(), power.power_w.to_numpy(), start, end), "power"
        else:
            return WindowEnergy(None, None)
        total += joules
    if gpus.empty or not np.isfinite(total):
        return WindowEnergy(None, None)
    return WindowEnergy(total, source)
