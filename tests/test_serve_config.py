"""The server's configuration: `vllm serve` config files and command lines read as vLLM 0.32 reads
them, `llmload capacity --vllm-config` (startup figures and refusals), its preflight of a workload,
and `llmload sim --vllm-config` sizing the embedded target like that server.

The real vLLM's side of each check is in tests/test_serve_config_vllm.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from llmload.cli import build_parser, main
from llmload.errors import InputError
from llmload.server.serve_config import read_serve_config, serve_launcher
from llmload.sim.process import SimProcess
from llmload.sweep.run import simulator_serve
from tests.locust_runs import REPO, metrics_text, run_locust, small_workload, tiny_llama_config

MIB = 1 << 20


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def capacity(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(["capacity", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


# A tiny-llama server as the real-vLLM tests run it (1 KiB of KV per token, 128-token CPU blocks).
def tiny(tmp_path: Path, length: int = 1024, kv: str = "4M", seqs: int = 8, name: str = "tiny.yaml") -> Path:
    return tiny_llama_config(tmp_path / name, length=length, kv=kv, seqs=seqs, extra="enforce-eager: true\n")


# --------------------------------------------------------------------------- the reader


def test_a_setting_left_unset_resolves_to_vllms_default_and_a_set_one_stays() -> None:
    config = read_serve_config(command_line="vllm serve m --block-size 32 --no-enable-prefix-caching")
    vllm = config.resolved()
    assert (vllm.block_size, vllm.enable_prefix_caching) == (32, False)
    assert (vllm.tensor_parallel_size, vllm.gpu_memory_utilization, vllm.kv_cache_dtype) == (1, 0.92, "auto")
    assert vllm.max_model_len is None and vllm.origins == config.origins  # derived by vLLM: left to the caller


def test_keys_with_dashes_or_underscores_read_alike(tmp_path: Path) -> None:
    dashes = read_serve_config(write(tmp_path / "a.yaml", "max-model-len: 4096\ngpu-memory-utilization: 0.85\n"))
    underscores = read_serve_config(write(tmp_path / "b.yml", "max_model_len: 4096\ngpu_memory_utilization: 0.85\n"))
    assert (dashes.max_model_len, dashes.gpu_memory_utilization) == (4096, 0.85)
    assert underscores.model_dump(exclude={"origins"}) == dashes.model_dump(exclude={"origins"})
    where = tmp_path / "b.yml"
    assert underscores.origins == {"max_model_len": f"{where}:1", "gpu_memory_utilization": f"{where}:2"}


def test_the_command_line_wins_over_the_file(tmp_path: Path) -> None:
    path = write(tmp_path / "c.yaml", "model: Qwen/Qwen3-8B\nmax-model-len: 8192\nmax-num-seqs: 64\n")
    config = read_serve_config(path, "vllm serve --max-model-len 2048 -tp 2 --max_num_batched_tokens=16k")
    assert config.model == "Qwen/Qwen3-8B"
    assert (config.max_model_len, config.max_num_seqs, config.tensor_parallel_size) == (2048, 64, 2)
    assert config.max_num_batched_tokens == 16_000  # vLLM's human-readable ints: k is 1,000
    assert config.origins["max_model_len"] == "--vllm-args"
    assert config.origins["max_num_seqs"] == f"{path}:3"
    # a command line that names its own --config file, and the model as vLLM's positional argument
    inline = read_serve_config(None, f"vllm serve meta-llama/Llama-3.1-8B --config {path} --max-model-len 4k")
    assert (inline.model, inline.max_model_len, inline.max_num_seqs) == ("meta-llama/Llama-3.1-8B", 4000, 64)


def test_values_are_read_as_vllm_reads_them(tmp_path: Path) -> None:
    path = write(
        tmp_path / "v.yaml",
        "kv-cache-memory-bytes: 64M\nmax-model-len: auto\nenable-prefix-caching: false\n"
        "served-model-name: [chat, chat-v2]\nenforce-eager: false\ncompilation-config: {mode: 3}\n",
    )
    config = read_serve_config(path)
    assert config.kv_cache_memory_bytes == 64 * MIB  # M is binary
    assert config.max_model_len == -1  # vLLM's auto-fit
    assert config.enable_prefix_caching is False  # `false` is --no-enable-prefix-caching
    assert config.served_model_name == "chat"
    # vLLM accepts these but llmload does not use them: listed, not dropped
    assert config.not_modelled == {"enforce-eager": False, "compilation-config": '{"mode": 3}'}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model: x\nmax-model-length: 4096\n", ":2: max-model-length: vLLM 0.32.0 does not know this key and would "
         "refuse to start; did you mean max-model-len?"),
        ("swap-space: 4\n", ":1: swap-space: the V1 engine preempts by recomputing"),
        ("max-model-len: lots\n", ":1: argument --max-model-len: invalid human_readable_int_or_auto value: 'lots'"),
        ("kv-cache-memory-bytes: 2.5G\n", ":1: argument --kv-cache-memory-bytes: Decimals are not allowed with binary"),
        ("max-num-seqs: 8K\n", ":1: argument --max-num-seqs: invalid int value: '8K'"),
        ("max-num-seqs: true\n", ":1: argument --max-num-seqs: expected one argument"),
        ("dtype: fp4\n", ":1: argument --dtype: invalid choice: 'fp4' (choose from 'auto', 'bfloat16',"),
        ("model: m\ncompilation-config: {level: 3}\n", ":2: argument --compilation-config/-cc: 'level' is not a key"),
        ("gpu-memory-utilization: 1.5\n", ":1: gpu_memory_utilization: Input should be less than or equal to 1"),
        ("- max-model-len\n", "expected a mapping of vLLM options"),
    ],
)  # fmt: skip
def test_what_vllm_refuses_is_refused_with_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = write(tmp_path / "bad.yaml", text)
    rc, out, err = capacity(capsys, "--vllm-config", str(path), "--gpu", "h100-80gb")
    assert rc == 2, out
    assert f"llmload capacity: {path}" in err
    assert message in err


def test_a_sweeps_server_command_decides_how_its_config_is_read(tmp_path: Path) -> None:
    """`vllm serve --config` drops a `false` (the api_server honours it): a sweep whose --serve is
    `vllm serve` predicts its configurations as that command reads them (the rule: test_serve_config_vllm)."""
    path = tmp_path / "c.yaml"
    path.write_text("model: m\nenable-prefix-caching: false\nmax-num-seqs: 8\n")
    assert serve_launcher("/opt/vllm/bin/vllm serve --config {config} --port {port}") == "vllm serve"
    assert serve_launcher(simulator_serve()) is None and serve_launcher("vllm 'serve") is None
    by_api_server = read_serve_config(path)
    by_serve = read_serve_config(path, serve_launcher("vllm serve --config {config}"))
    assert (by_api_server.enable_prefix_caching, by_api_server.max_num_seqs) == (False, 8)
    assert (by_serve.enable_prefix_caching, by_serve.max_num_seqs) == (None, 8)


def test_a_bad_command_line_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for args, message in (
        ("--max-model-len", "--vllm-args: argument --max-model-len: expected one argument"),
        (
            "--enforce-eager=1",
            "--vllm-args: argument --enforce-eager/--no-enforce-eager: ignored explicit argument '1'",
        ),
        ("--max-num 3", "--vllm-args: ambiguous option: --max-num could match"),
        ("--maxmodel-len 5", "did you mean max-model-len?"),
        ("vllm serve m extra", "unexpected argument 'extra'"),
    ):
        with pytest.raises(InputError, match=message.replace("?", r"\?")):
            read_serve_config(None, args)


# --------------------------------------------------------------------------- capacity from a config


def test_capacity_predicts_vllms_startup_lines_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """4 MiB of KV at 1 KiB a token in 128-token blocks: the real server logs 'CPU KV cache size: 4,096
    tokens, Maximum concurrency for 2,048 tokens per request: 2.00x' (tests/data/vllm-logs/cpu-4mib-len2048.log)."""
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, length=2048)), "--json")
    assert rc == 0
    answer = json.loads(out)
    assert answer["vllm_config"]["origins"]["kv_cache_memory_bytes"].endswith("tiny.yaml:5")
    report = answer["capacity"]
    assert report["vllm_log_kv_cache_tokens"] == 4096
    assert report["at_max_model_len"]["max_concurrency"] == 2.0
    assert report["startup_error"] is None
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, length=2048)))
    assert "Maximum concurrency for 2,048 tokens per request: 2.00x" in out
    assert "not modelled: enforce-eager=True" in out


