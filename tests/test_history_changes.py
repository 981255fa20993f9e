"""Change points in a figure's series and the gate against history (llmload.history.changes), on seeded
series. Their error rates over thousands of series are measured by benchmarks/history_changes.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmload.errorrates.compare import slower
from llmload.errorrates.grid import SERVERS
from llmload.errorrates.runs import NO_SERVER_FILE, hold_plan, records
from llmload.history.changes import MAX_P_VALUE, find_change_points, history_gate
from llmload.observe.summary import read_server
from llmload.report.summary import summarize
from llmload.stats.percentiles import percentiles


def noisy(n: int, seed: int, sigma: float = 0.03, level: float = 800.0) -> np.ndarray:
    """`n` runs of a figure around `level` with a run-to-run σ of `sigma` (log-normal)."""
    return level * np.exp(np.random.default_rng(seed).normal(0.0, sigma, n))


def test_twelve_runs_with_a_15_percent_step_at_run_8_report_one_change_point_at_run_8() -> None:
    series = noisy(12, seed=8)
    series[7:] *= 1.15  # run 8 is index 7: the first run after the step
    found = find_change_points(series.tolist())
    assert len(found) == 1
    point = found[0]
    assert point.index == 7
    assert point.step_low < point.step < point.step_high
    assert point.step == pytest.approx(0.15, abs=0.08)  # the difference of the means' σ is 1.8%
    assert point.step == pytest.approx(point.after / point.before - 1)
    assert point.p_value < MAX_P_VALUE


def test_a_stationary_series_reports_no_change_point() -> None:
    for seed in range(5):
        assert find_change_points(noisy(30, seed).tolist()) == []


def test_a_step_is_found_at_its_run_and_nowhere_else() -> None:
    series = noisy(30, seed=3)
    series[20:] *= 1.10
    (point,) = find_change_points(series.tolist())
    assert point.index == 20
    assert point.before == pytest.approx(series[:20].mean())
    assert point.after == pytest.approx(series[20:].mean())
    assert point.step_low < 0.10 < point.step_high


def test_two_steps_are_two_change_points_each_against_its_neighbouring_segments() -> None:
    series = noisy(30, seed=4, sigma=0.01)
    series[10:] *= 1.2
    series[20:] /= 1.2
    found = find_change_points(series.tolist())
    assert [p.index for p in found] == [10, 20]
    assert found[0].step == pytest.approx(0.2, abs=0.02)
    assert found[1].step == pytest.approx(-1 / 6, abs=0.02)


def test_figures_with_zeros_are_tested_on_their_values_and_a_step_from_zero_is_infinite() -> None:
    errors = np.r_[np.zeros(10), np.full(5, 0.02)]
    (point,) = find_change_points(errors.tolist())
    assert point.index == 10
    assert point.p_value == 0.0
    assert math.isinf(point.step)
    assert find_change_points([0.0] * 20) == []


def test_short_series_and_bad_values() -> None:
    assert find_change_points([1.0, 2.0, 3.0]) == []
    with pytest.raises(ValueError, match="finite"):
        find_change_points([1.0, math.nan, 2.0, 2.0, 2.0, 2.0])


def soak_e2e_p50(server_name: str, factor: float, seed: int) -> float:
    """One default soak of a harness server (0.7 of its capacity) `factor` times slower: its E2E p50 (ms)."""
    server = SERVERS[server_name]
    hold = hold_plan("soak", 0.7 * server.capacity_qps)
    manifest, frame = records(hold, slower(server, factor), "poisson", 1.0, seed)
    summary = summarize(
        frame, manifest, itl=percentiles([]), stage_itl_p50=None, server=read_server(NO_SERVER_FILE), good=None,
        workload_prefix=None,
    )  # fmt: skip
    assert summary.latency_ms.e2e.p50 is not None
    return summary.latency_ms.e2e.p50


def test_a_server_made_15_percent_slower_from_run_8_of_12_soaks_is_one_change_point() -> None:
    series = [soak_e2e_p50("fifo-32x3s", 1.15 if run >= 7 else 1.0, seed=run) for run in range(12)]
    (point,) = find_change_points(series)
    assert point.index == 7
    assert point.step_low < 0.15 < point.step_high


def test_history_gate_passes_noise_and_fails_a_step() -> None:
    previous = noisy(10, seed=1)
    typical = float(np.exp(np.log(previous).mean()))
    steady = history_gate(previous.tolist(), typical * 1.03, within=0.02)
    assert not steady.regressed
    assert steady.limit > typical * 1.03
    assert steady.spread == pytest.approx(np.log(previous).std(ddof=1))
    assert "within the limit" in steady.reason
    worse = history_gate(previous.tolist(), typical * 1.15, within=0.02)
    assert worse.regressed
    assert "above the limit" in worse.reason
    assert worse.limit == steady.limit
    # runs that all measured the same value: that value again is no regression, a rise above it is
    same = [999.4] * 10  # exp(mean(log)) is 999.39999… here
    assert not history_gate(same, 999.4, within=None).regressed
    assert history_gate(same, 999.4 * 1.01, within=None).regressed


def test_history_gate_widens_only_where_the_run_is_noisier_than_the_runs_were_apart() -> None:
    previous = noisy(10, seed=2)
    unknown = history_gate(previous.tolist(), 900.0, within=None)
    quiet = history_gate(previous.tolist(), 900.0, within=0.001)
    noisy_run = history_gate(previous.tolist(), 900.0, within=0.10)
    assert quiet.limit == unknown.limit
    assert noisy_run.limit > unknown.limit * 1.1


def test_history_gate_on_counts_with_zeros_and_bad_input() -> None:
    assert history_gate([0.0, 0.0, 0.0], 0.0, None).regressed is False
    assert history_gate([0.0, 0.0, 0.0], 1.0, None).regressed is True
    assert history_gate([0.0, 1.0, 0.0, 1.0], 1.0, None).regressed is False
    with pytest.raises(ValueError, match="at least 2"):
        history_gate([1.0], 1.0, None)
    with pytest.raises(ValueError, match="finite"):
        history_gate([1.0, 2.0], math.nan, None)
