"""Predicting a server before deploying it (docs/prediction.md): the timing derived from the model and
the GPU's data sheet (llmload/perf), `llmload predict` against public measurements of vLLM on GPUs
(tests/data/gputruth), and the preflight judging compute as well as memory."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from llmload.capacity.kv import kv_layout
from llmload.capacity.model import load_bundled_model, model_spec_from_config
from llmload.hardware.gpus import GPUS, hbm_bytes_per_s, peak_flops
from llmload.models import ServeConfig
from llmload.perf.derive import derive_timing, precision
from llmload.predict.bench import BenchLoad, predict_bench
from llmload.predict.points import BANDS, accuracy, load_points, predict_point
from llmload.sim.process import SimProcess
from llmload.sim.profiles import resolve_profile
from tests.locust_runs import fixed_output_workload

POINTS = Path(__file__).parent / "data" / "gputruth" / "points.yaml"


def llmload(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "llmload.cli", *args]
    return subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)


# --------------------------------------------------------------------------- the derived timing


@pytest.mark.parametrize("name", list(GPUS))
def test_every_gpus_derived_steps_stay_under_its_roofline(name: str) -> None:
    """No step is faster than the data sheet allows: reading its bytes at the peak bandwidth, or
    computing its FLOPs at the peak rate (the efficiencies are fractions of the peaks, never above)."""
    card = GPUS[name]
    model = load_bundled_model("llama-3.1-8b")
    serving = ServeConfig().resolved()
    layout = kv_layout(model)
    timing = derive_timing(model, serving, layout, card)
    for seqs, kv, prefill, pairs in ((1, 100, 0, 0), (64, 64_000, 0, 0), (1, 2048, 2048, 2048 * 2049 // 2)):
        tokens = prefill + seqs
        floor_read = (timing.weight_bytes + timing.kv_bytes_per_token * kv) / hbm_bytes_per_s(card)
        flops = timing.flops_per_token * tokens + timing.attention_flops_per_pair * (pairs + kv)
        floor_compute = flops / peak_flops(card, "bf16")
        assert timing.step_s(seqs, kv, prefill, pairs) >= max(floor_read, floor_compute)
        assert timing.step_s(seqs, kv, prefill, pairs) < 10 * max(floor_read, floor_compute) + 0.01


def test_timing_follows_the_gpu_and_the_shape_not_the_name() -> None:
    """Two models of one shape get one timing; one model on two GPUs gets their bandwidths' ratio in a
    memory-bound decode step (no profile is picked by a model's name)."""
    config = json.loads((Path("llmload/capacity/models/llama-3.1-8b.json")).read_text())
    renamed = model_spec_from_config(config, name="anything-else", source="x")
    original = load_bundled_model("llama-3.1-8b")
    serving = ServeConfig().resolved()
    h100, a100 = GPUS["h100-80gb"], GPUS["a100-40gb"]
    one = derive_timing(original, serving, kv_layout(original), h100)
    two = derive_timing(renamed, serving, kv_layout(renamed), h100)
    assert one.model_dump(exclude={"derivation"}) == two.model_dump(exclude={"derivation"})
    slow = derive_timing(original, serving, kv_layout(original), a100)
    decode = (1, 200, 0, 0)
    read_ratio = (one.step_s(*decode) - one.fixed_step_s) / (slow.step_s(*decode) - slow.fixed_step_s)
    assert read_ratio == pytest.approx(a100.hbm_tb_s / h100.hbm_tb_s, rel=0.02)


def test_quantization_fp8_kv_and_eager_change_what_a_step_costs() -> None:
    base = load_bundled_model("qwen3-8b")
    h100 = GPUS["h100-80gb"]
    serving = ServeConfig().resolved()
    plain = derive_timing(base, serving, kv_layout(base), h100)
    awq = base.model_copy(update={"weight_bytes_per_param": 0.5, "quantization": "awq"})
    assert precision(awq, serving, h100).compute == "bf16"
    assert derive_timing(awq, serving, kv_layout(awq), h100).weight_bytes < 0.4 * plain.weight_bytes
    int8 = base.model_copy(update={"weight_bytes_per_param": 1.0, "quantization": "compressed-tensors-w8a8-int8"})
    assert precision(int8, serving, h100).compute == "int8"
    fp8 = base.model_copy(update={"weight_bytes_per_param": 1.0, "quantization": "fp8"})
    assert precision(fp8, serving, h100).compute == "fp8"
    assert precision(fp8, serving, GPUS["a100-80gb"]).compute == "bf16"  # Ampere: W8A16 Marlin
    fp8_kv = derive_timing(base, serving, kv_layout(base, kv_cache_dtype="fp8"), h100)
    assert fp8_kv.kv_bytes_per_token * 2 == plain.kv_bytes_per_token
    eager = derive_timing(base, serving, kv_layout(base), h100, enforce_eager=True)
    assert eager.fixed_step_s > plain.fixed_step_s


def test_compressed_tensors_int8_weights_are_read_from_the_checkpoint() -> None:
    config = json.loads(Path("llmload/capacity/models/llama-3.1-8b.json").read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "group_0": {
                "weights": {"num_bits": 8, "type": "int", "symmetric": True},
                "input_activations": {"num_bits": 8, "type": "int", "dynamic": True},
            }
        },
    }
    spec = model_spec_from_config(config, name="w8a8", source="config.json")
    assert spec.weight_bytes_per_param == 1.0
    assert spec.quantization == "compressed-tensors-w8a8-int8"


