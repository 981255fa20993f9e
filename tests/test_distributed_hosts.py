"""A distributed run across hosts: master, two workers and the target each in a network namespace
of its own (tests/netns.py), reaching each other only by address, at a rate one worker's users
could not carry alone. On loopback a worker that ignored --master-host, or a target URL that
only worked at 127.0.0.1, would go unnoticed. Then what goes wrong between hosts: a worker killed
mid-run (its share taken over, or the run stopped), a worker that cannot reach the target, and
one that cannot reach the master."""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import numpy as np
import orjson
import pandas as pd
import pytest

from llmload.models import Message, Session, Turn
from llmload.schedule import build_stages, expected_arrivals
from llmload.workload.synth import TextSynthesizer
from llmload.workload.tokens import get_tokenizer
from tests.distributed_harness import Fleet, start_fleet, start_target, tail
from tests.locust_runs import fixed_output_workload, write_workload
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

    # a line per worker: its address, what it sent by its own count and by the records, which agree
    workers = summary["workers"]
    assert sorted(w["host"] for w in workers) == [net.address("worker1"), net.address("worker2")]
    for w in workers:
        assert w["sent"] == w["sent_reported"] == by_worker[w["index"]] == w["ok"], w
        assert w["lost_at_s"] is None and w["cpu_max_percent"] > 0
    assert sum(w["sent_reported"] for w in workers) == records.sent_at.notna().sum() == len(records)
    report = (tmp_path / "reports" / "hosts" / "report.md").read_text()
    for w in workers:
        row = f"| worker {w['index']} ({w['host']}) | {w['sent']} | {w['ok']} | 0 | 0 | {w['sent_reported']} |"
        assert row in report, report


def _kill_worker_at(fleet: Fleet, index: int, offset_s: float) -> float:
    """SIGKILL worker `index` when the run is `offset_s` in (run.json's start); the offset it died at."""
    manifest = fleet.run_dir / "run.json"
    deadline = time.monotonic() + 60
    while not manifest.exists():
        assert fleet.master.poll() is None and time.monotonic() < deadline, fleet.tails()
        time.sleep(0.1)
    started = orjson.loads(manifest.read_bytes())["started_at"]
    time.sleep(max(0.0, started + offset_s - time.time()))
    os.kill(fleet.workers[index].pid, signal.SIGKILL)
    return time.time() - started


def _lost_worker_run(
    tmp_path: Path, stages: tuple[int, ...], *extra: str, replace: bool = False
) -> tuple[int, Fleet, float, str, str]:
    """The run above with the worker in host worker2 killed 1 s into the 100% stage (and, `replace`,
    a new one started there 2 s later, as a cluster restarts a pod): the master's exit code, the
    fleet, when the worker died, the master's log and the dead worker's address."""
    workload = fixed_output_workload(tmp_path, OUTPUT_TOKENS)
    logs = tmp_path / "logs"
    flags = (
        "--target-qps", str(TARGET_QPS), "--stages", ",".join(map(str, stages)), "--stage-duration", str(STAGE_S),
        "--arrival", "constant", "--max-users", str(MAX_USERS), *extra,
    )  # fmt: skip
    with hosts("master", "worker1", "worker2", "target") as net:
        target = start_target(net, "target", logs, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS))
        fleet = start_fleet(net, target, workload, tmp_path / "reports", "lost", flags=flags, logs=logs)
        died = _kill_worker_at(fleet, 1, STAGE_S * stages.index(100) + 1.0)
        if replace:
            time.sleep(2.0)
            fleet.add_worker("worker2")
        code = fleet.wait(timeout_s=120)
        fleet.stop_workers()
    return code, fleet, died, tail(fleet.master_log, 1_000_000), net.address("worker2")


def _assert_the_loss_is_accounted_for(fleet: Fleet, died: float, output: str, address: str) -> tuple[dict, dict, dict]:
    """The summary, the lost worker's line and the other's."""
    summary, records = fleet.summary, fleet.records
    lost = next(w for w in summary["workers"] if w["host"] == address)
    kept = next(w for w in summary["workers"] if w["host"] != address)
    # noticed within Locust's heartbeat (3 missed beats, checked each second), and said so on the console
    assert died - 1.5 <= lost["lost_at_s"] <= died + 0.1, (died, lost)
    assert lost["noticed_at_s"] - died <= 6.0, (died, lost)
    line = f"worker {lost['index']} ({address}) lost at +{lost['lost_at_s']:.0f} s (no heartbeat"
    assert line in output, output[-3000:]
    assert "lost at +" in (fleet.run_dir / "report.md").read_text()
    # what it had in flight, and its arrivals due after its last message, are recorded lost, with a reason
    gone = records[records.status == "lost"]
    assert len(gone) == lost["lost_in_flight"] + lost["lost_not_sent"] == summary["requests"]["lost"] > 0
    assert (gone.worker == lost["index"]).all() and (gone.error_category == "worker_lost").all()
    assert gone.error_message.str.contains("lost at").all()
    assert lost["lost_in_flight"] > 0 and gone.sent_at.notna().sum() == lost["lost_in_flight"]
    # the counts add up: every record is one of the statuses, and the worker's own count of its sends agrees
    r = summary["requests"]
    assert r["scheduled"] == r["ok"] + r["failed"] + r["unfinished"] + r["cancelled"] + r["not_sent"] + r["lost"]
    assert r["scheduled"] + r["warmup"] == len(records)
    assert lost["sent"] == lost["sent_reported"] == int(records[records.worker == lost["index"]].sent_at.notna().sum())
    assert kept["sent"] == kept["sent_reported"]
    return summary, lost, kept


