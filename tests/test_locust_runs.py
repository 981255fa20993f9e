"""Real headless Locust runs (local and distributed) against the loopback embedded target."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from llmload.models import FAILURE_CATEGORIES
from llmload.schedule import ArrivalSchedule, build_stages
from llmload.sim.process import SimProcess
from llmload.workload import load_workload
from tests.locust_runs import REPO, free_port, locust_command, run_locust, small_workload

SUMMARY_KEYS = [
    "requests.scheduled", "requests.sent", "requests.ok", "requests.failed", "requests.not_sent",
    *[f"latency_ms.{m}.{p}" for m in ("ttft", "itl", "tpot", "e2e", "schedule_delay")
      for p in ("p50", "p90", "p95", "p99", "p999", "mean", "max")],
    "throughput.requests_per_s", "throughput.output_tokens_per_s", "throughput.total_tokens_per_s",
    *[f"tokens.{k}.{p}" for k in ("prompt", "output") for p in ("p50", "p95", "p99")],
    "failures.by_category",
]  # fmt: skip
STAGE_KEYS = ["name", "target_qps", "offered_qps", "achieved_qps", "duration_s", "ok", "failed"]


def _get(tree: dict, path: str) -> object:
    for part in path.split("."):
        tree = tree[part]
    return tree


def _planned_sessions(workload: Path, target: float, stage_s: float, workers: int = 1) -> int:
    stages = build_stages(target, (25, 50, 100, 150), stage_s)
    mean_turns = load_workload(workload).mean_turns
    return sum(1 for _ in ArrivalSchedule(stages, "constant", rate_scale=1 / mean_turns).times())


def test_headless_run_measures_injected_timing_and_holds_the_rate(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    secret = "sk-llmload-test-SECRET-42"
    with SimProcess("--ttft-ms", "50", "--itl-ms", "10") as sim:
        os.environ["LLMLOAD_API_KEY"] = secret
        try:
            run = run_locust(sim.url, workload, tmp_path / "reports", "timing", "--target-qps", "10",
                             "--stage-duration", "5", "--arrival", "constant")  # fmt: skip
        finally:
            del os.environ["LLMLOAD_API_KEY"]
        target_lag = sim.stats()["emission_lag_ms"]
    assert run.returncode == 0, run.output[-3000:]
    summary, records = run.summary, run.records
    for key in SUMMARY_KEYS:
        assert _get(summary, key) is not None, key
    for stage in summary["stages"]:
        assert all(stage[k] is not None for k in STAGE_KEYS)

    # counts add up, line for line
    req = summary["requests"]
    assert req["scheduled"] == req["ok"] + req["failed"] + req["not_sent"] == len(records)
    assert req["failed"] == 0 and req["not_sent"] == 0
    # the open-loop plan was sent whole: one first turn per planned session arrival
    assert (records.turn == 0).sum() == _planned_sessions(workload, 10, 5)

    # timing matches what the server injected (50 ms to first token, 10 ms per token)
    ok = records[records.status == "ok"]
    ttft = ok.ttft_ms.to_numpy()
    itl = np.concatenate(ok.itl_ms.to_list())
    # within 5 ms, beyond what the target itself emitted late (a descheduled vCPU delays the server
    # too, and then a later TTFT is the truth; the simulator reports its lag, tens of µs when quiet)
    tail = 5 + target_lag["p99"]
    assert 50 <= np.percentile(ttft, 50) <= 55 and np.percentile(ttft, 95) <= 50 + tail, target_lag
    assert abs(np.percentile(itl, 50) - 10) <= 5 and abs(np.percentile(itl, 95) - 10) <= tail, target_lag
    assert (ok.output_tokens == ok.itl_ms.map(len) + 1).all()

    # the 150% stage got what was offered
    last = summary["stages"][-1]
    assert last["name"] == "150%" and last["target_qps"] == 15
    assert last["achieved_qps"] == pytest.approx(last["offered_qps"], rel=0.05)

    # history grows turn by turn, as the server counted it
    sessions = ok[ok.turn <= 1].pivot_table(index="session_id", columns="turn", values="prompt_tokens").dropna()
    assert len(sessions) > 3 and (sessions[1] > sessions[0]).all()

    # the machine's CPU steal is recorded with the run (what explains tails on a VM)
    assert summary["run"]["cpu_steal_percent"] >= 0

    # live Locust entries, and the API key nowhere
    for entry in ("TTFT", "TPOT", "E2E", "output tok/s", "total tok/s"):
        assert entry in run.output
    assert secret not in run.output
    for path in run.run_dir.iterdir():
        assert secret not in path.read_text(), path


def test_distributed_master_and_two_workers_offer_the_target_not_twice(tmp_path: Path) -> None:
    workload = small_workload(tmp_path, "dist")
    port = free_port()
    reports = tmp_path / "reports"
    with SimProcess("--ttft-ms", "20", "--itl-ms", "5") as sim:
        flags = ("--target-qps", "8", "--stage-duration", "3", "--arrival", "constant")
        master = subprocess.Popen(
            [*locust_command(sim.url, workload, reports, "dist", *flags), "--master", "--expect-workers", "2",
             "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        workers = [
            subprocess.Popen(
                [
                    *locust_command(sim.url, workload, reports, "dist"),
                    "--worker",
                    "--master-host",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(2)
        ]
        try:
            output, _ = master.communicate(timeout=90)
        finally:
            for proc in [master, *workers]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
    assert master.returncode == 0, output[-3000:]
    records = __import__("llmload.records", fromlist=["read_records"]).read_records(reports / "dist" / "requests.jsonl")
    assert sorted(records.worker.unique()) == [0, 1]
    assert (records.turn == 0).sum() == _planned_sessions(workload, 8, 3)
    assert (records.status == "ok").all()
    first_turns = records[records.turn == 0]
    by_worker = first_turns.groupby("worker").size()
    assert abs(by_worker[0] - by_worker[1]) <= 1


def test_failures_are_classified_and_the_run_goes_on(tmp_path: Path) -> None:
    workload = small_workload(tmp_path, "faulty", max_turns=1)
    faults = ["--fault", "http_429:0.1", "--fault", "stream_engine_dead:0.1", "--fault", "cut:0.05",
              "--fault", "http_500:0.05"]  # fmt: skip
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2", "--max-model-len", "200", "--seed", "3", *faults) as sim:
        run = run_locust(sim.url, workload, tmp_path / "reports", "faulty", "--target-qps", "12",
                         "--stage-duration", "3", "--arrival", "poisson")  # fmt: skip
    req, failures = run.summary["requests"], run.summary["failures"]["by_category"]
    assert req["scheduled"] == req["ok"] + req["failed"] + req["not_sent"]
    assert req["ok"] > 0
    assert {"rate_limited", "engine_dead", "stream_error", "http_5xx", "context_length"} <= set(failures)
    assert set(failures) <= set(FAILURE_CATEGORIES)
    records = run.records
    failed = records[records.status == "failed"]
    assert failed.error_message.notna().all() and failed.error_category.notna().all()
    # requests kept flowing through the last stage
    assert ((records.stage == "150%") & (records.status == "ok")).sum() > 0
    assert "maximum context length" in run.summary["failures"]["examples"]["context_length"]


def test_sigterm_mid_run_writes_a_partial_report_with_every_record(tmp_path: Path) -> None:
    workload = small_workload(tmp_path, "stopped", think_s=1.0, output_median=40)
    reports = tmp_path / "reports"
    with SimProcess("--ttft-ms", "30", "--itl-ms", "20") as sim:
        proc = subprocess.Popen(
            locust_command(sim.url, workload, reports, "stopped", "--target-qps", "10", "--stage-duration", "60"),
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.time() + 30
        records_file = reports / "stopped" / "requests.jsonl"
        while time.time() < deadline and (not records_file.exists() or records_file.stat().st_size < 2000):
            time.sleep(0.2)
        time.sleep(4)  # well inside the 50% stage, with requests in flight
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
    run_dir = reports / "stopped"
    summary = __import__("orjson").loads((run_dir / "summary.json").read_bytes())
    req = summary["requests"]
    lines = sum(1 for _ in (run_dir / "requests.jsonl").open())
    assert req["scheduled"] == req["ok"] + req["failed"] + req["not_sent"] == lines, output[-2000:]
    assert req["ok"] > 0
    # in-flight requests at the stop are recorded as cancelled, not lost
    assert set(summary["failures"]["by_category"]) <= {"cancelled"}


def test_without_host_the_embedded_target_serves_and_says_so(tmp_path: Path) -> None:
    run = run_locust(None, small_workload(tmp_path), tmp_path / "reports", "embedded", "--target-qps", "4",
                     "--stage-duration", "1")  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert "no --host given: started the embedded target" in run.output
    summary = run.summary
    assert summary["run"]["host"].startswith("http://127.0.0.1:")
    assert summary["requests"]["ok"] == summary["requests"]["scheduled"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--target-qps", "2", "--stages", "25,fifty"), "--stages wants comma-separated percents"),
        (("--target-qps", "0"), "target QPS must be > 0"),
        ((), "no target rate"),
    ],
)
def test_bad_flags_exit_2_with_a_message(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    workload = small_workload(tmp_path)
    run = run_locust("http://127.0.0.1:9", workload, tmp_path / "reports", "bad", *flags, timeout=30)
    assert run.returncode == 2
    assert message in run.output


def test_misspelt_workload_key_exits_2_naming_it(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    workload.write_text(workload.read_text() + "histroy_turns: 2\n")
    run = run_locust("http://127.0.0.1:9", workload, tmp_path / "reports", "bad", "--target-qps", "1", timeout=30)
    assert run.returncode == 2
    assert "histroy_turns: unknown key" in run.output and str(workload) in run.output
