"""Log-linear latency histograms: ITL percentiles of runs with billions of gaps in bounded memory.

A run of 10M requests has ~2 billion ITL gaps: 8 GB even as float32, so they are never held at
once. Each gap is counted in the bucket of its float32 bits with the last 13 mantissa bits
dropped (HdrHistogram's layout: 1,024 buckets per power of two, no logarithm to compute) and
stands for the bucket's middle, so a percentile is within 2^-11 (0.05%) of numpy's linear
percentile of the same values (gaps below 1 µs count as 1 µs). Histograms of groups (time
windows, bootstrap blocks) add up, which neither a sorted sample nor a t-digest does exactly.
Count, mean and max are exact.
"""

from __future__ import annotations

import numpy as np

from llmload.models import Percentiles

LOW_MS = np.float32(1e-3)
HIGH_MS = np.float32(1e7)  # longer gaps (2.8 h) share the last bucket
_DROPPED_BITS = 13  # of float32's 23 mantissa bits: 10 kept, a bucket is 2^-10 of its value wide
_FIRST = int(np.array(LOW_MS).view(np.int32)) >> _DROPPED_BITS
BUCKETS = (int(np.array(HIGH_MS).view(np.int32)) >> _DROPPED_BITS) - _FIRST + 1
RELATIVE_ERROR = 2.0**-11
METHOD = (
    f"log-linear histogram (1,024 buckets per octave): percentiles within {RELATIVE_ERROR:.2%} of exact;"
    " count, mean and max exact"
)
_QUANTILES = (50, 90, 95, 99, 99.9)
_EDGES = ((np.arange(BUCKETS + 1, dtype=np.int32) + _FIRST) << _DROPPED_BITS).view(np.float32).astype(float)
MIDDLES = (_EDGES[:-1] + _EDGES[1:]) / 2


def buckets(values: np.ndarray) -> np.ndarray:
    """The bucket of each value: its float32 bits, shifted (positive floats order as their bits do)."""
    clipped = np.clip(np.asarray(values, dtype=np.float32), LOW_MS, HIGH_MS)
    index = clipped.view(np.int32)
    index >>= _DROPPED_BITS
    index -= _FIRST
    return index


def quantiles(counts: np.ndarray, qs: np.ndarray, first: int = 0) -> np.ndarray:
    """numpy's linear q-th percentiles (qs in 0..100) of the values each row of `counts` holds
    (rows: groups or resamples; columns: buckets from `first` on), shape (rows, qs); NaN for an
    empty row."""
    counts = np.atleast_2d(counts)
    cumulative = np.cumsum(counts, axis=1, dtype=np.float64)
    totals = cumulative[:, -1]
    position = np.asarray(qs, dtype=float)[None, :] / 100 * np.maximum(totals - 1, 0)[:, None]
    lower = np.floor(position)
    middles = MIDDLES[first : first + counts.shape[1]]

    def at(ranks: np.ndarray) -> np.ndarray:
        """The value of each 0-based rank: the middle of the bucket holding it."""
        index = [np.searchsorted(row, r, side="right") for row, r in zip(cumulative, ranks, strict=True)]
        return middles[np.minimum(np.array(index), counts.shape[1] - 1)]

    ends = [at(lower), at(np.minimum(lower + 1, np.maximum(totals - 1, 0)[:, None]))]
    out: np.ndarray = ends[0] + (position - lower) * (ends[1] - ends[0])
    out[totals == 0] = np.nan
    return out


class Histograms:
    """One histogram per group (a time window, a bootstrap block), with each group's exact sum and max."""

    def __init__(self, groups: int = 1) -> None:
        self.counts = np.zeros((groups, BUCKETS), dtype=np.int64)
        self.totals = np.zeros(groups)
        self.maxima = np.full(groups, -np.inf)

    def add(self, values: np.ndarray, group: int = 0) -> None:
        """Count `values` (NaN left out) in one group's histogram."""
        values = np.asarray(values)
        values = values[~np.isnan(values)]
        if values.size:
            self.counts[group] += np.bincount(buckets(values), minlength=BUCKETS)
            self.totals[group] += float(values.sum(dtype=np.float64))
            self.maxima[group] = max(self.maxima[group], float(values.max()))

    def percentiles(self, groups: np.ndarray | slice = slice(None)) -> Percentiles:
        """Of the given groups (all by default) pooled; the top percentiles never exceed the exact max."""
        counts = self.counts[groups].sum(axis=0)
        count = int(counts.sum())
        if not count:
            return Percentiles()
        top = float(self.maxima[groups].max())
        p50, p90, p95, p99, p999 = np.minimum(quantiles(counts, np.array(_QUANTILES))[0], top).tolist()
        mean = float(self.totals[groups].sum()) / count
        return Percentiles(p50=p50, p90=p90, p95=p95, p99=p99, p999=p999, mean=mean, max=top, count=count)
