"""The observer: /metrics and /health of a real vLLM, of a server without metrics, of nothing at all."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import gevent
import numpy as np
import orjson
import pytest

from llmload.client import ChatClient, Limits, StreamResult
from llmload.observe.metrics import VLLM, parse_metrics, parse_positions
from llmload.observe.observer import Observer, ServerSample
from llmload.observe.summary import read_server, server_summary
from llmload.rundir import SERVER_FILE
from llmload.server.kinds import CONDITIONAL_FIELDS, GENERIC, kind
from llmload.server.request import chat_body
from llmload.sim.process import SimProcess
from llmload.sweep.server import free_port
from tests.locust_runs import REPO, locust_command, small_workload
from tests.vllm_harness import VllmServer
from tests.wire_server import serve, text_pages

CORE = ["vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
        "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total"]  # fmt: skip
ALL_NAMES = [names[0] for field, names in VLLM.metrics.items() if field not in CONDITIONAL_FIELDS]

# vLLM 0.32's exposition (trimmed), with a second engine added: values add up over label sets
VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_running{engine="1",model_name="tiny-llama"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 7.0
vllm:num_requests_waiting{engine="1",model_name="tiny-llama"} 0.0
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 7.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.75
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-llama"} 900.0
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-llama"} 1.795320796649746e+09
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-llama"} 128.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 4.0
vllm:num_preemptions_total{engine="1",model_name="tiny-llama"} 1.0
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 1804.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 6000.0
"""
# an older vLLM (V0 names), and only part of the set
OLD_VLLM_TEXT = """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 2.0
"""


def test_parse_metrics_sums_label_sets_and_takes_the_fullest_kv_cache() -> None:
    assert parse_metrics(VLLM_TEXT) == {
        "kv_cache_usage": 0.75,
        "running": 5.0,
        "waiting": 7.0,
        "preemptions_total": 5.0,
        "prefix_cache_hits_total": 128.0,
        "prefix_cache_queries_total": 900.0,
        "prompt_tokens_total": 1804.0,
        "generation_tokens_total": 6000.0,
    }
    assert parse_metrics(OLD_VLLM_TEXT) == {"kv_cache_usage": 0.5, "running": 2.0}


# vLLM 0.32's per-position counter as its spec_decode metrics write it (engine and model labels, then
# position), two engines; positions may come in any order
SPEC_TEXT = """\
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 70.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 5.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 109.0
"""


def test_the_per_position_acceptance_is_a_vector_by_its_position_label_summed_over_engines() -> None:
    assert parse_positions(SPEC_TEXT, VLLM.by_position) == {"spec_accepted_by_position": [75.0, 30.0, 9.0]}
    assert parse_positions(VLLM_TEXT, VLLM.by_position) == {}  # not speculating: nothing, not zeros
    # the generic server reads it too, and the scalar read of the same page is unchanged
    assert kind(GENERIC).by_position == VLLM.by_position
    assert parse_metrics(SPEC_TEXT) == {"spec_accepted_tokens_total": 109.0}


def observe_for(observer: Observer, seconds: float) -> list[dict[str, object]]:
    observer.start()
    try:
        gevent.sleep(seconds)
    finally:
        observer.stop()
    return [orjson.loads(line) for line in observer.out_path.read_bytes().splitlines()]


@pytest.fixture
def loopback() -> Iterator[tuple[str, dict[str, str | None]]]:
    """A server answering /health 200 and /metrics with `state["metrics"]` (None: 404, like sim v0)."""
    state: dict[str, str | None] = {"metrics": None}

    def page(path: str) -> str | None:
        return state["metrics"] if path == "/metrics" else "" if path == "/health" else None

    with serve(text_pages(page)) as url:
        yield url, state


def test_server_without_metrics_is_healthy_with_every_metric_missing(
    tmp_path: Path, loopback: tuple[str, dict[str, str | None]], caplog: pytest.LogCaptureFixture
) -> None:
    url, _ = loopback
    with caplog.at_level(logging.WARNING, logger="llmload.observe.observer"):
        samples = observe_for(Observer(url + "/v1", tmp_path / "server.jsonl", interval_s=0.2), 1.0)
    assert len(samples) >= 3
    for sample in samples:
        assert sample["health"] == 200 and sample["missing"] == ALL_NAMES and sample["kv_cache_usage"] is None
    assert sum("/metrics answered 404" in r.message for r in caplog.records) == 1  # noted once, not per sample
    assert server_summary(read_server(tmp_path / "server.jsonl")) is None


