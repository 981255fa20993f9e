"""The model's limit on max_model_len, as vLLM derives and enforces it (llmload/capacity/max_len.py):
derived as vLLM's own `_get_and_verify_max_len` derives it (checked against the installed vLLM), refused
with vLLM's words by `llmload capacity`, `llmload sim` and `llmload sweep`, honoured
VLLM_ALLOW_LONG_MAX_MODEL_LEN, and never exceeded by a recommendation."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmload.capacity.max_len import allow_long_max_model_len, verify_max_model_len
from llmload.capacity.model import load_bundled_model, model_spec_from_config
from llmload.capacity.plan import CapacityInputs, plan_capacity
from llmload.cli import main
from llmload.models import ServeConfig
from llmload.server.serve_config import read_serve_config
from tests.locust_runs import fixed_output_workload, llmload_cli, tiny_llama_config

HERE = Path(__file__).parent
_LONG = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position encoding "
    "(RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position encoding, "
    "positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
)
# The story: Llama-2-70B (max_position_embeddings 4096) at 8192 tokens over 4 A100s.
STORY_ERROR = (
    "User-specified max_model_len (8192) is greater than the derived max_model_len (max_position_embeddings=4096.0 "
    "or model_max_length=None in model's config.json). To allow overriding this maximum, set the env var "
    f"VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. {_LONG}"
)
STORY = "model: meta-llama/Llama-2-70b-hf\nmax-model-len: {length}\ntensor-parallel-size: 4\n"


@pytest.fixture(autouse=True)
def _no_allow_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", raising=False)


def _story(tmp_path: Path, length: int = 8192) -> Path:
    path = tmp_path / "story.yaml"
    path.write_text(STORY.format(length=length))
    return path


def _capacity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    rc = main(["capacity", *argv])
    return rc, capsys.readouterr().out


# --------------------------------------------------------------------------- against vLLM's own function

_BASE = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128}
_LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **_BASE, "vocab_size": 128}


def _llama(**fields: Any) -> dict[str, Any]:
    return {**_LLAMA, **fields}


# (config, a max_model_len to try, disable_sliding_window): each is also tried unset and at 10**9, whose
# refusal names the derived length and its key as vLLM holds them.
CONFIGS: list[tuple[str, dict[str, Any], int, bool]] = [
    ("plain", _llama(max_position_embeddings=4096, rope_scaling=None), 8192, False),
    ("linear-4", _llama(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4}), 16384, False),
    (
        "linear-2.5",
        _llama(max_position_embeddings=4097, rope_theta=500000.0, rope_scaling={"rope_type": "linear", "factor": 2.5}),
        10243,
        False,
    ),
    ("dynamic", _llama(max_position_embeddings=4096, rope_scaling={"type": "dynamic", "factor": 2.0}), 8193, False),
    (
        "yarn",
        {
            "model_type": "qwen2",
            **_BASE,
            "vocab_size": 128,
            "max_position_embeddings": 32768,
            "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
        },
        32769,
        False,
    ),
    (
        "llama3",
        _llama(
            max_position_embeddings=131072,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
        ),
        131072,
        False,
    ),
    (
        "longrope",
        {
            "model_type": "phi3",
            **_BASE,
            "vocab_size": 128,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [2.0] * 8},
        },
        131073,
        False,
    ),
    (
        "su",
        {
            "model_type": "phi3",
            **_BASE,
            "vocab_size": 128,
            "max_position_embeddings": 131072,
            "original_max_position_embeddings": 4096,
            "rope_scaling": {
                "type": "su",
                "short_factor": [1.0] * 8,
                "long_factor": [2.0] * 8,
                "original_max_position_embeddings": 4096,
            },
        },
        65536,
        False,
    ),
    (
        "gpt2-n_positions",
        {
            "model_type": "gpt2",
            "n_embd": 64,
            "n_head": 4,
            "n_layer": 2,
            "n_inner": 256,
            "vocab_size": 128,
            "n_positions": 1024,
        },
        1025,
        False,
    ),
    ("smaller-model_max_length", _llama(max_position_embeddings=8192, model_max_length=4096), 6000, False),
    ("larger-model_max_length", _llama(max_position_embeddings=8192, model_max_length=131072), 131072, False),
    ("seq_length", _llama(max_position_embeddings=8192, seq_length=2048), 4096, False),
    (
        "mistral-window",
        {"model_type": "mistral", **_BASE, "vocab_size": 128, "max_position_embeddings": 32768, "sliding_window": 4096},
        8192,
        False,
    ),
    (
        "mistral-window-disabled",
        {"model_type": "mistral", **_BASE, "vocab_size": 128, "max_position_embeddings": 32768, "sliding_window": 4096},
        8192,
        True,
    ),
    (
        "mistral-window-0-disabled",
        {"model_type": "mistral", **_BASE, "vocab_size": 128, "max_position_embeddings": 32768, "sliding_window": 0},
        8192,
        True,
    ),
    (
        "qwen2-window-off-disabled",
        {
            "model_type": "qwen2",
            **_BASE,
            "vocab_size": 128,
            "max_position_embeddings": 32768,
            "sliding_window": 4096,
            "use_sliding_window": False,
        },
        8192,
        True,
    ),
    (
        "gemma3-nested",
        {
            "model_type": "gemma3_text",
            **_BASE,
            "vocab_size": 128,
            "head_dim": 16,
            "max_position_embeddings": 32768,
            "sliding_window": 512,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            },
        },
        32769,
        False,
    ),
    (
        "multimodal-text_config",
        {
            "model_type": "llava",
            "architectures": ["LlavaForConditionalGeneration"],
            "text_config": _llama(max_position_embeddings=4096),
        },
        4097,
        False,
    ),
]


def _cases() -> list[dict[str, Any]]:
    cases = []
    for _, config, length, disable in CONFIGS:
        for max_model_len in (None, length, 10**9):
            cases.append({"config": config, "max_model_len": max_model_len, "disable_sliding_window": disable})
    cases.append({"config": CONFIGS[0][1], "max_model_len": 8192, "allow_long": True})
    return cases


def _ours(case: dict[str, Any]) -> dict[str, Any]:
    spec = model_spec_from_config(case["config"], name="case", source="config.json")
    check = verify_max_model_len(
        spec.context_limit,
        case["max_model_len"],
        disable_sliding_window=case.get("disable_sliding_window", False),
        allow_long=case.get("allow_long", False),
    )
    return {"refused": check.error} if check.error else {"max_model_len": check.max_model_len}


@pytest.mark.vllm
def test_the_limit_is_derived_and_enforced_as_vllms_own_function_does() -> None:
    """Every config through vLLM's `_get_and_verify_max_len` in one batch (tests/vllm_max_len.py): the same
    length when unset, the same acceptance of a given one, and the same ValueError, word for word."""
    if os.environ.get("LLMLOAD_SKIP_VLLM") == "1":
        pytest.skip("real vLLM tests skipped: LLMLOAD_SKIP_VLLM=1")
    from tests.vllm_harness import child_env, ensure_vllm_venv

    cases = _cases()
    proc = subprocess.run(
        [str(ensure_vllm_venv()), str(HERE / "vllm_max_len.py")],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    theirs: list[dict[str, Any]] = json.loads(proc.stdout)
    names = [name for name, *_ in CONFIGS for _ in range(3)] + ["plain, VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"]
    for name, case, vllm in zip(names, cases, theirs, strict=True):
        assert _ours(case) == vllm, f"{name} at max_model_len {case['max_model_len']}"


# --------------------------------------------------------------------------- the rule, without vLLM


def test_the_bundled_configs_limits() -> None:
    limits = {
        name: (spec.context_limit.derived_max_model_len, spec.context_limit.key)
        for name in ("llama-2-70b", "llama-3.1-8b", "qwen3-8b", "deepseek-v3", "mixtral-8x7b")
        for spec in [load_bundled_model(name)]
    }
    assert limits == {
        "llama-2-70b": (4096.0, "max_position_embeddings"),
        "llama-3.1-8b": (131072.0, "max_position_embeddings"),  # llama3 RoPE: already scaled
        "qwen3-8b": (40960.0, "max_position_embeddings"),
        "deepseek-v3": (163840.0, "max_position_embeddings"),  # YaRN: already scaled
        "mixtral-8x7b": (32768.0, "max_position_embeddings"),
    }


@pytest.mark.parametrize(
    ("value", "allowed"),
    [("1", True), ("true", True), (" TRUE ", True), ("True", True), ("0", False), ("yes", False), ("", False)],
)
def test_the_env_var_counts_as_vllm_envs_reads_it(value: str, allowed: bool) -> None:
    assert allow_long_max_model_len({"VLLM_ALLOW_LONG_MAX_MODEL_LEN": value}) is allowed
    assert allow_long_max_model_len({}) is False


def test_a_config_without_a_length_key_takes_vllms_2048_with_its_warning() -> None:
    config = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_inner": 256, "vocab_size": 128}
    spec = model_spec_from_config(config, name="nolen", source="config.json")
    report = plan_capacity(spec, CapacityInputs(serving=ServeConfig(kv_cache_memory_bytes=2**30)))
    assert report.max_model_len == 2048 and report.starts and report.max_model_len_limit is None
    assert any("Assuming the model's maximum length is 2048." in w for w in report.warnings)
    given = plan_capacity(spec, CapacityInputs(serving=ServeConfig(kv_cache_memory_bytes=2**30, max_model_len=9000)))
    assert given.starts and given.max_model_len == 9000  # no key: vLLM takes any length given


# --------------------------------------------------------------------------- the plan


def _story_plan(length: int | None = 8192, **serving: Any) -> Any:
    inputs = CapacityInputs(
        serving=ServeConfig(model="meta-llama/Llama-2-70b-hf", max_model_len=length, tensor_parallel_size=4, **serving),
        gpu_memory_gib=79.15,
    )
    return plan_capacity(load_bundled_model("llama-2-70b"), inputs)


def test_past_the_limit_vllm_refuses_to_start_in_its_words() -> None:
    report = _story_plan()
    assert report.at_max_model_len.fits  # the KV cache holds 8,192 tokens: the model's limit refuses it
    assert report.starts is False and report.startup_error == STORY_ERROR
    assert report.max_model_len_limit == 4096 and report.max_model_len_limit_key == "max_position_embeddings"
    assert not any("VLLM_ALLOW_LONG_MAX_MODEL_LEN" in w for w in report.warnings)
    assert report.advice[0].startswith(
        "Lower --max-model-len to 4,096 (capped at the model's limit of 4,096 (max_position_embeddings)): "
    )
    assert _story_plan(4096).starts and _story_plan(4096).startup_error is None
    assert _story_plan(None).max_model_len == 4096  # unset: vLLM's derived length


def test_the_env_var_lets_it_start_with_vllms_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    report = _story_plan()
    assert report.starts and report.startup_error is None and report.max_model_len == 8192
    msg = STORY_ERROR.split(" To allow", maxsplit=1)[0]
    assert f"{msg} {_LONG}" in report.warnings
    assert report.recommended_max_model_len == 4096  # a recommendation still stays within the positions


def test_no_recommendation_exceeds_the_limit() -> None:
    """Auto-fit, one sequence, and --min-concurrency all stop at 4,096, and say they were capped."""
    for report in (_story_plan(-1), _story_plan(8192, max_num_seqs=4), _story_plan(4096)):
        assert report.recommended_max_model_len == 4096
    auto = _story_plan(-1)
    assert auto.max_model_len == 4096 and auto.starts
    inputs = CapacityInputs(
        serving=ServeConfig(max_model_len=8192, tensor_parallel_size=4), gpu_memory_gib=79.15, min_concurrency=2
    )
    report = plan_capacity(load_bundled_model("llama-2-70b"), inputs)
    assert report.max_model_len_for_min_concurrency == 4096
    for line in report.advice:
        for number in [int(n.replace(",", "")) for n in re.findall(r"--max-model-len ([\d,]+)", line)]:
            assert number <= 4096, line
    assert "(capped at the model's limit of 4,096 (max_position_embeddings))" in report.advice[0]


def test_disable_sliding_window_caps_the_limit_at_the_window() -> None:
    config = {"model_type": "mistral", **_BASE, "vocab_size": 128, "max_position_embeddings": 32768,
              "sliding_window": 4096}  # fmt: skip
    spec = model_spec_from_config(config, name="mistral", source="config.json")
    serving = ServeConfig(kv_cache_memory_bytes=2**30, max_model_len=8192)
    assert plan_capacity(spec, CapacityInputs(serving=serving)).starts
    disabled = read_serve_config(
        None, "vllm serve m --kv-cache-memory-bytes 1G --max-model-len 8192 --disable-sliding-window"
    )
    assert disabled.not_modelled == {"disable-sliding-window": True}
    report = plan_capacity(spec, CapacityInputs(serving=disabled))
    assert not report.starts and report.max_model_len_limit_key == "sliding_window"
    assert (
        report.startup_error is not None and "(sliding_window=4096.0 or model_max_length=None" in report.startup_error
    )


# --------------------------------------------------------------------------- the commands


def test_capacity_on_the_story_exits_1_with_vllms_message(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    story = str(_story(tmp_path))
    rc, out = _capacity(capsys, "--vllm-config", story, "--gpu", "a100-80gb")
    assert rc == 1
    assert f"vLLM will refuse  ValueError: {STORY_ERROR}" in out
    assert "one sequence fits  4,096 (capped at the model's limit of 4,096 (max_position_embeddings))" in out
    rc, out = _capacity(capsys, "--vllm-config", story, "--gpu", "a100-80gb", "--json")
    report = json.loads(out)["capacity"]
    assert rc == 1 and report["starts"] is False and report["startup_error"] == STORY_ERROR
    assert report["model"]["context_limit"]["derived_max_model_len"] == 4096.0
    rc, out = _capacity(capsys, "--vllm-config", story, "--gpu", "a100-80gb", "--max-model-len", "4096", "--json")
    assert rc == 0 and json.loads(out)["capacity"]["starts"] is True


def test_sim_refuses_to_start_as_vllm_would(tmp_path: Path) -> None:
    done = llmload_cli("sim", "--port", "0", "--vllm-config", str(_story(tmp_path)), "--gpu", "a100-80gb", timeout=60)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == f"ValueError: {STORY_ERROR}"


def test_a_predicted_sweep_does_not_start_a_configuration_past_the_limit(tmp_path: Path) -> None:
    """The bundled tiny-llama has 8,192 positions: a file asking 16,384 is a row that did not start, with
    vLLM's refusal as its prediction, and the simulator's refusal, read as a vLLM log, as its reason."""
    config = tiny_llama_config(tmp_path / "past-limit.yaml", length=16384, kv="64M", seqs=4)
    workload = fixed_output_workload(tmp_path, 16, sessions=20)
    done = llmload_cli(
        "sweep", "--reports-dir", str(tmp_path / "reports"), "--sweep-id", "s", "--predict-only",
        "--profile", "vllm-cpu-tiny", "--configs", str(config), "--workload", str(workload),
        "--start-qps", "1", "--max-qps", "2", "--resolution", "0.5", "--repeats", "1",
        "--probe-duration", "2s", "--probe-warmup", "1s",
        timeout=300,
    )  # fmt: skip
    output = done.stdout + done.stderr
    result = json.loads((tmp_path / "reports" / "s" / "predicted" / "sweep.json").read_text())
    (row,) = result["rows"]
    assert row["server"] == "did_not_start", output[-3000:]
    refusal = (
        "User-specified max_model_len (16384) is greater than the derived max_model_len "
        "(max_position_embeddings=8192.0 or model_max_length=None in model's config.json)."
    )
    assert row["predicted_startup"].startswith(f"refuses to start: {refusal}")
    assert "max_model_len 16,384 is above the model's own limit, 8,192 (max_position_embeddings)" in row["reason"]
