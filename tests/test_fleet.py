"""The master's ledger of a distributed run (llmload.fleet), without Locust: a lost worker's requests
are recorded, its later arrivals handed to the others exactly once, and the counts still add up."""

from __future__ import annotations

import time

import numpy as np

from llmload.fleet import Fleet, lost_line
from llmload.models import RequestRecord
from llmload.replay import RequestDispatcher, WorkerShare
from llmload.schedule import ArrivalPlan, ArrivalSchedule, RunClock, build_stages

STARTED = 1_700_000_000.0


def plan_of(qps: float = 10, seconds: float = 20) -> tuple[ArrivalSchedule, ArrivalPlan]:
    schedule = ArrivalSchedule(build_stages(qps, (50, 100), seconds), "poisson", seed=4)
    return schedule, ArrivalPlan.of(schedule, [])


def record_at(fleet: Fleet, worker: int, offset: float) -> RequestRecord:
    return RequestRecord(
        run_id="r", worker=worker, stage="100%", session_id="s", turn=0, scheduled_at=STARTED + offset,
        sent_at=STARTED + offset, status="ok",
    )  # fmt: skip


def message(sent: int, in_flight: list[list[object]]) -> dict[str, object]:
    return {"in_flight": in_flight, "sent_total": sent, "cpu": 5.0, "address": "10.0.0.3"}


def test_a_lost_worker_is_accounted_for_and_its_later_arrivals_split_among_the_others() -> None:
    _, plan = plan_of()
    nodes = ["a", "b", "c"]
    fleet = Fleet(plan, build_stages(10, (50, 100), 20), "r", STARTED, nodes)
    b = fleet.workers["b"]
    owned_b = b.positions.copy()
    offsets = plan.offsets[owned_b]
    # worker b recorded everything due before 12 s except two, and had one more in flight at its last message
    done = offsets[offsets < 12.0]
    kept_back = done[[3, 7]]
    fleet.heard("b", message(len(done) - 1, [[int(owned_b[np.searchsorted(offsets, kept_back[0])]), kept_back[0],
                                                kept_back[0] + 0.01, "s9", 0]]), at=12.0)  # fmt: skip
    fleet.note_records(b, [record_at(fleet, 1, t) for t in done if t not in kept_back])
    loss = fleet.lose("b", now=15.0, policy="resplit")

    statuses = [r.status for r in loss.records]
    assert set(statuses) == {"lost"}
    in_flight = [r for r in loss.records if r.sent_at is not None]
    assert len(in_flight) == 1 and in_flight[0].session_id == "s9"
    # unaccounted: the other kept-back arrival, and every arrival due from 12 s up to the hand-over at 15.5 s
    expected_unsent = 1 + int(((offsets >= 12.0) & (offsets < 15.5)).sum())
    assert b.lost_not_sent == expected_unsent == len(loss.records) - 1
    later = owned_b[offsets >= 15.5]
    handed = np.concatenate([np.asarray(v) for v in loss.handed_over.values()])
    # every later arrival goes to exactly one of the workers left, alternately
    assert sorted(handed.tolist()) == later.tolist()
    assert set(loss.handed_over) == {"a", "c"}
    assert abs(len(loss.handed_over["a"]) - len(loss.handed_over["c"])) <= 1
    for node in ("a", "c"):
        assert np.all(np.diff(plan.offsets[fleet.workers[node].positions]) >= 0), "kept in time order"
    # every arrival of the plan is owned once: by a worker left, or by b up to its loss
    owned = np.concatenate([w.positions for w in fleet.workers.values()])
    assert sorted(owned.tolist()) == list(range(len(plan.offsets)))
    assert "worker 1 (10.0.0.3) lost at +12 s" in loss.line and f"not sent: {expected_unsent}" in loss.line
    kept = {w.index: w for w in fleet.report()}
    assert kept[1].handed_over == len(later) and kept[0].adopted + kept[2].adopted == len(later)
    assert lost_line(kept[1]) == loss.line


def test_with_stop_nothing_is_handed_over_and_only_arrivals_due_by_the_stop_are_lost() -> None:
    _, plan = plan_of()
    fleet = Fleet(plan, build_stages(10, (50, 100), 20), "r", STARTED, ["a", "b"])
    b = fleet.workers["b"]
    fleet.heard("b", message(0, []), at=5.0)
    loss = fleet.lose("b", now=9.0, policy="stop")
    assert loss.handed_over == {}
    offsets = plan.offsets[plan.owned(1, 2)]
    assert b.lost_not_sent == int((offsets < 9.0).sum()) == len(loss.records)
    assert loss.line.endswith("--on-worker-loss stop: the run ends")


def test_a_message_from_a_lost_worker_is_left_out() -> None:
    _, plan = plan_of()
    fleet = Fleet(plan, build_stages(10, (50, 100), 20), "r", STARTED, ["a", "b"])
    fleet.heard("b", message(0, []), at=3.0)
    fleet.lose("b", now=7.0, policy="resplit")
    assert fleet.heard("b", message(3, []), at=8.0) is None


def test_a_dispatcher_takes_over_arrivals_in_time_order() -> None:
    schedule, plan = plan_of(qps=4, seconds=5)
    clock = RunClock(time.perf_counter() + 100, time.time() + 100)  # nothing is due yet
    mine = RequestDispatcher(schedule, [], clock, WorkerShare("r", index=0, count=2))
    first = mine.claim()
    assert first is not None
    theirs = plan.owned(1, 2)
    mine.adopt(theirs[len(theirs) // 2 :].tolist())
    claimed = []
    while (arrival := mine.claim()) is not None:
        claimed.append(arrival)
    expected = sorted(set(plan.owned(0, 2)[1:].tolist()) | set(theirs[len(theirs) // 2 :].tolist()))
    assert [a.seq for a in claimed] == expected
    assert np.all(np.diff([a.at for a in claimed]) >= 0)
