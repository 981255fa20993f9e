"""Exact percentiles (numpy's linear interpolation) of a run's columns, NaN (missing) left out."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from llmload.models import Percentiles, TokenPercentiles

QUANTILES = (50, 90, 95, 99, 99.9)


def percentiles(values: Sequence[float] | np.ndarray | pd.Series) -> Percentiles:
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return Percentiles()
    p50, p90, p95, p99, p999 = np.percentile(arr, QUANTILES).tolist()
    return Percentiles(
        p50=p50, p90=p90, p95=p95, p99=p99, p999=p999, mean=float(arr.mean()), max=float(arr.max()), count=arr.size
    )


def token_percentiles(values: pd.Series) -> TokenPercentiles:
    p = percentiles(values)
    return TokenPercentiles(p50=p.p50, p95=p.p95, p99=p.p99, max=p.max)


def mean(values: pd.Series | np.ndarray) -> float | None:
    """The mean of the values present (as Percentiles.mean); None when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(arr.mean()) if arr.size else None


def quantile(values: pd.Series | np.ndarray, q: float) -> float | None:
    """The q-th percentile (0..100) of the values present; None when there are none."""
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    return float(np.percentile(arr, q)) if arr.size else None