def test_a_worker_killed_mid_run_is_accounted_for_and_the_others_take_over_its_share(tmp_path: Path) -> None:
    code, fleet, died, output, address = _lost_worker_run(tmp_path, STAGES, replace=True)
    assert code == 0, fleet.tails()
    summary, lost, kept = _assert_the_loss_is_accounted_for(fleet, died, output, address)
    records = fleet.records
    # no arrival of the plan was dropped or sent twice: each has one record, lost or sent by a worker
    assert len(records) == expected_arrivals(build_stages(TARGET_QPS, STAGES, STAGE_S))
    assert lost["taken_over_at_s"] - lost["noticed_at_s"] <= 1.0 and lost["handed_over"] > 0
    assert kept["adopted"] == lost["handed_over"]
    # the offered rate recovered at once: the 150% stage, after the loss, was sent by worker 0 alone, none of
    # it lost. How close to its time is the load generator's timing, measured by benchmarks, not here: on 2
    # cores shared by master, workers and target it slipped 2-4%, and once (a CI run, p99 628 ms late) the
    # arrivals due in the last 0.45 s were still queued when the plan ended. So an arrival left unsent must
    # be one due within that lag of the end: a share the takeover dropped would leave gaps all through.
    hold = summary["stages"][-1]
    assert hold["offered_qps"] == hold["target_qps"] and hold["lost"] == 0, hold
    held = records[records.stage == "150%"]
    sent = held[held.sent_at.notna()]
    assert (held.status.isin(["ok", "not_sent"])).all() and (sent.worker == kept["index"]).all()
    lag_s = float((sent.sent_at - sent.scheduled_at).max())
    unsent = held[held.sent_at.isna()]
    assert lag_s < 2.0 and (unsent.scheduled_at >= held.scheduled_at.max() - lag_s).all(), (lag_s, len(unsent))
    assert hold["not_sent"] == len(unsent) <= 0.1 * len(held), hold
    # the arrivals it never sent were due in the 100% stage (a request in flight may have been scheduled before)
    unsent = records[(records.status == "lost") & records.sent_at.isna()]
    assert set(unsent.stage) == {"100%"}
    # the worker started in its place joined a run already shared out: it left (exit code 0), and Locust
    # moving users to it and back cut nothing (no request cancelled, no arrival dropped: the count above)
    assert "it has no share of its arrivals; it leaves" in tail(fleet.worker_log(2)), tail(fleet.worker_log(2))
    assert fleet.workers[2].poll() == 0
    assert summary["requests"]["cancelled"] == 0 and len(summary["workers"]) == 2


def test_a_closed_loop_worker_killed_mid_run_leaves_its_conversations_to_the_other(tmp_path: Path) -> None:
    """--sessions-in-flight 8 over two workers (half the slots each), the one in host worker2 killed 1 s into
    the 100% stage: a closed loop plans no arrival, so only what it had in flight is lost; the other takes
    its slots over and keeps all eight conversations in flight to the end. (Before, it kept its own four,
    and the master's ledger charged 103 trace session starts of the lost one's as lost requests.)"""
    stage_s = 14
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=1)
    sessions = [
        Session(id=f"c{i}", offset_s=0.1 * i, turns=[Turn(messages=[Message(role="user", content=synth.text(40))],
                                                          output_tokens=OUTPUT_TOKENS)])
        for i in range(60)
    ]  # fmt: skip
    workload = write_workload(tmp_path, "loop", sessions)
    logs = tmp_path / "logs"
    flags = (
        "--arrival", "trace", "--sessions-in-flight", "8", "--stages", "50,100", "--stage-duration", str(stage_s),
        "--max-users", "32",
    )  # fmt: skip
    with hosts("master", "worker1", "worker2", "target") as net:
        target = start_target(net, "target", logs, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS))
        fleet = start_fleet(net, target, workload, tmp_path / "reports", "loop", flags=flags, logs=logs)
        died = _kill_worker_at(fleet, 1, stage_s + 1.0)
        code = fleet.wait(timeout_s=120)
        fleet.stop_workers()
        address = net.address("worker2")
    assert code == 0, fleet.tails()
    summary, records = fleet.summary, fleet.records
    lost = next(w for w in summary["workers"] if w["host"] == address)
    assert lost["lost_not_sent"] == 0 and lost["handed_over"] == 0 and lost["handed_over_slots"], lost
    assert lost["noticed_at_s"] - died <= 6.0 and lost["taken_over_at_s"] < 2 * stage_s - 4, (died, lost)
    gone = records[records.status == "lost"]
    assert len(gone) == lost["lost_in_flight"] == summary["requests"]["lost"] and gone.sent_at.notna().all()
    assert "took over its share of the conversations in flight" in tail(fleet.master_log, 1_000_000)
    started = summary["run"]["started_at"]
    survivor = records[(records.worker != lost["index"]) & records.sent_at.notna() & records.finished_at.notna()]
    # its own half of the 50% stage's four, then all of the 100% stage's eight (measured: 2.00 and 7.99)
    before = _mean_in_flight(survivor, started + 2.0, started + stage_s - 0.5)
    after = _mean_in_flight(survivor, started + lost["taken_over_at_s"] + 1.5, started + 2 * stage_s - 0.5)
    assert 1.8 <= before <= 2.0 and 7.0 <= after <= 8.0, (before, after, lost)