def test_keys_a_config_leaves_out_take_vllms_defaults(tmp_path: Path) -> None:
    """A Qwen3-14B file without tensor-parallel-size or max-model-len is TP 1 at the model's own length,
    with the GPU's batch defaults, as vLLM runs it, and the KV pool capacity computes for the same file."""
    config = tmp_path / "qwen.yaml"
    config.write_text("model: Qwen/Qwen3-14B\n")
    profile, plan = resolve_profile(None, ServeConfig(model="Qwen/Qwen3-14B"), gpu_name="h100-80gb")
    resolved = profile.serving.resolved()
    assert resolved.tensor_parallel_size == 1
    assert profile.max_model_len == 40960
    assert (profile.max_num_seqs, profile.max_num_batched_tokens) == (1024, 8192)  # H100: EngineArgs' defaults
    capacity = llmload("capacity", "--vllm-config", str(config), "--gpu", "h100-80gb", "--json")
    assert capacity.returncode == 0, capacity.stderr
    assert json.loads(capacity.stdout)["capacity"]["vllm_log_kv_cache_tokens"] == plan.vllm_log_kv_cache_tokens
    _, a100 = resolve_profile(None, ServeConfig(model="Qwen/Qwen3-14B"), gpu_name="a100-80gb")
    assert a100.max_model_len == 40960


# --------------------------------------------------------------------------- llmload predict


def test_predict_prints_what_vllm_bench_serve_would(tmp_path: Path) -> None:
    config = tmp_path / "qwen.yaml"
    config.write_text("model: Qwen/Qwen3-8B\n")
    common = ["predict", "--vllm-config", str(config), "--gpu", "h100-80gb", "--input-len", "512",
              "--output-len", "128", "--num-prompts", "200"]  # fmt: skip
    text = llmload(*common, "--max-concurrency", "8")
    assert text.returncode == 0, text.stderr
    for line in ("Serving Benchmark Result", "Request throughput (req/s):", "Mean TTFT (ms):", "P99 ITL (ms):",
                 "How far to trust it: derived"):  # fmt: skip
        assert line in text.stdout
    closed = json.loads(llmload(*common, "--max-concurrency", "8", "--json").stdout)
    burst = json.loads(llmload(*common, "--json", "--target-qps", "50").stdout)
    # eight in flight at a time: at most 8 × (1 / TPOT) tokens a second, far below the burst's
    assert closed["output_throughput"] <= 8 * 1000 / closed["mean_tpot_ms"] * 1.01
    assert burst["output_throughput"] > 3 * closed["output_throughput"]
    assert burst["replicas_for_target_at_150pct"] == math.ceil(75 / burst["saturation_request_throughput"])
    assert closed["total_input_tokens"] == 200 * 512 and closed["timing_source"] == "derived"
    too_long = llmload(*common[:-6], "--input-len", "50000", "--output-len", "10")
    assert too_long.returncode == 2 and "exceeds max_model_len" in too_long.stderr


