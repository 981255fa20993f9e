"""The master's ledger of a distributed run (llmload.fleet), without Locust: a lost worker's requests
are recorded, its later arrivals handed to the others exactly once, and the counts still add up."""

from __future__ import annotations

import time

import numpy as np
import pytest

from llmload.fleet import Fleet, lost_line
from llmload.models import RequestRecord
from llmload.replay import RequestDispatcher, WorkerShare
from llmload.schedule import (
    ArrivalPlan,
    ArrivalSchedule,
    RunClock,
    SlotShare,
    build_stages,
    conversation_stages,
    slots_held,
    split_shares,
)

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
    handed = np.concatenate([np.asarray(v.positions) for v in loss.handed_over.values()])
    # every later arrival goes to exactly one of the workers left, alternately
    assert sorted(handed.tolist()) == later.tolist()
    assert set(loss.handed_over) == {"a", "c"}
    assert abs(len(loss.handed_over["a"].positions) - len(loss.handed_over["c"].positions)) <= 1
    for node in ("a", "c"):
        assert np.all(np.diff(plan.offsets[fleet.workers[node].positions]) >= 0), "kept in time order"
    # every arrival of the plan is owned once: by a worker left, or by b up to its loss
    owned = np.concatenate([w.positions for w in fleet.workers.values()])
    assert sorted(owned.tolist()) == list(range(len(plan.offsets)))
    assert "worker 1 (10.0.0.3) lost at +12 s" in loss.line and f"not sent: {expected_unsent}" in loss.line
    kept = {w.index: w for w in fleet.report()}
    assert kept[1].handed_over == len(later) and kept[0].adopted + kept[2].adopted == len(later)
    assert lost_line(kept[1]) == loss.line


def _slots(shares: list[SlotShare], total: int, workers: int) -> set[int]:
    """The conversation slots `shares` name, listed one by one: worker k's own are k, k + N, ...; share
    (k, r, q) keeps those whose rank among them is r mod q."""
    return {k + workers * m for k, r, q in shares for m in range(total) if m % q == r and k + workers * m < total}


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_a_lost_workers_slots_are_dealt_to_the_others_each_once_at_every_stage(workers: int) -> None:
    """Workers lost one after another, the last one left alone: at every count of conversations in flight,
    the workers left keep every slot once, and `slots_held` counts what they keep."""
    held: dict[int, list[SlotShare]] = {k: [(k, 0, 1)] for k in range(workers)}
    for lost in range(workers - 1):
        left = sorted(held)[1:] if lost == 0 else [k for k in held if k != lost]
        for k, part in zip(left, split_shares(held.pop(lost), len(left)), strict=True):
            held[k] += part
        for total in range(40):
            kept = [_slots(shares, total, workers) for shares in held.values()]
            assert sorted(s for slots in kept for s in slots) == list(range(total)), (lost, total)
            assert [slots_held(total, workers, shares) for shares in held.values()] == [len(s) for s in kept]


def test_a_lost_worker_in_a_closed_loop_hands_its_conversations_in_flight_to_the_others() -> None:
    """--sessions-in-flight 7 over three workers (slots 0, 3, 6 | 1, 4 | 2, 5): worker b is lost. The loop
    plans no arrival, so none is recorded lost unsent: only what it had in flight. Its two slots go to
    a and c, which keep all seven from the hand-over on."""
    stages = conversation_stages(build_stages(1.0, (50, 100), 20), 7)
    fleet = Fleet(ArrivalPlan.none(), stages, "r", STARTED, ["a", "b", "c"])
    fleet.heard("b", message(4, [[-1, 11.0, 11.2, "c1~2", 0]]), at=12.0)
    loss = fleet.lose("b", now=15.0, policy="resplit")
    assert [(r.status, r.session_id) for r in loss.records] == [("lost", "c1~2")]
    assert set(loss.handed_over) == {"a", "c"} and all(not h.positions for h in loss.handed_over.values())
    assert [slots_held(7, 3, fleet.workers[node].slots) for node in "ac"] == [4, 3]
    kept = {w.index: w for w in fleet.report()}[1]
    assert kept.handed_over_slots and kept.lost_not_sent == 0 and kept.taken_over_at_s == 15.5
    assert loss.line.endswith("the other workers took over its share of the conversations in flight from +15.5 s")
    assert lost_line(kept) == loss.line


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