def test_partial_old_metrics_fall_back_and_list_the_rest_as_missing(
    tmp_path: Path, loopback: tuple[str, dict[str, str | None]], caplog: pytest.LogCaptureFixture
) -> None:
    url, state = loopback
    state["metrics"] = OLD_VLLM_TEXT
    with caplog.at_level(logging.WARNING, logger="llmload.observe.observer"):
        samples = observe_for(Observer(url, tmp_path / "server.jsonl", interval_s=0.2), 0.7)
    assert samples and all(s["kv_cache_usage"] == 0.5 and s["running"] == 2.0 for s in samples)
    assert samples[0]["missing"] == [n for n in ALL_NAMES if n not in ("vllm:kv_cache_usage_perc", CORE[1])]
    lacks = [r.message for r in caplog.records if "lacks" in r.message]
    assert len(lacks) == 1 and "vllm:num_requests_waiting, vllm:num_preemptions_total" in lacks[0]
    summary = server_summary(read_server(tmp_path / "server.jsonl"))
    assert summary is not None and summary.kv_cache_usage_max == 0.5
    assert summary.waiting_max is None and summary.preemptions is None


def test_a_blocked_event_loop_is_recorded_as_client_lag(
    tmp_path: Path, loopback: tuple[str, dict[str, str | None]]
) -> None:
    """The process held for 1 s (no greenlet runs, as when the scheduler keeps it off the CPU): the
    sample after it says its timer fired that late; the others are on time."""
    url, _ = loopback
    observer = Observer(url, tmp_path / "server.jsonl", interval_s=0.2).start()
    try:
        gevent.sleep(0.6)
        held_until = time.monotonic() + 1.0
        while time.monotonic() < held_until:  # busy, not sleeping: the event loop cannot run
            pass
        gevent.sleep(0.6)
    finally:
        observer.stop()
    lags = [orjson.loads(line)["client_lag_ms"] for line in observer.out_path.read_bytes().splitlines()]
    assert lags[0] is None  # no timer before the first sample
    assert max(lags[1:]) >= 800, lags  # at most one 0.2 s interval of the hold was asked for anyway
    assert sorted(lags[1:])[len(lags) // 2 - 1] < 250, lags  # the others: no stall the report would warn of


def test_dead_port_gives_null_health_and_stops_cleanly(tmp_path: Path) -> None:
    observer = Observer(f"http://127.0.0.1:{free_port()}", tmp_path / "server.jsonl", interval_s=0.2)
    samples = observe_for(observer, 1.0)
    assert len(samples) >= 3
    assert all(s["health"] is None and s["missing"] == ALL_NAMES for s in samples)
    assert observer.latest() is not None and observer.latest() == ServerSample.model_validate(samples[-1])
    started = time.monotonic()
    observer.stop()  # a second stop is harmless
    assert time.monotonic() - started < 1


def test_acceptance_by_position_counts_each_positions_growth_over_the_judged_stages(tmp_path: Path) -> None:
    """Each position's counter grows from the last sample at or before the judged stages, as the scalar
    counters do: 100 drafts there, 80, 40 and 10 accepted at positions 0, 1, 2 (the 130 accepted in all)."""

    def sample(t: float, drafts: float, by_position: list[float]) -> ServerSample:
        return ServerSample(
            t=t, health=200, spec_drafts_total=drafts, spec_draft_tokens_total=3 * drafts,
            spec_accepted_tokens_total=sum(by_position), spec_accepted_by_position=by_position,
        )  # fmt: skip

    rows = [sample(100, 10, [8, 4, 1]), sample(101, 20, [16, 8, 2]), sample(102, 120, [96, 48, 12])]
    path = tmp_path / "server.jsonl"
    path.write_bytes(b"".join(orjson.dumps(r.model_dump(), option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    summary = server_summary(read_server(path), judged_from=101.5)
    assert summary is not None and summary.spec_decode is not None
    assert summary.spec_decode.drafts == 100 and summary.spec_decode.accepted_tokens == 130
    assert summary.spec_decode.acceptance_by_position == pytest.approx([0.8, 0.4, 0.1])


def test_state_at_and_summary_over_a_counter_reset(tmp_path: Path) -> None:
    path = tmp_path / "server.jsonl"
    rows = [
        ServerSample(t=100, health=200, kv_cache_usage=0.1, waiting=0, preemptions_total=10),
        ServerSample(t=101, health=200, kv_cache_usage=0.9, waiting=12, preemptions_total=14),
        ServerSample(t=102, health=None, missing=ALL_NAMES),
        ServerSample(t=103, health=200, kv_cache_usage=0.2, waiting=1, preemptions_total=3),  # restarted
    ]
    path.write_bytes(b"".join(orjson.dumps(r.model_dump(), option=orjson.OPT_APPEND_NEWLINE) for r in rows))
    with path.open("ab") as handle:
        handle.write(b'{"t": 104, "hea')  # torn by a crash: a lost sample
    frame = read_server(path).frame
    assert len(frame) == 4 and np.isnan(frame.health[2])
    summary = server_summary(read_server(path))
    assert summary is not None
    assert (summary.kv_cache_usage_max, summary.waiting_max, summary.preemptions) == (0.9, 12, 4 + 3)
    assert server_summary(read_server(tmp_path / "absent.jsonl")) is None

    observer = Observer("http://127.0.0.1:1", path)
    for row in rows:
        observer._history.append(row)
    assert observer.state_at(99.9) is None
    assert observer.state_at(101.5) == rows[1]
    assert observer.state_at(102) == rows[2]
    assert observer.latest() == rows[3]


def _streams_for(url: str, index: int, seconds: float) -> StreamResult:
    """Long streams one after the other until `seconds` have passed: the first that fails, else the last."""
    deadline = time.monotonic() + seconds
    turn = 0
    while True:
        result = _long_stream(url, index + 100 * turn)
        turn += 1
        if not result.ok or time.monotonic() >= deadline:
            return result


def _long_stream(url: str, index: int) -> StreamResult:
    client = ChatClient(url, limits=Limits(first_token_s=60))
    try:
        prompt = f"session {index}: " + "tell me a long story about the sea " * 30
        body = chat_body("tiny-llama", [{"role": "user", "content": prompt}], max_tokens=None, output_tokens=1500)
        return client.stream_chat(body)
    finally:
        client.close()


@pytest.mark.vllm
def test_real_vllm_metrics_every_second_with_kv_usage_under_load(tmp_path: Path, vllm_server: VllmServer) -> None:
    observer = Observer(vllm_server.url, tmp_path / "server.jsonl").start()
    try:
        gevent.sleep(1.5)
        # streams in turn per greenlet for 12 s at the same concurrency (no preemption); a fast
        # machine finishes a round of six 1500-token streams in ~3 s
        streams = [gevent.spawn(_streams_for, vllm_server.url, i, 12.0) for i in range(6)]
        gevent.joinall(streams, timeout=240)
        gevent.sleep(1.5)
    finally:
        observer.stop()
    assert all(g.value is not None and g.value.ok for g in streams), [g.value for g in streams]

    frame = read_server(tmp_path / "server.jsonl").frame
    # ~1 s apart, never closer, and most of them under load: a server in a scheduler autogroup of
    # its own (its own session) held this process off the CPU for 2-4 s while it decoded, so the
    # samples landed late and only between rounds (docs/ARCHITECTURE.md, Timing)
    gaps = np.diff(frame.t)
    assert len(frame) >= 10 and gaps.min() >= 0.95 and float(np.median(gaps)) <= 1.5
    assert (frame.health == 200).all()
    assert all(not set(CORE) & set(missing) for missing in frame.missing)
    under_load = frame[frame.running > 0]
    assert len(under_load) >= 6 and (under_load.kv_cache_usage > 0).all() and frame.kv_cache_usage.max() <= 1

    summary = server_summary(read_server(tmp_path / "server.jsonl"))
    assert summary is not None and summary.kv_cache_usage_max is not None and summary.kv_cache_usage_max > 0
    assert summary.preemptions == 0 and summary.waiting_max is not None
    generated = frame.generation_tokens_total.iloc[-1] - frame.generation_tokens_total.iloc[0]
    assert generated >= 6 * 1500
    first_loaded = float(under_load.t.iloc[0])
    state = observer.state_at(first_loaded + 0.01)
    assert state is not None and state.t == first_loaded and state.kv_cache_usage == under_load.kv_cache_usage.iloc[0]


def test_the_run_tells_other_work_on_its_machine_from_its_own(tmp_path: Path) -> None:
    """Busy loops on every core for a few seconds mid-run: server.jsonl's other work (CPU in use less
    the run's own: Locust's processes and the local target listening on the port) rises while they
    run and only then; the run's own share is measured throughout."""
    with SimProcess("--ttft-ms", "20", "--itl-ms", "5") as sim:
        command = locust_command(
            sim.url, small_workload(tmp_path), tmp_path / "reports", "hogged", "--target-qps", "6",
            "--stages", "100", "--stage-duration", "20", "--warmup", "0",
        )  # fmt: skip
        run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples = tmp_path / "reports" / "hogged" / SERVER_FILE
        deadline = time.time() + 60
        while time.time() < deadline and (not samples.exists() or len(samples.read_bytes().splitlines()) < 6):
            time.sleep(0.5)
        hog_start = time.time()
        spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
        hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(os.cpu_count() or 1)]
        for hog in hogs:
            hog.wait(timeout=30)
        hog_end = time.time()
        assert run.wait(timeout=120) == 0
    frame = read_server(tmp_path / "reports" / "hogged" / SERVER_FILE).frame
    other = frame.host_cpu_busy - frame.host_cpu_run
    during = other[(frame.t > hog_start + 1.5) & (frame.t < hog_end - 0.5)]
    before = other[(frame.t > frame.t.min() + 2) & (frame.t < hog_start - 1)]
    assert len(during) >= 2 and len(before) >= 3
    # all cores busy with other work while the loops ran; well below before (CI's machine is quiet)
    assert during.mean() > 0.8 and during.mean() - before.mean() > 0.3, (before.tolist(), during.tolist())
    assert frame.host_cpu_run.dropna().gt(0).mean() > 0.8