def test_predict_needs_a_timing() -> None:
    result = llmload("predict", "--vllm-args", "vllm serve Qwen/Qwen3-8B")
    assert result.returncode == 2 and "--gpu NAME" in result.stderr


def test_a_load_at_a_rate_below_saturation_keeps_its_ttft_short() -> None:
    profile, plan = resolve_profile(None, ServeConfig(model="Qwen/Qwen3-8B"), gpu_name="h100-80gb")
    burst = predict_bench(profile, plan.cache.num_blocks, BenchLoad(input_len=1000, output_len=200, num_prompts=500))
    calm = predict_bench(
        profile,
        plan.cache.num_blocks,
        BenchLoad(input_len=1000, output_len=200, num_prompts=500, request_rate=0.3 * burst.request_throughput),
    )
    assert calm.ttft_ms.mean < burst.ttft_ms.mean / 10
    assert calm.request_throughput == pytest.approx(0.3 * burst.request_throughput, rel=0.15)


# --------------------------------------------------------------------------- against public measurements


@pytest.fixture(scope="module")
def public_points() -> list:
    return [predict_point(point, POINTS.parent) for point in load_points(POINTS)]


def test_predictions_of_the_public_points_hold_their_bands(public_points: list) -> None:
    """docs/prediction.md's bands: throughput and TPOT within 0.8–1.25 of measured on at least 80% of the
    points, TTFT within 0.67–1.5 on at least 70%."""
    rows = {row.figure: row for row in accuracy(public_points)}
    throughput = [p.ratios[f] for p in public_points for f in ("output_tok_per_s", "e2e_batch_ms") if f in p.ratios]
    low, high = BANDS["output_tok_per_s"]
    assert sum(low <= r <= high for r in throughput) >= 0.8 * len(throughput)
    assert rows["tpot_mean_ms"].within_band >= 0.8 * rows["tpot_mean_ms"].points
    assert rows["ttft_mean_ms"].within_band >= 0.7 * rows["ttft_mean_ms"].points


def test_predict_points_prints_the_table() -> None:
    result = llmload("predict", "--points", str(POINTS), "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert {p["id"] for p in answer["points"]} >= {"P01", "P13", "P23"}
    assert {r["figure"] for r in answer["accuracy"]} >= {"output_tok_per_s", "ttft_mean_ms", "tpot_mean_ms"}


# --------------------------------------------------------------------------- the preflight against the sized simulator


def _preflight(config: Path, workload: Path, target: float) -> dict:
    result = llmload(
        "capacity", "--vllm-config", str(config), "--gpu", "l4", "--workload", str(workload),
        "--target-qps", f"{target:.4f}", "--json",
    )  # fmt: skip
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)["preflight"]


SHARES = (0.85, 1.3)  # of the predicted saturation rate, asked by the 150% stage


