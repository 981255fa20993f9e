"""Report figures come from raw samples with numpy's linear percentiles."""

from __future__ import annotations

import numpy as np
import pytest

from llmload.stats.percentiles import percentiles


@pytest.mark.parametrize("n", [1, 2, 7, 100, 10_001])
def test_percentiles_equal_numpy(n: int) -> None:
    rng = np.random.default_rng(n)
    samples = rng.lognormal(3.0, 1.2, n)
    p = percentiles(samples)
    expected = np.percentile(samples, [50, 90, 95, 99, 99.9])
    assert [p.p50, p.p90, p.p95, p.p99, p.p999] == pytest.approx(expected.tolist(), rel=1e-12)
    assert p.mean == pytest.approx(samples.mean())
    assert p.max == samples.max()
    assert p.count == n


def test_missing_values_are_left_out_not_counted_as_zero() -> None:
    p = percentiles([10.0, float("nan"), 30.0])
    assert p.count == 2 and p.p50 == 20.0


def test_no_samples_gives_empty_percentiles() -> None:
    p = percentiles([])
    assert p.count == 0 and p.p99 is None