def test_capacity_gives_vllms_refusal_before_anything_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1 MiB of KV and max-model-len 4096: the real server refused with 'the estimated maximum model
    length is 896' (tests/data/vllm-logs/cpu-1mib-len4096-too-long.log)."""
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, length=4096, kv="1M")))
    assert rc == 1
    assert "vLLM will refuse  ValueError: To serve at least one request with the model's max seq len (4096)" in out
    assert "the estimated maximum model length is 896." in out
    logged = (REPO / "tests/data/vllm-logs/cpu-1mib-len4096-too-long.log").read_text()
    predicted = json.loads(capacity(capsys, "--vllm-config", str(tiny(tmp_path, 4096, "1M")), "--json")[1])
    assert predicted["capacity"]["startup_error"] in logged


def test_flags_win_over_the_config_and_a_gpu_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "q.yaml", "model: Qwen/Qwen3-8B\nmax-model-len: 40960\ngpu-memory-utilization: 0.9\n")
    rc, out, _ = capacity(capsys, "--vllm-config", str(path), "--gpu", "rtx-4090", "--json")
    report = json.loads(out)["capacity"]
    assert rc == 1 and report["model"]["name"] == "qwen3-8b" and report["memory"]["gpu_memory_gib"] == 23.53
    assert "(5.62 GiB KV cache is needed" in report["startup_error"]  # vLLM's figure for 40,960 tokens
    rc, out, _ = capacity(capsys, "--vllm-config", str(path), "--gpu", "rtx-4090", "--max-model-len", "16384", "--json")
    assert rc == 0 and json.loads(out)["capacity"]["max_model_len"] == 16384
    rc, _, err = capacity(capsys, "--vllm-config", str(path), "--gpu", "tpu-v9")
    assert rc == 2 and "unknown GPU 'tpu-v9'" in err


