"""`llmload sim --profile`: the engine under load, over real HTTP on loopback.

Paged KV with preemption, prefix caching, vLLM's metrics, the startup refusal, engine death on
vLLM's timeline, and every failure category the suite knows, each classified by the client the
load tests run (llmload.client.ChatClient). Profiles here are fast variants of vllm-cpu-tiny so
that KV pressure builds within a second or two.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gevent
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from llmload.client import ChatClient, Limits, StreamResult
from llmload.models import ServeConfig
from llmload.observe.metrics import scrape
from llmload.server.request import chat_body
from llmload.sim import SimProcess
from llmload.sim.config import FaultSpec
from llmload.sim.engine import dry_run
from llmload.sim.faults import FaultPicker
from llmload.sim.profiles import PROFILES
from tests.locust_runs import metrics_text

MODEL = "llmload-sim"
# vllm-cpu-tiny with quick steps and 16-token blocks: 64 blocks (1 KiB/token) = 1,024 tokens of KV.
FAST_TINY = {
    **PROFILES["vllm-cpu-tiny"].model_dump(),
    "name": "fast-tiny",
    "serving": {
        **PROFILES["vllm-cpu-tiny"].serving.model_dump(exclude_none=True),
        "block_size": 16,
        "kv_cache_memory_bytes": 64 * 16 * 1024,
        "max_model_len": 512,
    },
    "timing": {
        "frontend_ms": 1.0,
        "prefill_tokens_per_s": 500_000,
        "decode_base_ms": 1.0,
        "decode_per_seq_ms": 0.05,
        "decode_per_kv_token_us": 0.0,
    },
}
FAULT_SPECS = ("oom:0.2", "cut:0.2", "stall:0.2", "http_500:0.2")
CATEGORY_OF_FAULT = {"oom": "oom", "cut": "stream_error", "stall": "timeout", "http_500": "http_5xx", None: None}


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("profiles") / "fast-tiny.yaml"
    path.write_text(yaml.safe_dump(FAST_TINY))
    return path


@pytest.fixture(scope="module")
def sims(profile_file: Path) -> Iterator[dict[str, SimProcess]]:
    """The module's long-lived servers, started in parallel."""
    profile = ("--profile", str(profile_file))
    procs = {
        "engine": SimProcess(*profile, "--enable-prompt-tokens-details"),
        # One running and one waiting at most; 50 ms per token keeps a request in the engine for seconds.
        "busy": SimProcess(*profile, "--max-num-queued-reqs", "1", "--max-num-seqs", "1", "--slow-tokens", "0:3600:50"),
        "faulty": SimProcess(
            *profile, *(a for spec in FAULT_SPECS for a in ("--fault", spec)), "--seed", "3", "--stall-s", "1.5"
        ),
    }
    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(SimProcess.start, procs.values()))
        yield procs
    finally:
        with ThreadPoolExecutor(len(procs)) as pool:
            list(pool.map(SimProcess.stop, procs.values()))


def messages(text: str, system: str | None = None) -> list[dict[str, str]]:
    head = [{"role": "system", "content": system}] if system else []
    return [*head, {"role": "user", "content": text}]


def stream(url: str, msgs: list[dict[str, str]], output: int, limits: Limits | None = None) -> StreamResult:
    client = ChatClient(url, limits=limits or Limits(first_token_s=30, between_tokens_s=30, total_s=60))
    try:
        return client.stream_chat(chat_body(MODEL, msgs, max_tokens=None, output_tokens=output))
    finally:
        client.close()


def concurrently(url: str, text: str, output: int, n: int) -> list[StreamResult]:
    """n streams at once, each prompt its own from the first block on (no prefix shared)."""
    greenlets = [gevent.spawn(stream, url, messages(f"{i}: {text}"), output) for i in range(n)]
    gevent.joinall(greenlets, timeout=60)
    return [g.get(block=False) for g in greenlets]  # a stream that raised raises here, with its traceback


