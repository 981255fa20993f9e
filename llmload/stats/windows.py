"""Values reduced per time window: the report's charts and the verdict's drift and alert checks."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd


def per_window(
    times: pd.Series | np.ndarray,
    values: pd.Series | np.ndarray,
    window_s: float,
    reduce: Callable[[pd.Series], float],
    *,
    origin: float = 0.0,
    windows: int | None = None,
) -> pd.Series:
    """`reduce` of the values in each window of `window_s` from `origin` (only the first `windows`
    when given), indexed by the window's middle in seconds from `origin`; windows without a value
    are left out, as are missing times and values."""
    slot = np.floor((np.asarray(times, dtype=float) - origin) / window_s)
    frame = pd.DataFrame({"slot": slot, "value": np.asarray(values, dtype=float)}).dropna()
    frame = frame[(frame.slot >= 0) & (frame.slot < (np.inf if windows is None else windows))]
    reduced = frame.groupby("slot").value.agg(reduce)
    reduced.index = (reduced.index + 0.5) * window_s
    return reduced.dropna()


def p99(values: pd.Series) -> float:
    """A window's p99 (numpy's linear percentile), NaN for an empty window."""
    arr = values.to_numpy(dtype=float)
    return float(np.percentile(arr, 99)) if arr.size else np.nan


def p50(values: pd.Series) -> float:
    arr = values.to_numpy(dtype=float)
    return float(np.percentile(arr, 50)) if arr.size else np.nan


def mean(values: pd.Series) -> float:
    return float(values.mean())


def total(values: pd.Series) -> float:
    return float(values.sum())


def in_flight(starts: np.ndarray, ends: np.ndarray, window_s: float, *, origin: float, windows: int) -> pd.Series:
    """How many of the intervals [start, end) were open on average in each window from `origin`
    (the time-averaged count: Little's L over the window), indexed by the window's middle in seconds
    from `origin`. Every window is present, 0 where none was open."""
    starts, ends = np.asarray(starts, dtype=float), np.asarray(ends, dtype=float)
    near = (starts < origin + windows * window_s) & (ends > origin)
    starts, ends = starts[near], ends[near]
    values = []
    for k in range(windows):
        low, high = origin + k * window_s, origin + (k + 1) * window_s
        values.append(float(np.clip(np.minimum(ends, high) - np.maximum(starts, low), 0, None).sum()) / window_s)
    return pd.Series(values, index=(np.arange(windows) + 0.5) * window_s, dtype=float)