# --------------------------------------------------------------------------- the preflight


def test_preflight_says_which_stage_stops_fitting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The sample workload (history up to ~4k tokens) on a tiny-llama with 64 MiB of KV, timed by the CPU
    server's calibrated profile: with max-num-seqs 8 the server completes fewer requests a second than
    the 150% stage of 5 req/s asks (compute-bound, never "fits"), with 32 it keeps up with a margin; with
    8 MiB of KV (8,192 tokens) neither memory nor compute holds it."""
    workload = str(REPO / "workloads" / "chat-multiturn.yaml")
    common = ["--workload", workload, "--target-qps", "5", "--profile", "vllm-cpu-tiny", "--json"]
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, 4096, "64M", seqs=8)), *common)
    fit = json.loads(out)["preflight"]
    compute = fit["compute"]
    assert rc == 1 and not fit["passes"]
    by_stage = {s["stage"]: s for s in fit["stages"]}
    assert list(by_stage) == ["25%", "50%", "100%", "150%"]
    assert by_stage["150%"]["in_flight"] == pytest.approx(7.5 * by_stage["150%"]["e2e_s"])  # Little's law
    for stage in compute["stages"]:
        assert stage["utilization"] == pytest.approx(stage["qps"] / compute["saturation_qps"])
        expected = (
            "compute-bound"
            if stage["utilization"] >= 1
            else "near saturation"
            if stage["utilization"] >= 0.9
            else "keeps up"
        )
        assert stage["outcome"] == expected
    assert compute["stages"][-1]["outcome"] == "compute-bound" and compute["stages"][0]["outcome"] == "keeps up"
    assert compute["stages"][-1]["ttft_mean_s"] is None  # no steady state to predict
    assert any("compute-bound: the queue grows without bound" in reason for reason in fit["reasons"])
    assert fit["context"]["refused"] == 0.0 and fit["context"]["recommended_max_model_len"] == 4000
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, 4096, "64M", seqs=32)), *common)
    wide = json.loads(out)["preflight"]
    assert rc == 0 and wide["passes"] and "150%" in wide["margin"]
    assert wide["compute"]["saturation_qps"] > compute["saturation_qps"]  # more sequences per step
    ttfts = [s["ttft_mean_s"] for s in wide["compute"]["stages"]]
    assert ttfts == sorted(ttfts)  # queueing grows with the rate
    # the same server with 8 MiB of KV: 8,192 tokens hold ~6 requests of ~1,300
    rc, out, _ = capacity(capsys, "--vllm-config", str(tiny(tmp_path, 4096, "8M", seqs=32)), *common)
    small = json.loads(out)["preflight"]
    assert rc == 1 and small["stages"][-1]["kv_tokens"] == 8192
    assert small["compute"]["saturation_qps"] < wide["compute"]["saturation_qps"]


def test_preflight_needs_the_servers_timing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = str(REPO / "workloads" / "chat-multiturn.yaml")
    rc, _, err = capacity(capsys, "--vllm-config", str(tiny(tmp_path, 4096, "64M")), "--workload", workload)
    assert rc == 2 and "give --gpu NAME" in err


def test_preflight_without_target_qps_takes_the_workloads_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sample workload's file says 4 req/s: the stages are percents of that, as the load test's are."""
    workload = str(REPO / "workloads" / "chat-multiturn.yaml")
    config = str(tiny(tmp_path, 4096, "64M", seqs=32))
    rc, out, _ = capacity(
        capsys, "--vllm-config", config, "--workload", workload, "--profile", "vllm-cpu-tiny", "--json"
    )
    assert rc in (0, 1)
    assert [s["qps"] for s in json.loads(out)["preflight"]["stages"]] == [1.0, 2.0, 4.0, 6.0]
    rc, _, err = capacity(capsys, "--vllm-config", config, "--workload", workload, "--target-qps", "-1")
    assert rc == 2 and "--target-qps: Input should be greater than 0" in err


