"""A least-squares line through per-window values, with the confidence interval of its slope."""

from __future__ import annotations

import math
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
    error: float = 0.0  # the slope's standard error
    dof: int = 3

    @classmethod
    def fit(cls, series: pd.Series, confidence: float, lag: int | None = None, *, adaptive: bool = False) -> Trend:
        """Without `lag`, the windows are taken as independent. With it, the interval uses Newey–West
        (HAC) errors over `lag` neighbouring windows (`adaptive`: more when the residuals say so, by
        Andrews' AR(1) bandwidth), widened as fixed-b theory says (Kiefer–Vogelsang): neighbouring
        windows move together when the requests in them overlap in time or a queue wanders slowly, and
        errors that assume otherwise are too narrow (a healthy server then "drifts" far more often than
        1 − confidence). Never narrower than the errors of independent windows."""
        x, y = series.index.to_numpy(dtype=float), series.to_numpy(dtype=float)
        dx = x - x.mean()
        sxx = float(dx @ dx)
        slope = float(dx @ (y - y.mean()) / sxx)
        intercept = float(y.mean() - slope * x.mean())
        residuals = y - intercept - slope * x
        n = len(x)
        error = float(np.sqrt(residuals @ residuals / (n - 2) / sxx))  # independent windows
        if lag is not None and adaptive:
            lag = max(lag, andrews_lag(residuals))
        lag = 0 if lag is None else min(lag, n - 2)
        widen = 1.0
        if lag > 0:
            scores = dx * residuals
            long_run = float(scores @ scores)
            for k in range(1, lag + 1):
                long_run += 2 * (1 - k / (lag + 1)) * float(scores[k:] @ scores[:-k])
            error = max(error, float(np.sqrt(max(long_run * n / (n - 2), 0.0))) / sxx)
            widen = 1 + FIXED_B_WIDENING * lag / n
        dof = max(n - 2, 3)
        error *= widen
        half = t_quantile(0.5 + confidence / 2, dof) * error
        return cls(slope, slope - half, slope + half, intercept, error, dof)


FIXED_B_WIDENING = 2.0  # critical values grow about linearly with lag / n (Kiefer & Vogelsang 2005); set by the harness


def andrews_lag(residuals: np.ndarray) -> int:
    """Andrews' (1991) data-dependent Bartlett bandwidth from the residuals' first autocorrelation."""
    n = len(residuals)
    if n < 4:
        return 0
    head, tail = residuals[:-1], residuals[1:]
    denominator = float(head @ head)
    rho = min(max(float(head @ tail) / denominator, 0.0), 0.97) if denominator > 0 else 0.0
    alpha = 4 * rho**2 / ((1 - rho) ** 2 * (1 + rho) ** 2)
    return math.ceil(1.1447 * (alpha * n) ** (1 / 3))