def wait_for_gauges(url: str, running: int, waiting: int, timeout_s: float = 10.0) -> None:
    """Poll /metrics until the engine holds exactly this many running and waiting requests."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        gauges = scrape(url)
        if (gauges["vllm:num_requests_running"], gauges["vllm:num_requests_waiting"]) == (running, waiting):
            return
        gevent.sleep(0.02)
    raise AssertionError(f"engine never held {running} running and {waiting} waiting: {gauges}")


def post(url: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_sim(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llmload.sim", "--port", "0", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )


# --------------------------------------------------------------------------- KV cache and scheduling


def test_kv_exhaustion_preempts_and_every_request_succeeds(sims: dict[str, SimProcess]) -> None:
    """12 requests of ~340 tokens each need ~4,000 tokens of KV; the pool has 1,008 usable."""
    url = sims["engine"].url
    before = scrape(url)
    results = concurrently(url, "hello " * 100, output=240, n=12)
    after = scrape(url)
    assert all(r.ok for r in results), [r.error_message for r in results if not r.ok]
    assert all(r.completion_tokens == 240 == len(r.token_times) for r in results)
    assert after["vllm:num_preemptions_total"] > before["vllm:num_preemptions_total"]
    assert after["vllm:request_success_total"] - before["vllm:request_success_total"] == 12
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0


def test_running_and_waiting_gauges_follow_the_batch(sims: dict[str, SimProcess]) -> None:
    url = sims["engine"].url
    seen: list[dict[str, float]] = []
    load = gevent.spawn(concurrently, url, "hi " * 200, 150, 8)
    while not load.ready():
        seen.append(scrape(url))
        gevent.sleep(0.02)
    assert max(s["vllm:kv_cache_usage_perc"] for s in seen) > 0.9
    assert max(s["vllm:num_requests_waiting"] for s in seen) >= 1
    assert 1 <= max(s["vllm:num_requests_running"] for s in seen) < 8


def test_prefix_caching_counts_hits_for_a_shared_system_prompt(sims: dict[str, SimProcess]) -> None:
    url = sims["engine"].url
    system = "You are a support agent for the example product. " * 20  # ~220 tokens: 13 full blocks
    before = scrape(url)
    first = stream(url, messages("question one", system), output=4)
    second = stream(url, messages("question two", system), output=4)
    after = scrape(url)
    assert first.ok and second.ok
    assert first.cached_tokens == 0
    assert second.cached_tokens is not None and second.cached_tokens >= 192  # 12+ shared blocks of 16
    assert after["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"] == second.cached_tokens
    queried = after["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
    assert queried == (first.prompt_tokens or 0) + (second.prompt_tokens or 0)


def test_prompt_over_max_model_len_is_400_context_length(sims: dict[str, SimProcess]) -> None:
    result = stream(sims["engine"].url, messages("word " * 600), output=4)
    assert (result.error_category, result.http_status) == ("context_length", 400)
    assert "maximum context length is 512 tokens" in (result.error_message or "")


# --------------------------------------------------------------------------- endpoints


def test_metrics_have_vllms_names_and_labels(sims: dict[str, SimProcess]) -> None:
    families = {f.name: f for f in text_string_to_metric_families(metrics_text(sims["engine"].url, timeout=5))}
    expected = {
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:prefix_cache_hits": "counter",
        "vllm:prefix_cache_queries": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
    }
    assert {name: families[name].type for name in expected} == expected
    for family in families.values():  # vLLM labels the cache's config by engine only
        assert all(s.labels.get("model_name", MODEL) == MODEL for s in family.samples)
    (cache_info,) = families["vllm:cache_config_info"].samples
    assert cache_info.labels["engine"] == "0" and int(cache_info.labels["num_gpu_blocks"]) > 0
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert {"stop", "length", "abort"} <= reasons


def test_completions_stream_and_not(sims: dict[str, SimProcess]) -> None:
    url = sims["engine"].url
    status, body = post(url, "/v1/completions", {"model": MODEL, "prompt": "Once upon a time"})
    assert status == 200 and body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["usage"]["completion_tokens"] == 16  # vLLM's default max_tokens for completions
    assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["text"]
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(
            {"model": MODEL, "prompt": "hi", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        events = [e for e in response.read().decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["choices"][0]["text"] != "" for c in chunks[:-1]] == [True] * 5
    assert list(chunks[0]["choices"][0]) == [
        "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids"
    ]  # fmt: skip
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_tokenize_detokenize_and_models(sims: dict[str, SimProcess]) -> None:
    url = sims["engine"].url
    status, body = post(url, "/tokenize", {"model": MODEL, "prompt": "hello world"})
    assert status == 200 and list(body) == ["count", "max_model_len", "tokens", "token_strs"]
    assert body["count"] == len(body["tokens"]) == 2 and body["max_model_len"] == 512
    _, chat = post(url, "/tokenize", {"model": MODEL, "messages": messages("hello world")})
    _, bare = post(
        url, "/tokenize", {"model": MODEL, "messages": messages("hello world"), "add_generation_prompt": False}
    )
    assert chat["count"] > bare["count"] > body["count"]
    assert post(url, "/detokenize", {"model": MODEL, "tokens": body["tokens"]}) == (200, {"prompt": "hello world"})
    assert post(url, "/tokenize", {"model": "other", "prompt": "x"})[0] == 404
    with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
        assert json.loads(response.read())["data"][0]["max_model_len"] == 512


# --------------------------------------------------------------------------- failure categories


def test_seeded_faults_are_classified_in_order(sims: dict[str, SimProcess]) -> None:
    """The draw sequence is the seed's: the test replays it to know which request gets which fault."""
    picker = FaultPicker([FaultSpec.parse(s) for s in FAULT_SPECS], seed=3)
    limits = Limits(first_token_s=5, between_tokens_s=0.5, total_s=10)
    seen = []
    for _ in range(8):
        fault = picker.draw()
        result = stream(sims["faulty"].url, messages("hello"), output=8, limits=limits)
        seen.append((fault.kind if fault else None, result.error_category))
    assert seen == [(kind, CATEGORY_OF_FAULT[kind]) for kind, _ in seen]
    assert {kind for kind, _ in seen} == set(CATEGORY_OF_FAULT)


