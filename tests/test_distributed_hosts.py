"""A distributed run across hosts: master, two workers and the target each in a network namespace
of its own (tests/netns.py), reaching each other only by address, at a rate one worker's users
could not carry alone. On loopback a worker that ignored --master-host, or a target URL that
only worked at 127.0.0.1, would go unnoticed."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from llmload.schedule import build_stages, expected_arrivals
from tests.distributed_harness import start_fleet, start_target
from tests.locust_runs import fixed_output_workload
from tests.netns import hosts
from tests.test_locust_runs import _assert_every_stage_held_its_target

# Each request takes TTFT + 7 gaps = 0.1 + 7 × 0.1 = 0.8 s (8 output tokens). The 150% stage is
# 60 req/s, so by Little's law 60 × 0.8 = 48 requests are in flight. --max-users 64 is the fleet's
# cap and Locust gives each worker 32 users: one worker's slots carry at most 32 / 0.8 = 40 req/s,
# short of 60; two carry 80.
TTFT_MS, ITL_MS, OUTPUT_TOKENS = 100, 100, 8
REQUEST_S = (TTFT_MS + (OUTPUT_TOKENS - 1) * ITL_MS) / 1000
TARGET_QPS, STAGES, STAGE_S, MAX_USERS = 40, (25, 50, 100, 150), 10, 64


def _mean_in_flight(records: pd.DataFrame, start: float, end: float) -> float:
    """Requests in flight on average over [start, end): their overlap with it, summed, over its length."""
    overlap = np.minimum(records.finished_at.to_numpy(), end) - np.maximum(records.sent_at.to_numpy(), start)
    return float(np.maximum(overlap, 0.0).sum() / (end - start))


def test_master_and_two_workers_in_their_own_namespaces_offer_every_stage_its_target(tmp_path: Path) -> None:
    assert MAX_USERS / 2 / REQUEST_S < TARGET_QPS * STAGES[-1] / 100 < MAX_USERS / REQUEST_S
    workload = fixed_output_workload(tmp_path, OUTPUT_TOKENS)
    logs = tmp_path / "logs"
    flags = (
        "--target-qps", str(TARGET_QPS), "--stages", ",".join(map(str, STAGES)), "--stage-duration", str(STAGE_S),
        "--arrival", "constant", "--max-users", str(MAX_USERS),
    )  # fmt: skip
    with hosts("master", "worker1", "worker2", "target") as net:
        target = start_target(net, "target", logs, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS))
        assert target == f"http://{net.address('target')}:8000"
        fleet = start_fleet(net, target, workload, tmp_path / "reports", "hosts", flags=flags, logs=logs)
        code = fleet.wait(timeout_s=120)
        fleet.stop_workers()
        assert code == 0, fleet.tails()
        summary, records = fleet.summary, fleet.records

    assert summary["run"]["host"] == target and summary["run"]["workers"] == 2
    assert len(records) == expected_arrivals(build_stages(TARGET_QPS, STAGES, STAGE_S))
    assert (records.status == "ok").all(), records.status.value_counts()
    # every stage offered and achieved its target within 2%, the two workers' requests summed
    _assert_every_stage_held_its_target(summary, records, tolerance=0.02)
    assert [s["target_qps"] for s in summary["stages"]] == [TARGET_QPS * p / 100 for p in STAGES]

    # both workers sent, an even share each (arrivals dealt alternately)
    by_worker = records.groupby("worker").size()
    assert sorted(by_worker.index) == [0, 1] and abs(by_worker[0] - by_worker[1]) <= 1, by_worker

    # the 150% stage needed both workers: more requests in flight than one worker's users
    started = summary["run"]["started_at"]
    hold_start = started + STAGE_S * (len(STAGES) - 1)
    hold = records[records.stage == "150%"]
    fleet_in_flight = _mean_in_flight(hold, hold_start + 1, hold_start + STAGE_S - 1)
    assert fleet_in_flight > MAX_USERS / 2, fleet_in_flight
    for worker in (0, 1):
        assert _mean_in_flight(hold[hold.worker == worker], hold_start + 1, hold_start + STAGE_S - 1) <= MAX_USERS / 2
    assert summary["stages"][-1]["schedule_delay_p99_ms"] < 100