def test_preflight_counts_context_refusals_per_turn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """max-model-len 2048: late turns of the sample workload carry more history than that."""
    workload = str(REPO / "workloads" / "chat-multiturn.yaml")
    timing = ("--profile", "vllm-cpu-tiny")
    rc, out, _ = capacity(
        capsys,
        "--vllm-config",
        str(tiny(tmp_path, 2048, "64M", 64)),
        "--workload",
        workload,
        "--target-qps",
        "1",
        *timing,
    )
    assert rc == 1
    assert "requests refused (HTTP 400 context_length)" in out
    rc, out, _ = capacity(
        capsys,
        "--vllm-config", str(tiny(tmp_path, 2048, "64M", 64)), "--workload", workload, "--target-qps", "1", "--json",
        *timing,
    )  # fmt: skip
    context = json.loads(out)["preflight"]["context"]
    turns = context["by_turn"]
    assert turns[0]["refused"] == 0.0 and turns[-1]["refused"] > 0.5  # history grows past the limit
    assert 0.01 < context["refused"] < 0.2


def test_preflight_takes_e2e_from_a_measured_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = small_workload(tmp_path)
    with SimProcess("--ttft-ms", "30", "--itl-ms", "20") as sim:
        run = run_locust(
            sim.url, workload, tmp_path / "reports", "measured", "--target-qps", "4", "--stages", "100",
            "--stage-duration", "4", "--warmup", "0",
        )  # fmt: skip
    assert run.returncode == 0, run.output
    e2e_s = run.records.query("status == 'ok'")["e2e_ms"].mean() / 1000
    config = tiny(tmp_path, 4096, "64M", seqs=64)
    rc, out, _ = capacity(
        capsys, "--vllm-config", str(config), "--workload", str(workload), "--target-qps", "4", "--stages", "100,150",
        "--from-run", str(run.run_dir), "--profile", "vllm-cpu-tiny", "--json",
    )  # fmt: skip
    stages = json.loads(out)["preflight"]["stages"]
    assert rc == 0
    assert stages[0]["e2e_s"] == pytest.approx(e2e_s, rel=1e-6) and "stage 100%" in stages[0]["e2e_source"]
    assert "predicted" in stages[1]["e2e_source"]  # no 150% stage in that run: the prediction's