class Stopped(NamedTuple):
    """Two runs that went at once: `stopped` (_lost_worker_run with --on-worker-loss stop) and
    `unreachable` (_cut_off_run whose worker cannot reach the target), with how long that one took."""

    stopped: tuple[int, Fleet, float, str, str]
    unreachable: tuple[int, Fleet, str, dict[str, str]]
    unreachable_s: float


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Stopped:
    """The stopped run's fleet starts beside the fleet that cannot reach its target, each on a network of
    its own; that one ends at its start, long before the stopped run kills its worker 21 s in."""
    with ThreadPoolExecutor(1) as pool:
        run = pool.submit(
            _lost_worker_run, tmp_path_factory.mktemp("stopped"), (25, 50, 100), "--on-worker-loss", "stop", "--verdict"
        )
        started = time.monotonic()
        unreachable = _cut_off_run(
            tmp_path_factory.mktemp("unreachable"), "target", "unreachable",
            "--target-qps", "10", "--stages", "100", "--stage-duration", "20",
        )  # fmt: skip
        took = time.monotonic() - started
        return Stopped(run.result(), unreachable, took)


def test_with_on_worker_loss_stop_the_run_ends_with_exit_2_and_the_hold_fails(stopped: Stopped) -> None:
    code, fleet, died, output, address = stopped.stopped
    assert code == 2, fleet.tails()
    assert "--on-worker-loss stop: the run ends" in output
    summary, lost, kept = _assert_the_loss_is_accounted_for(fleet, died, output, address)
    assert lost["taken_over_at_s"] is None and kept["adopted"] == 0
    verdict = summary["verdict"]
    assert not verdict["passed"]
    achieved = next(line for line in verdict["reasons"] if "achieved rate" in line)
    assert "lost with a worker" in achieved, verdict["reasons"]
    assert summary["run"]["finished_at"] - summary["run"]["started_at"] < STAGE_S * 3, "it stopped at the loss"


def _cut_off_run(tmp_path: Path, unreachable: str, run_id: str, *flags: str) -> tuple[int, Fleet, str, dict[str, str]]:
    """A two-worker run whose worker in host worker2 has no route to host `unreachable`: the master's exit
    code, the fleet, the target's URL and each host's address."""
    logs = tmp_path / "logs"
    with hosts("master", "worker1", "worker2", "target") as net:
        target = start_target(net, "target", logs, "--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS))
        net.run("worker2", ["ip", "route", "add", "unreachable", f"{net.address(unreachable)}/32"], check=True)
        workload = fixed_output_workload(tmp_path, OUTPUT_TOKENS)
        fleet = start_fleet(net, target, workload, tmp_path / "reports", run_id, flags=flags, logs=logs)
        code = fleet.wait(timeout_s=90)
        fleet.stop_workers(timeout_s=1)
        addresses = {host: net.address(host) for host in net.names}
    return code, fleet, target, addresses


def test_a_worker_that_cannot_reach_the_target_ends_the_run_without_charging_the_server(stopped: Stopped) -> None:
    (code, fleet, target, addresses), took = stopped.unreachable, stopped.unreachable_s
    output = tail(fleet.master_log, 1_000_000)
    assert code == 2, fleet.tails()
    assert f"cannot reach the target {target}: no route to host; ending the run (exit code 2)" in output, output[-3000:]
    assert took < 40, "the run ended at its start, not after its 20 s stage"
    summary = fleet.summary
    assert summary["failures"]["by_category"] == {}, "no request of it may be charged to the server"
    refused = next(w for w in summary["workers"] if w["host"] == addresses["worker2"])
    assert refused["refused"] == f"cannot reach the target {target}: no route to host"
    assert refused["sent"] == 0


def test_a_worker_that_cannot_reach_the_master_does_not_hang_it(tmp_path: Path) -> None:
    code, fleet, _, addresses = _cut_off_run(
        tmp_path, "master", "no-master", "--target-qps", "10", "--stages", "100", "--stage-duration", "10",
        "--expect-workers-max-wait", "8",
    )  # fmt: skip
    output = tail(fleet.master_log, 1_000_000)
    assert code == 2, fleet.tails()
    assert "1 of 2 workers connected in 8 s (--expect-workers-max-wait)" in output, output[-3000:]
    assert f"this master at {addresses['master']}:5557 never joins" in output
    assert not (fleet.run_dir / "run.json").exists(), "no run was started"