def _soak(url: str, workload: Path, target: float, reports: Path, run_id: str) -> subprocess.Popen[str]:
    """A short soak (4 s ramp stages, a 60 s hold at 150%: the six 10 s windows keeping up needs), started
    and left running."""
    command = [
        sys.executable, "-m", "llmload.cli", "soak", "--host", url, "--workload", str(workload),
        "--target-qps", f"{target:.4f}", "--ramp-stage-duration", "4s", "--duration", "60s", "--arrival", "constant",
        "--reports-dir", str(reports), "--run-id", run_id,
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_the_preflight_never_passes_what_the_sized_simulator_fails(tmp_path: Path) -> None:
    """Targets whose 150% stage asks 85% and 130% of the predicted saturation rate: the preflight PASSes
    the first (below 90%) and calls the second compute-bound; a soak of the simulator sized from the same
    file and GPU at the same target does not FAIL where the preflight PASSed (a 60 s hold at 85% says
    INCONCLUSIVE or PASS), and FAILs where it said compute-bound (in flight grows ~3x in the hold).
    Llama-3.1-8B on an L4 with max-num-seqs 8, so the saturated server streams
    ~140 tokens/s (this machine keeps up with two of them at once) and answers in ~7 s; both soaks run
    together, each against its own simulator."""
    config = tmp_path / "server.yaml"
    config.write_text("model: meta-llama/Llama-3.1-8B-Instruct\nmax-num-seqs: 8\nmax-model-len: 4096\n")
    workload = fixed_output_workload(tmp_path, 128, sessions=200)
    saturation = _preflight(config, workload, 1.0)["compute"]["saturation_qps"]
    targets = [share * saturation / 1.5 for share in SHARES]
    fits = [_preflight(config, workload, target) for target in targets]
    assert [fit["passes"] for fit in fits] == [True, False]
    assert [fit["compute"]["stages"][-1]["outcome"] for fit in fits] == ["keeps up", "compute-bound"]
    with (
        SimProcess("--vllm-config", str(config), "--gpu", "l4") as low,
        SimProcess("--vllm-config", str(config), "--gpu", "l4") as high,
    ):
        soaks = [
            _soak(sim.url, workload, target, tmp_path / "reports", f"soak-{i}")
            for i, (sim, target) in enumerate(zip((low, high), targets, strict=True))
        ]
        outputs = [soak.communicate(timeout=300)[0] for soak in soaks]
    verdicts = [
        json.loads((tmp_path / "reports" / f"soak-{i}" / "summary.json").read_text())["verdict"]["outcome"]
        for i in range(len(SHARES))
    ]
    assert verdicts[0] != "fail", outputs[0][-3000:]  # the preflight PASSed it
    assert verdicts[1] == "fail", outputs[1][-3000:]  # the preflight called it compute-bound: so does the soak


def test_the_story_is_refused_at_8192_and_compute_bound_at_4096(tmp_path: Path) -> None:
    """docs/prediction.md's story: Llama-2-70B chat, TP 4 on A100 80 GB, the Azure conversation trace.
    max_model_len 8192 is past the model's 4,096 (vLLM's message, exit 1); at 4096 the preflight at
    4 req/s finds the 100% and 150% stages compute-bound (the server completes ~3 req/s of it)."""
    story = "model: meta-llama/Llama-2-70b-chat-hf\ntensor-parallel-size: 4\ngpu-memory-utilization: 0.9\n"
    long, short = tmp_path / "story-8192.yaml", tmp_path / "story.yaml"
    long.write_text(story + "max-model-len: 8192\n")
    short.write_text(story + "max-model-len: 4096\n")
    workload = tmp_path / "azure.yaml"
    built = llmload("workload", "build", str(Path(__file__).parent / "data" / "logs" / "azure-conv-2000.csv"),
                    "-o", str(workload))  # fmt: skip
    assert built.returncode == 0, built.stderr
    refused = llmload("capacity", "--vllm-config", str(long), "--gpu", "a100-80gb", "--json")
    assert refused.returncode == 1
    capacity = json.loads(refused.stdout)["capacity"]
    assert capacity["starts"] is False and "User-specified max_model_len (8192)" in capacity["startup_error"]
    started = llmload("sim", "--vllm-config", str(long), "--gpu", "a100-80gb", "--port", "0")
    assert started.returncode == 1 and "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in started.stderr
    pre = llmload(
        "capacity", "--vllm-config", str(short), "--gpu", "a100-80gb", "--workload", str(workload),
        "--target-qps", "4", "--json",
    )  # fmt: skip
    assert pre.returncode == 1
    fit = json.loads(pre.stdout)["preflight"]
    outcomes = [s["outcome"] for s in fit["compute"]["stages"]]
    assert outcomes[-2:] == ["compute-bound", "compute-bound"] and outcomes[0] == "keeps up"
    assert 2.0 < fit["compute"]["saturation_qps"] < 4.0
    assert all(
        c["recommended_max_model_len"] is None or c["recommended_max_model_len"] <= 4096 for c in [fit["context"]]
    )