# --------------------------------------------------------------------------- the simulator from a config


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: dict[str, Any] = json.loads(response.read())
    return body


def _chat(url: str, prompt_words: int) -> tuple[int, dict[str, object]]:
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "word " * prompt_words}], "max_tokens": 4}
    request = urllib.request.Request(f"{url}/v1/chat/completions", data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_simulator_is_sized_like_the_configured_server(tmp_path: Path) -> None:
    with SimProcess(
        "--profile", "vllm-cpu-tiny", "--vllm-config", str(tiny(tmp_path, length=1024, kv="4M", seqs=4))
    ) as sim:
        models = _get(f"{sim.url}/v1/models")["data"]
        assert models == [models[0]] and models[0]["id"] == "tiny-llama" and models[0]["max_model_len"] == 1024
        status, error = _chat(sim.url, 2000)
        assert status == 400 and "maximum context length is 1024 tokens" in json.dumps(error)
        assert _chat(sim.url, 10)[0] == 200
        metrics = metrics_text(sim.url)
    # vLLM's cache_config_info gauge carries the sizing: 32 blocks of 128 tokens (4 MiB at 1 KiB/token)
    info = next(line for line in metrics.splitlines() if line.startswith("vllm:cache_config_info"))
    assert 'num_gpu_blocks="32"' in info and 'block_size="128"' in info


def test_the_simulator_refuses_a_config_vllm_refuses(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="exited with code 1") as caught:
        SimProcess("--profile", "vllm-cpu-tiny", "--vllm-config", str(tiny(tmp_path, length=8192, kv="4M"))).start()
    assert "estimated maximum model length is 3968" in str(caught.value)


def test_a_config_without_a_model_starts_the_profile_given(tmp_path: Path) -> None:
    config = write(tmp_path / "c.yaml", "max-num-seqs: 4\nmax-model-len: 1024\n")  # as most --config files: no model
    with SimProcess("--profile", "vllm-cpu-tiny", "--vllm-config", str(config), "--model", "served") as sim:
        models = _get(f"{sim.url}/v1/models")["data"]
    assert [(m["id"], m["max_model_len"]) for m in models] == [("served", 1024)]


def test_flags_win_over_the_command_line_which_wins_over_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tiny(tmp_path, length=1024, kv="4M", seqs=4)
    rc = main(
        [
            "capacity",
            "--vllm-config",
            str(config),
            "--vllm-args",
            "--max-model-len 2048",
            "--max-model-len",
            "512",
            "--json",
        ]
    )
    answer = json.loads(capsys.readouterr().out)
    assert rc == 0 and answer["capacity"]["max_model_len"] == 512
    assert answer["vllm_config"]["origins"]["max_model_len"] == "--max-model-len"


def test_old_flag_spellings_still_work_and_say_their_new_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = write(tmp_path / "config.json", (REPO / "llmload/capacity/models/tiny-llama.json").read_text())
    assert main(["capacity", "--config", str(hf), "--kv-cache-gib", "1", "--max-model-len", "1024"]) == 0
    assert "--config is deprecated, use --hf-config" in capsys.readouterr().err
    assert main(["capacity", "--hf-config", str(hf), "--kv-cache-gib", "1", "--max-model-len", "1024"]) == 0
    assert "deprecated" not in capsys.readouterr().err
    for spelling, warned in (("--model", False), ("--model-name", True)):
        assert build_parser("sim").parse_args(["sim", spelling, "served"]).model_name == "served"
        assert ("--model-name is deprecated, use --model" in capsys.readouterr().err) is warned