def test_queue_full_is_503_rate_limited(sims: dict[str, SimProcess]) -> None:
    url = sims["busy"].url
    running = gevent.spawn(stream, url, messages("0: hello"), 40)
    wait_for_gauges(url, running=1, waiting=0)
    waiting = gevent.spawn(stream, url, messages("1: hello"), 40)
    wait_for_gauges(url, running=1, waiting=1)
    rejected = stream(url, messages("2: hello"), 40)
    gevent.joinall([running, waiting], timeout=30)
    assert (rejected.error_category, rejected.http_status) == ("rate_limited", 503)
    assert running.value.ok and waiting.value.ok


def test_unknown_model_is_model_not_found_with_the_servers_message(sims: dict[str, SimProcess]) -> None:
    """A model or LoRA adapter not served: vLLM's 404, its own category (llmload/failures.py), the message kept."""
    client = ChatClient(sims["engine"].url)
    result = client.stream_chat(chat_body("no-such-model", messages("hi"), max_tokens=2, output_tokens=None))
    client.close()
    assert (result.error_category, result.http_status) == ("model_not_found", 404)
    assert (result.error_message or "").startswith("The model `no-such-model` does not exist.")


def test_engine_death_timeline(tmp_path: Path, profile_file: Path) -> None:
    """In-flight streams get the in-stream 500 (in a 200 stream), new requests HTTP 500, /health 503, then
    refusal and exit 1."""
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"engine_death": {"after_requests": 3, "stop_listening_s": 1.0, "exit_s": 1.6}}))
    sim = SimProcess("--profile", str(profile_file), "--faults", str(faults))
    sim.start()
    try:
        url = sim.url
        in_flight = concurrently(url, "hello", output=400, n=3)
        died = time.monotonic()
        assert [r.error_category for r in in_flight] == ["engine_dead"] * 3
        assert all(
            (r.http_status, r.stream_error_code) == (200, 500)
            and "EngineCore encountered an issue" in (r.error_message or "")
            for r in in_flight
        )
        after = stream(url, messages("hello"), output=4)
        assert (after.error_category, after.http_status) == ("engine_dead", 500)
        assert health(url) == 503
        while time.monotonic() - died < 3 and health(url) is not None:
            time.sleep(0.02)
        refused_after = time.monotonic() - died
        gone = stream(url, messages("hello"), output=4, limits=Limits(connect_s=2))
        assert gone.error_category == "server_down"
        assert sim._proc is not None
        assert sim._proc.wait(5) == 1
        assert 0.5 <= refused_after <= 2.0
    finally:
        sim.stop()


