"""Arrival processes hold their rate, stages switch on time, distributed shares add up exactly."""

from __future__ import annotations

import numpy as np
import pytest

from llmload.models import Message, Session, Turn
from llmload.schedule import (
    ArrivalSchedule,
    TraceClock,
    build_stages,
    parse_stage_percents,
    stage_at,
    stage_counts,
    trace_period,
    trace_session_starts,
    trace_stages,
)


def _times(schedule: ArrivalSchedule) -> np.ndarray:
    return np.fromiter(schedule.times(), dtype=float)


@pytest.mark.parametrize(("process", "burstiness"), [("poisson", 1.0), ("gamma", 0.5), ("gamma", 4.0), ("constant", 1)])
def test_every_stage_holds_exactly_its_target_count(process: str, burstiness: float) -> None:
    """The process shapes the gaps; the count is the target's, so a stage judged at 150% got 150%."""
    stages = build_stages(7.0, (25, 50, 100, 150), stage_duration_s=9.0)
    times = _times(ArrivalSchedule(stages, process, burstiness=burstiness, seed=3))  # type: ignore[arg-type]
    counts = [int(((times >= s.start_s) & (times < s.end_s)).sum()) for s in stages]
    # 15.75, 31.5, 63, 94.5 requests: rounded on the running total, none lost
    assert counts == [16, 31, 63, 95] and sum(counts) == round(7.0 * 9 * 3.25)
    assert np.all(np.diff(times) >= 0)
    assert times[0] >= 0 and times[-1] < stages[-1].end_s


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


def test_poisson_gaps_stay_exponential_inside_a_stage() -> None:
    gaps = np.diff(_times(ArrivalSchedule(build_stages(20.0, (100,), stage_duration_s=500.0), "poisson", seed=5)))
    assert gaps.mean() == pytest.approx(1 / 20.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert np.median(gaps) == pytest.approx(np.log(2) / 20.0, rel=0.1)


def test_warmup_runs_first_at_the_first_stage_rate_and_is_marked() -> None:
    stages = build_stages(8.0, (50, 150), stage_duration_s=10.0, warmup_s=6.0)
    assert [(s.name, s.qps, s.start_s, s.duration_s, s.warmup) for s in stages] == [
        ("warm-up", 4.0, 0.0, 6.0, True),
        ("50%", 4.0, 6.0, 10.0, False),
        ("150%", 12.0, 16.0, 10.0, False),
    ]
    with pytest.raises(ValueError, match="--warmup"):
        build_stages(8.0, (100,), warmup_s=-1)


def test_trace_clock_plays_each_stage_at_its_percent_and_the_time_scale() -> None:
    stages = build_stages(1.0, (50, 100, 150), stage_duration_s=10.0)
    clock = TraceClock(stages, time_scale=2.0)
    # trace seconds played: 10 × 1 + 10 × 2 + 10 × 3 = 60
    assert clock.trace_end == pytest.approx(60.0)
    assert clock.run_time(5.0) == pytest.approx(5.0)  # 50% × 2 = recorded speed
    assert clock.run_time(10.0 + 4.0) == pytest.approx(12.0)  # twice as fast in the 100% stage
    assert clock.run_time(30.0 + 6.0) == pytest.approx(22.0)  # three times as fast at 150%
    assert clock.speed_at(25.0) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="--time-scale"):
        TraceClock(stages, time_scale=0)


def test_trace_stages_carry_the_rate_the_trace_holds() -> None:
    turn = Turn(messages=[Message(role="user", content="x")], output_tokens=2)
    sessions = [Session(id=f"s{k}", offset_s=k * 0.5, turns=[turn, turn.model_copy(update={"at_s": 0.25})])
                for k in range(20)]  # fmt: skip
    stages = build_stages(1.0, (100, 200), stage_duration_s=5.0)
    planned = trace_stages(stages, TraceClock(stages), sessions)
    # 4 requests per trace second: 4 req/s at 100%, 8 at 200% (the trace repeats after 10 s)
    assert [s.qps for s in planned] == [pytest.approx(4.0), pytest.approx(8.0)]


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


def test_short_stages_hold_their_planned_counts_rounded_half_up_once_over_the_plan() -> None:
    """Planned 2.5/5/10/15 requests held 2/6/10/14 under numpy's round-half-to-even; rounded half up on
    the running total they hold 3/5/10/15, and the plan's total is its rounded sum."""
    stages = build_stages(10, (25, 50, 100, 150), 1.0)
    assert stage_counts(stages) == [3, 5, 10, 15]
    assert sum(stage_counts(build_stages(0.3, (25, 50, 100, 150), 7.0))) == round(0.3 * 7 * 3.25 + 1e-9)


def test_a_trace_of_agents_starting_together_repeats_after_its_last_request_not_at_once() -> None:
    """Agentic traces each start at 0 on their own clock and run for long: one pass lasts until the last
    request (a turn's recorded time, else the think times), not a millisecond after the last start."""
    turn = Turn(messages=[Message(role="user", content="x")], output_tokens=2)
    recorded = Session(id="a", offset_s=0.0, turns=[turn, turn.model_copy(update={"at_s": 100.0})])
    paced = Session(id="b", offset_s=0.0, turns=[turn, turn.model_copy(update={"think_time_s": 30.0})] * 2)
    assert trace_period([recorded, paced]) == 100.0
    assert trace_period([paced]) == 60.0
    starts = trace_session_starts(TraceClock(build_stages(1.0, (100,), 250.0)), [recorded, paced])
    assert starts == [(0.0, 0), (0.0, 1), (100.0, 2), (100.0, 3), (200.0, 4), (200.0, 5)]
