"""Real headless Locust runs (local and distributed) against the loopback embedded target."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import orjson
import pandas as pd
import pytest

from llmload.models import FAILURE_CATEGORIES, Message, Session, Turn
from llmload.records import read_records
from llmload.schedule import build_stages, expected_arrivals
from llmload.sim.process import SimProcess
from llmload.sweep.server import free_port
from tests.locust_runs import (
    REPO,
    LocustRun,
    locust_command,
    run_locust,
    running,
    small_workload,
    wait_until,
    write_workload,
)

SAMPLE_WORKLOAD = REPO / "workloads" / "chat-multiturn.yaml"

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


def _assert_every_stage_held_its_target(summary: dict, records: pd.DataFrame, tolerance: float = 0.05) -> None:
    """Offered (scheduled) and achieved (sent in the stage's window) request counts, all turns
    counted, within ±tolerance of target × duration, for every stage the warm-up included."""
    started = summary["run"]["started_at"]
    sent = records[records.status != "not_sent"]
    offset = 0.0
    for stage in summary["stages"]:
        asked = stage["target_qps"] * stage["duration_s"]
        offered = int((records.stage == stage["name"]).sum())
        window = (sent.sent_at >= started + offset) & (sent.sent_at < started + offset + stage["duration_s"])
        achieved = int(window.sum())
        assert abs(offered - asked) <= tolerance * asked, (stage["name"], offered, asked)
        assert abs(achieved - asked) <= tolerance * asked, (stage["name"], achieved, asked)
        assert not stage["shortfall"], stage
        offset += stage["duration_s"]


def test_headless_run_measures_injected_timing_and_holds_the_rate(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    secret = "sk-llmload-test-SECRET-42"
    with SimProcess("--ttft-ms", "50", "--itl-ms", "10") as sim:
        os.environ["LLMLOAD_API_KEY"] = secret
        try:
            run = run_locust(sim.url, workload, tmp_path / "reports", "timing", "--target-qps", "10",
                             "--stage-duration", "5", "--arrival", "constant", "--warmup", "0")  # fmt: skip
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
    assert req["scheduled"] == req["ok"] + req["failed"] + req["cancelled"] + req["not_sent"] == len(records)
    assert req["failed"] == req["cancelled"] == req["not_sent"] == req["warmup"] == 0
    # the open-loop plan was sent whole: one request per planned arrival, follow-up turns included
    assert len(records) == expected_arrivals(build_stages(10, (25, 50, 100, 150), 5))
    assert (records.turn > 0).sum() > 0

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

    # one live Locust entry per request, the console's live line, and the API key nowhere
    assert "LLM      chat" in run.output and "TOKENS" not in run.output
    assert "llmload: stage " in run.output and "TTFT p50" in run.output
    assert secret not in run.output
    for path in run.run_dir.iterdir():  # requests.parquet included
        assert secret.encode() not in path.read_bytes(), path


def _sharegpt_workload(directory: Path) -> Path:
    """80 ShareGPT chats of 1–5 turns, built into a workload by `llmload workload build`."""
    rng = np.random.default_rng(4)
    conversations = []
    for k in range(80):
        turns = []
        for j in range(int(rng.integers(1, 6))):
            turns += [{"from": "human", "value": f"question {j} of chat {k}: " + "word " * int(rng.integers(5, 60))},
                      {"from": "gpt", "value": "answer " * int(rng.integers(5, 40))}]  # fmt: skip
        conversations.append({"id": f"c{k}", "conversations": turns})
    source = directory / "chats.json"
    source.write_bytes(orjson.dumps(conversations))
    workload = directory / "chats.yaml"
    build = subprocess.run([str(REPO / ".venv" / "bin" / "llmload"), "workload", "build", str(source), "-o",
                            str(workload)], capture_output=True, text=True, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    return workload


@pytest.fixture(scope="module")
def multi_turn_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, LocustRun]:
    """Three runs of multi-turn workloads, each against a target of its own, at once (each mostly
    waits for its plan): the packaged sample at 6 req/s and a ShareGPT file built by llmload at 8 req/s
    against the embedded target, stages 50/100/150% × 20 s, and `dist`, a master and two workers
    (_distributed_run)."""
    directory = tmp_path_factory.mktemp("multi-turn")
    reports = directory / "reports"
    plans = {
        "sample": (SAMPLE_WORKLOAD, "6"),
        "sharegpt": (_sharegpt_workload(directory), "8"),
    }
    flags = ("--stages", "50,100,150", "--stage-duration", "20", "--arrival", "constant")
    with ThreadPoolExecutor(len(plans) + 1) as pool:
        futures = {
            name: pool.submit(run_locust, None, workload, reports, name, "--target-qps", qps, *flags, timeout=180)
            for name, (workload, qps) in plans.items()
        }
        distributed = pool.submit(_distributed_run, reports)
        runs = {name: future.result() for name, future in futures.items()}
        runs["dist"] = LocustRun(*distributed.result(), reports / "dist")
        return runs


def test_sample_workload_with_think_times_offers_every_stage_its_target(multi_turn_runs: dict[str, LocustRun]) -> None:
    """Sessions of 1–8 turns and ~4 s think times: every stage, warm-up included, offers and
    achieves its request rate, and the judged stages carry sessions at every depth."""
    run = multi_turn_runs["sample"]
    assert run.returncode == 0, run.output[-3000:]
    summary, records = run.summary, run.records
    stages = summary["stages"]
    assert [s["name"] for s in stages] == ["warm-up", "50%", "100%", "150%"] and stages[0]["warmup"]
    assert stages[0]["duration_s"] == 19  # one mean session of the sample workload
    _assert_every_stage_held_its_target(summary, records)
    hold = stages[-1]
    assert hold["target_qps"] == 9 and set(hold["turn_mix"]) >= {"1", "2", "3"}
    assert hold["turn_mix"]["1"] < 0.6  # follow-up turns, not only first turns
    assert hold["prompt_tokens_p99"] > hold["prompt_tokens_p50"] > 0
    # the headline figures leave the warm-up out, and count it apart
    judged = records[(records.stage != "warm-up") & (records.status == "ok")]
    assert summary["latency_ms"]["ttft"]["count"] == len(judged)
    req = summary["requests"]
    assert req["warmup"] == stages[0]["scheduled"] and req["scheduled"] + req["warmup"] == len(records)
    # think time is a minimum: a follow-up left at least its think time after its reply
    ok = records[records.status == "ok"].sort_values(["session_id", "turn"])
    gaps = ok.groupby("session_id").apply(lambda s: (s.sent_at.shift(-1) - s.finished_at).dropna()).to_numpy()
    assert len(gaps) > 20 and gaps.min() >= 0


def test_sharegpt_workload_built_by_llmload_offers_every_stage_its_target(
    multi_turn_runs: dict[str, LocustRun],
) -> None:
    run = multi_turn_runs["sharegpt"]
    assert run.returncode == 0, run.output[-3000:]
    _assert_every_stage_held_its_target(run.summary, run.records)
    assert (run.records.turn > 0).mean() > 0.3


def test_trace_replay_sends_at_the_recorded_offsets(tmp_path: Path) -> None:
    """--arrival trace: each session at its recorded offset, its follow-up at the recorded time,
    within 50 ms, at --time-scale 1 and 2."""
    turn = Turn(messages=[Message(role="user", content="hello there")], output_tokens=4)
    sessions = [
        Session(id=f"s{k}", offset_s=0.37 * k, turns=[turn, turn.model_copy(update={"at_s": 0.9})] if k % 3 == 0
                else [turn])
        for k in range(24)
    ]  # fmt: skip
    workload = write_workload(tmp_path, "trace", sessions)
    end = 0.37 * 24 - 0.1  # one pass of the trace (it would repeat from 0.37 × 24 s)
    with SimProcess("--ttft-ms", "10", "--itl-ms", "5") as sim:
        for scale in (1.0, 2.0):
            run_id = f"trace-x{scale:g}"
            run = run_locust(sim.url, workload, tmp_path / "reports", run_id, "--arrival", "trace",
                             "--time-scale", f"{scale:g}", "--stages", "100", "--stage-duration",
                             f"{end / scale:g}", "--warmup", "0")  # fmt: skip
            assert run.returncode == 0, run.output[-3000:]
            records, started = run.records, run.summary["run"]["started_at"]
            recorded = {(s.id, 0): s.offset_s for s in sessions} | {
                (s.id, 1): (s.offset_s or 0) + 0.9 for s in sessions if len(s.turns) == 2
            }
            sent = {(r.session_id, r.turn): r.sent_at - started for r in records.itertuples()}
            expected = {key: at / scale for key, at in recorded.items() if at < end}
            assert set(sent) == set(expected)
            errors = np.array([sent[key] - expected[key] for key in expected])
            assert np.abs(errors).max() < 0.05, errors


def _distributed_run(reports: Path) -> tuple[int, str]:
    """The sample workload at 8 req/s from a master and two workers on loopback: the master's exit
    code and output; its run is reports/dist."""
    workload = SAMPLE_WORKLOAD
    port = free_port()
    with SimProcess("--ttft-ms", "20", "--itl-ms", "5") as sim:
        flags = ("--target-qps", "8", "--stages", "50,100,150", "--stage-duration", "10", "--arrival", "constant",
                 "--warmup", "10")  # fmt: skip
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
            output, _ = master.communicate(timeout=150)
        finally:
            for proc in [master, *workers]:
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
    return master.returncode, output


def test_distributed_master_and_two_workers_offer_the_target_not_twice(multi_turn_runs: dict[str, LocustRun]) -> None:
    run = multi_turn_runs["dist"]
    assert run.returncode == 0, run.output[-3000:]
    records = read_records(run.run_dir / "requests.jsonl")
    summary = orjson.loads((run.run_dir / "summary.json").read_bytes())
    assert sorted(records.worker.unique()) == [0, 1]
    assert len(records) == expected_arrivals(build_stages(8, (50, 100, 150), 10, warmup_s=10))
    assert (records.status == "ok").all()
    _assert_every_stage_held_its_target(summary, records)
    by_worker = records.groupby("worker").size()
    assert abs(by_worker[0] - by_worker[1]) <= 1
    # each worker opened its own sessions: none is shared, and follow-ups stay on their worker
    assert records.groupby("session_id").worker.nunique().max() == 1 and (records.turn > 0).any()


def test_failures_are_classified_and_the_run_goes_on(tmp_path: Path) -> None:
    workload = small_workload(tmp_path, "faulty", max_turns=1)
    faults = ["--fault", "http_429:0.1", "--fault", "stream_engine_dead:0.1", "--fault", "cut:0.05",
              "--fault", "http_500:0.05"]  # fmt: skip
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2", "--max-model-len", "200", "--seed", "3", *faults) as sim:
        run = run_locust(sim.url, workload, tmp_path / "reports", "faulty", "--target-qps", "12",
                         "--stage-duration", "3", "--arrival", "poisson")  # fmt: skip
    req, failures = run.summary["requests"], run.summary["failures"]["by_category"]
    assert req["scheduled"] == req["ok"] + req["failed"] + req["cancelled"] + req["not_sent"]
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
        command = locust_command(sim.url, workload, reports, "stopped", "--target-qps", "10", "--stage-duration", "60",
                                 "--warmup", "0")  # fmt: skip
        records_file = reports / "stopped" / "requests.jsonl"
        with running(command) as proc:
            wait_until(lambda: records_file.exists() and records_file.stat().st_size >= 2000, 30, "no records written")
            time.sleep(4)  # well inside the 50% stage, with requests in flight
            proc.send_signal(signal.SIGTERM)
            output, _ = proc.communicate(timeout=60)
    run_dir = reports / "stopped"
    summary = __import__("orjson").loads((run_dir / "summary.json").read_bytes())
    req = summary["requests"]
    lines = sum(1 for _ in (run_dir / "requests.jsonl").open())
    assert req["scheduled"] == req["ok"] + req["failed"] + req["cancelled"] + req["not_sent"] == lines, output[-2000:]
    assert req["ok"] > 0
    # in-flight requests at the stop are recorded as cancelled, not lost, and are no failure
    assert req["failed"] == 0 and summary["failures"]["by_category"] == {}
    records = read_records(run_dir / "requests.jsonl")
    cancelled = records[records.status == "cancelled"]
    assert len(cancelled) == req["cancelled"] and (cancelled.error_category == "cancelled").all()
    assert "cancelled" in (run_dir / "report.md").read_text()


def test_without_host_the_embedded_target_serves_and_says_so(tmp_path: Path) -> None:
    run = run_locust(None, small_workload(tmp_path), tmp_path / "reports", "embedded", "--target-qps", "4",
                     "--stage-duration", "1")  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    assert "no --host given: started the embedded target" in run.output
    # nothing a newcomer would read as an error, and no dependency's request log (the models listed)
    assert "MonkeyPatchWarning" not in run.output and "spawn rate is very high" not in run.output
    assert "HTTP Request:" not in run.output, run.output[-3000:]
    summary = run.summary
    assert summary["run"]["host"].startswith("http://127.0.0.1:")
    assert summary["requests"]["ok"] == summary["requests"]["scheduled"] > 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--target-qps", "2", "--stages", "25,fifty"), "--stages wants comma-separated percents"),
        (("--target-qps", "0"), "--target-qps: Input should be greater than 0"),
        ((), "no target rate"),
    ],
)
def test_bad_flags_exit_2_with_a_message(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    workload = small_workload(tmp_path)
    run = run_locust("http://127.0.0.1:9", workload, tmp_path / "reports", "bad", *flags, timeout=30)
    assert run.returncode == 2
    assert message in run.output


def test_a_run_id_in_use_is_refused_and_the_earlier_run_kept(tmp_path: Path) -> None:
    workload, reports = small_workload(tmp_path, max_turns=1), tmp_path / "reports"
    with SimProcess("--ttft-ms", "5", "--itl-ms", "1") as sim:
        first = run_locust(sim.url, workload, reports, "same", "--target-qps", "4", "--stage-duration", "1")
        assert first.returncode == 0, first.output[-3000:]
        kept = {p.name: p.read_bytes() for p in first.run_dir.iterdir()}
        again = run_locust(sim.url, workload, reports, "same", "--target-qps", "4", "--stage-duration", "1")
    assert again.returncode == 2
    assert "already holds a run (run.json, requests.jsonl): give another --run-id" in again.output
    # nothing of the first run was touched: not its records, not its report
    assert {p.name: p.read_bytes() for p in first.run_dir.iterdir()} == kept


def test_misspelt_workload_key_exits_2_naming_it(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    workload.write_text(workload.read_text() + "histroy_turns: 2\n")
    run = run_locust("http://127.0.0.1:9", workload, tmp_path / "reports", "bad", "--target-qps", "1", timeout=30)
    assert run.returncode == 2
    assert "histroy_turns: unknown key" in run.output and str(workload) in run.output