def test_engine_death_at_kv_usage_on_the_default_timeline(profile_file: Path) -> None:
    with SimProcess("--profile", str(profile_file), "--die-at-kv-usage", "0.3") as sim:
        url = sim.url
        result = stream(url, messages("hello " * 200), output=250)  # 19 of 63 blocks by its 100th token
        died = time.monotonic()
        assert result.error_category == "engine_dead" and 50 < len(result.token_times) < 150
        while health(url) is not None and time.monotonic() - died < 2:
            time.sleep(0.01)
        assert time.monotonic() - died < 0.6  # vLLM stops listening ~0.15 s after the engine dies
        assert sim._proc is not None and sim._proc.wait(5) == 1


def test_slow_token_window_slows_every_step(profile_file: Path) -> None:
    with SimProcess("--profile", str(profile_file), "--slow-tokens", "0:600:40") as sim:
        result = stream(sim.url, messages("hello"), output=6)
    gaps = sorted(b - a for a, b in itertools.pairwise(result.token_times))
    assert result.ok and 0.035 <= gaps[len(gaps) // 2] <= 0.08


# --------------------------------------------------------------------------- startup


def test_kv_cache_below_max_model_len_refuses_to_start_like_vllm() -> None:
    done = run_sim("--profile", "vllm-cpu-tiny", "--kv-cache-memory-bytes", str(2**20), "--max-model-len", "2048")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "ValueError: To serve at least one request with the model's max seq len (2048), (0.0 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (0.0 GiB). Based on the available memory, "
        "the estimated maximum model length is 896. Try increasing `gpu_memory_utilization` (which also controls "
        "CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the engine. See "
        "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )


def test_gpu_profiles_start_and_size_kv_through_capacity() -> None:
    done = run_sim("--profile", "qwen3-8b-24gb", "--max-model-len", "40960")
    assert (
        done.returncode == 1
        and "max seq len (40960)" in done.stderr
        and "estimated maximum model length" in done.stderr
    )


@pytest.mark.parametrize(
    ("content", "named"),
    [
        ({"engine_death": {"after_requests": 2}, "bogus": 1}, "bogus: unknown key"),
        ({"engine_death": {"after_request": 2}}, "engine_death.after_request: unknown key"),
        ({"faults": [{"kind": "explode", "probability": 0.1}]}, "faults.0.kind"),
        (
            {"faults": [{"kind": "cut", "probabilty": 0.1}]},
            "faults.0.probabilty: unknown key; did you mean faults.0.probability?",
        ),
    ],
)
def test_fault_file_is_strict(tmp_path: Path, profile_file: Path, content: dict[str, Any], named: str) -> None:
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(content))
    done = run_sim("--profile", str(profile_file), "--faults", str(path))
    assert done.returncode == 2 and named in done.stderr


def test_engine_faults_need_a_profile() -> None:
    done = run_sim("--die-after-requests", "3")
    assert done.returncode == 2 and "give --profile" in done.stderr


def test_without_chunked_prefill_a_prompt_waits_for_a_step_with_room_for_all_of_it() -> None:
    tiny = PROFILES["vllm-cpu-tiny"]  # 2,048 tokens a step
    prompts = [(1500, 2), (1500, 2)]
    chunked = dry_run(tiny, tiny.plan().cache.num_blocks, prompts)
    assert chunked.steps[0].prefill_tokens == 2048  # the second prompt's first 548 tokens rode along
    whole = tiny.with_serving(ServeConfig(enable_chunked_prefill=False))
    unchunked = dry_run(whole, whole.plan().cache.num_blocks, prompts)
    assert unchunked.steps[0].prefill_tokens == 1500  # the second prompt did not fit beside it
    assert unchunked.steps[1].prefill_tokens == 1500  # prefilled whole in the next step


def test_without_chunked_prefill_a_step_budget_under_max_model_len_refuses_to_start_like_vllm() -> None:
    done = run_sim("--profile", "vllm-cpu-tiny", "--max-num-batched-tokens", "1024", "--no-enable-chunked-prefill")
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "ValueError: max_num_batched_tokens (1024) is smaller than max_model_len (2048). This effectively limits "
        "the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. Please "
        "increase max_num_batched_tokens or decrease max_model_len."
    )
