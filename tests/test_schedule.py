"""Arrival processes hold their rate, stages switch on time, distributed shares add up exactly."""

from __future__ import annotations

import numpy as np
import pytest

from llmload.schedule import ArrivalSchedule, build_stages, parse_stage_percents, stage_at


def _times(schedule: ArrivalSchedule) -> np.ndarray:
    return np.fromiter(schedule.times(), dtype=float)


@pytest.mark.parametrize(("process", "burstiness"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0), ("constant", 1)])
def test_arrivals_hit_the_stage_rate(process: str, burstiness: float) -> None:
    stages = build_stages(50.0, (100,), stage_duration_s=200.0)
    times = _times(ArrivalSchedule(stages, process, burstiness=burstiness, seed=3))  # type: ignore[arg-type]
    expected = 50.0 * 200.0
    # Poisson count sd = sqrt(10000) = 100; gamma(k) count sd ≈ sqrt(n / k); 5 sd bounds never flake
    sd = np.sqrt(expected / burstiness)
    assert abs(len(times) - expected) < 5 * sd + 1
    assert np.all(np.diff(times) >= 0)
    assert times[0] >= 0 and times[-1] < 200.0


def test_burstiness_changes_dispersion_not_rate() -> None:
    stages = build_stages(20.0, (100,), stage_duration_s=500.0)
    cv = {}
    for b in (0.25, 1.0, 4.0):
        gaps = np.diff(_times(ArrivalSchedule(stages, "gamma", burstiness=b, seed=1)))
        cv[b] = gaps.std() / gaps.mean()
        assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.1)
    # coefficient of variation of gamma gaps is 1/sqrt(shape)
    assert cv[0.25] == pytest.approx(2.0, rel=0.15)
    assert cv[1.0] == pytest.approx(1.0, rel=0.1)
    assert cv[4.0] == pytest.approx(0.5, rel=0.1)


def test_stages_switch_rate_on_time() -> None:
    stages = build_stages(10.0, (25, 50, 100, 150), stage_duration_s=10.0, hold_duration_s=20.0)
    assert [(s.name, s.qps, s.start_s, s.duration_s) for s in stages] == [
        ("25%", 2.5, 0.0, 10.0),
        ("50%", 5.0, 10.0, 10.0),
        ("100%", 10.0, 20.0, 10.0),
        ("150%", 15.0, 30.0, 20.0),
    ]
    times = _times(ArrivalSchedule(stages, "constant"))
    counts = [int(((times >= s.start_s) & (times < s.end_s)).sum()) for s in stages]
    assert counts == [25, 50, 100, 300]
    # constant gaps are exactly 1/rate inside each stage
    inside = times[(times >= 30.0)]
    assert np.allclose(np.diff(inside), 1 / 15.0)
    assert stage_at(stages, 9.999).name == "25%" and stage_at(stages, 10.0).name == "50%"
    assert stage_at(stages, 99.0).name == "150%"


def test_rate_scale_turns_request_rate_into_session_rate() -> None:
    stages = build_stages(12.0, (100,), stage_duration_s=10.0)
    assert len(_times(ArrivalSchedule(stages, "constant", rate_scale=1 / 3))) == 40


@pytest.mark.parametrize("process", ["poisson", "constant", "gamma"])
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_worker_shares_merge_into_the_global_stream(process: str, workers: int) -> None:
    stages = build_stages(30.0, (50, 150), stage_duration_s=20.0)
    schedule = ArrivalSchedule(stages, process, burstiness=0.7, seed=11)  # type: ignore[arg-type]
    whole = _times(schedule)
    shares = [np.fromiter(schedule.share(i, workers), dtype=float) for i in range(workers)]
    assert sum(len(s) for s in shares) == len(whole)
    assert np.array_equal(np.sort(np.concatenate(shares)), whole)
    # each worker offers 1/N of the rate, not the full rate
    for share in shares:
        assert abs(len(share) - len(whole) / workers) <= 1


def test_bad_plans_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="target QPS"):
        build_stages(0, (100,))
    with pytest.raises(ValueError, match="percents"):
        build_stages(1, (100, -5))
    with pytest.raises(ValueError, match="--stages"):
        parse_stage_percents("25,fifty")
    assert parse_stage_percents("25%, 50,100 ,150%") == (25, 50, 100, 150)
    with pytest.raises(ValueError, match="arrival process"):
        ArrivalSchedule(build_stages(1, (100,)), "uniform")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="worker index"):
        next(ArrivalSchedule(build_stages(1, (100,))).share(2, 2))
