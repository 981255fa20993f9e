"""A least-squares line through per-window values, with the confidence interval of its slope."""

from __future__ import annotations

from dataclasses import dataclass
from statistics import NormalDist

import numpy as np
import pandas as pd


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile (Abramowitz & Stegun 26.7.5): within 0.003 of exact for dof ≥ 3."""
    z = NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / dof ** (i + 1) for i, term in enumerate(terms))


@dataclass(frozen=True)
class Trend:
    """Least-squares line through per-window values: slope per second, its interval, fitted start."""

    slope: float
    low: float
    high: float
    start: float

    @classmethod
    def fit(cls, series: pd.Series, confidence: float) -> Trend:
        x, y = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
        dx = x - x.mean()
        slope = float(dx @ (y - y.mean()) / (dx @ dx))
        intercept = float(y.mean() - slope * x.mean())
        residuals = y - intercept - slope * x
        error = np.sqrt(residuals @ residuals / (len(x) - 2) / (dx @ dx))
        half = t_quantile(0.5 + confidence / 2, len(x) - 2) * error
        return cls(slope, slope - half, slope + half, intercept)
