"""vLLM startup logs: `llmload capacity --vllm-log FILE --json` names the failed start (or none), with its
values and what to change, and exits 1 for a failed start, 0 for a healthy one.

Each `given` is a log in the shapes vLLM prints (V0 and V1 logger formats, EngineCore and worker
process prefixes, docker/kubectl timestamps, ANSI colours), its messages worded as the vLLM source
named in `source` prints them. `expect`: `exit`; `kind`, the failure named first (None: healthy);
`line`, the line it was read from; `values`, numbers read (sizes in GiB); `advice`, a fragment of
what to change; `not_advice`, fragments that must not be there; `kinds`, findings that must be there.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from llmload.cli import main
from tests.conformance import Case

KIND = "startup-log"

_TRACE = 'File "/usr/local/lib/python3.12/dist-packages/vllm/{}", line {}, in {}'

CASES: list[Case] = [
    Case(
        "v1-negative-kv-memory",
        "vllm/v1/worker/gpu_worker.py (determine_available_memory); kv_cache_utils.py raises on <= 0",
        "(EngineCore_0 pid=3001) INFO 08-20 18:04:10 [gpu_model_runner.py:2007] Model loading took 65.9651 GiB "
        "and 12.799889 seconds\n"
        "(EngineCore_0 pid=3001) INFO 08-20 18:04:22 [gpu_worker.py:276] Available KV cache memory: -2.14 GiB\n"
        "(EngineCore_0 pid=3001) ERROR 08-20 18:04:22 [core.py:700] EngineCore failed to start.\n",
        {
            "exit": 1,
            "kind": "no_kv_memory",
            "line": 2,
            "values": {"available_kv_gib": -2.14, "weights_gib": 65.9651},
            "advice": "raise --gpu-memory-utilization",
            "kinds": {"engine_failed"},
        },
    ),
    Case(
        "tp-sampler-oom-every-rank",
        "vllm/v1/worker/gpu_model_runner.py (_dummy_sampler_run); vllm-project/vllm#27508",
        "\n".join(
            [
                "(VllmWorker rank=0 pid=2961) INFO 03-19 07:27:40 [gpu_model_runner.py:1892] Model loading took "
                "35.1 GiB and 20.4 seconds",
                *(
                    f"(VllmWorker rank={rank} pid={2961 + rank}) ERROR 03-19 07:27:53 [multiproc_executor.py:375] "
                    + line
                    for rank in (0, 1)
                    for line in (
                        _TRACE.format("v1/worker/gpu_model_runner.py", 1292, "_dummy_sampler_run"),
                        "    raise RuntimeError(",
                        "RuntimeError: CUDA out of memory occurred when warming up sampler with 256 dummy requests. "
                        "Please try lowering max_num_seqs or gpu_memory_utilization when initializing the engine.",
                    )
                ),
                "(EngineCore_0 pid=2900) ERROR 03-19 07:27:54 [core.py:700] EngineCore failed to start.",
                "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
            ]
        ),
        {
            "exit": 1,
            "kind": "sampler_oom",
            "line": 4,
            "values": {"num_seqs": 256, "phase": "warming up the sampler"},
            "advice": "lower --max-num-seqs below 256 (e.g. 128) or --gpu-memory-utilization",
        },
    ),
    Case(
        "hybrid-sliding-window-token-figure-per-group",
        "vllm/v1/core/kv_cache_utils.py (_report_kv_cache_config: num_blocks // len(groups) × block_size)",
        "(APIServer pid=2001) INFO 04-15 09:33:52 [model.py:1685] Using max model len 262144\n"
        "(EngineCore pid=2002) INFO 04-15 09:35:17 [kv_cache_utils.py:1319] GPU KV cache size: 37,392 tokens\n"
        "(EngineCore pid=2002) INFO 04-15 09:35:17 [kv_cache_utils.py:1324] Maximum concurrency for 262,144 tokens "
        "per request: 1.53x\n",
        {
            "exit": 0,
            "kind": None,
            "values": {"concurrency": 1.53, "whole": 401_080},
            "kinds": {"kv_size_disagrees"},
            "advice": "Plan on 1.53 requests of 262,144 tokens",
            "not_advice": ("37,392 / P99",),
        },
    ),
    Case(
        "v1-healthy",
        "vllm/v1/core/kv_cache_utils.py, vllm/v1/worker/gpu_worker.py (vLLM 0.32 wording)",
        "(Worker pid=1) INFO 11-22 10:00:00 [gpu_model_runner.py:5150] Model loading took 15.27 GiB memory and "
        "5.1 seconds\n"
        "(Worker pid=1) INFO 11-22 10:00:09 [gpu_worker.py:760] Available KV cache memory: 10.85 GiB\n"
        "(EngineCore pid=1) INFO 11-22 10:00:09 [kv_cache_utils.py:2327] GPU KV cache size: 79,040 tokens, "
        "Maximum concurrency for 4,096 tokens per request: 19.30x\n",
        {"exit": 0, "kind": None, "values": {"tokens": 79_040, "concurrency": 19.3}, "advice": "79,040 / P99"},
    ),
    Case(
        "hybrid-healthy-newer-vllm",
        "vllm/v1/core/kv_cache_utils.py (get_kv_cache_capacity: int(concurrency × max_model_len))",
        "(EngineCore_DP0 pid=404) INFO 05-19 02:17:43 [kv_cache_utils.py:1710] GPU KV cache size: 1,234,698 tokens\n"
        "(EngineCore_DP0 pid=404) INFO 05-19 02:17:43 [kv_cache_utils.py:1711] Maximum concurrency for 131,072 "
        "tokens per request: 9.42x\n",
        {"exit": 0, "kind": None, "values": {"tokens": 1_234_698}, "advice": "1,234,698 / P99"},
    ),
    Case(
        "v0-healthy-blocks",
        "vllm/executor/executor_base.py (V0 initialize_cache)",
        "INFO 06-10 12:00:00 executor_base.py:110] # cuda blocks: 2048, # CPU blocks: 512\n"
        "INFO 06-10 12:00:00 executor_base.py:115] Maximum concurrency for 4096 tokens per request: 8.00x\n",
        {"exit": 0, "kind": None, "values": {"num_blocks": 2048, "concurrency": 8.0}},
    ),
    Case(
        "v0-max-len-over-kv-tokens",
        "vllm/worker/worker.py (V0 raise_if_cache_size_invalid); vllm/entrypoints/openai/api_server.py",
        "INFO 06-10 12:00:00 [executor_base.py:110] # cuda blocks: 1706, # CPU blocks: 2048\n"
        "ERROR 06-10 12:00:01 [engine.py:400] The model's max seq len (32768) is larger than the maximum number "
        "of tokens that can be stored in KV cache (27296). Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.\n"
        "ValueError: The model's max seq len (32768) is larger than the maximum number of tokens that can be "
        "stored in KV cache (27296). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.\n"
        "RuntimeError: Engine process failed to start. See stack trace for the root cause.\n",
        {
            "exit": 1,
            "kind": "max_len_over_kv_tokens",
            "line": 2,
            "values": {"max_model_len": 32768, "kv_tokens": 27296},
            "advice": "Lower --max-model-len to 27,296",
        },
    ),
    Case(
        "v1-max-len-too-long-docker-timestamps",
        "vllm/v1/core/kv_cache_utils.py (_check_enough_kv_cache_memory)",
        "2025-08-20T18:04:10.123456789Z (EngineCore_DP0 pid=7) INFO 08-20 18:04:10 [gpu_worker.py:276] "
        "Available KV cache memory: 4.50 GiB\n"
        "2025-08-20T18:04:10.223456789Z (EngineCore_DP0 pid=7) ERROR 08-20 18:04:10 [core.py:700] ValueError: To "
        "serve at least one request with the models's max seq len (40960), (5.62 GiB KV cache is needed, which is "
        "larger than the available KV cache memory (4.50 GiB). Based on the available memory, the estimated "
        "maximum model length is 32752. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
        "when initializing the engine.\n",
        {
            "exit": 1,
            "kind": "max_len_too_long",
            "line": 2,
            "values": {"max_model_len": 40960, "needed_gib": 5.62, "estimated_max_len": 32752},
            "advice": "Lower --max-model-len to 32,752",
        },
    ),
    Case(
        "max-len-over-model-limit",
        "vllm/config/model.py (derived max_model_len check, VLLM_ALLOW_LONG_MAX_MODEL_LEN)",
        "(APIServer pid=53) INFO 05-01 10:00:00 [api_server.py:1000] vLLM API server version 0.11.0\n"
        "(APIServer pid=53) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "(APIServer pid=53)   Value error, User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=32768.0 or model_max_length=None in model's config.json). To allow "
        "overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1. [type=value_error]\n",
        {
            "exit": 1,
            "kind": "max_len_over_model",
            "line": 3,
            "values": {"max_model_len": 65536, "derived_max_len": 32768},
            "advice": "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
        },
    ),
    Case(
        "oom-loading-weights-kubectl-timestamps",
        "torch CUDACachingAllocator message, raised in vllm/v1/worker/gpu_model_runner.py (load_model)",
        "2025-08-20T18:00:01.000000000Z (EngineCore_DP0 pid=11) INFO 08-20 18:00:01 [gpu_model_runner.py:1800] "
        "Starting to load model meta-llama/Llama-3.1-70B-Instruct...\n"
        "2025-08-20T18:00:09.000000000Z (EngineCore_DP0 pid=11) Loading safetensors checkpoint shards:  40% "
        "Completed | 12/30 [00:08<00:12]\n"
        "2025-08-20T18:00:10.000000000Z (EngineCore_DP0 pid=11) ERROR 08-20 18:00:10 [core.py:700] "
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 896.00 MiB. GPU 0 has a total capacity of "
        "79.15 GiB of which 605.88 MiB is free. Process 12 has 78.54 GiB memory in use.\n",
        {
            "exit": 1,
            "kind": "cuda_oom",
            "line": 3,
            "values": {"tried_gib": 0.875, "gpu_total_gib": 79.15, "phase": "loading the weights"},
            "advice": "--tensor-parallel-size 2",
        },
    ),
    Case(
        "oom-profiling-ansi-colours-old-torch-wording",
        "torch < 2.3 OOM wording, raised in vllm/v1/worker/gpu_model_runner.py (profile_run)",
        "\x1b[1;36m(EngineCore_DP0 pid=21)\x1b[0;0m INFO 08-20 18:00:30 [gpu_model_runner.py:1892] Model loading "
        "took 14.99 GiB and 4.1 seconds\n"
        "\x1b[1;36m(EngineCore_DP0 pid=21)\x1b[0;0m ERROR 08-20 18:00:41 [core.py:700]   "
        + _TRACE.format("v1/worker/gpu_model_runner.py", 2500, "profile_run")
        + "\n"
        "\x1b[1;36m(EngineCore_DP0 pid=21)\x1b[0;0m ERROR 08-20 18:00:41 [core.py:700] torch.cuda.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 23.65 GiB total capacity; 22.67 GiB already "
        "allocated; 10.56 MiB free; 22.90 GiB reserved in total by PyTorch)\n",
        {
            "exit": 1,
            "kind": "cuda_oom",
            "line": 3,
            "values": {"tried_gib": 0.0195, "gpu_free_gib": 0.0103, "phase": "the profiling run"},
            "advice": "lower --max-num-batched-tokens",
        },
    ),
    Case(
        "oom-torch-compile",
        "torch CUDA error, raised under vllm/compilation/backends.py (inductor)",
        "(EngineCore_DP0 pid=5) INFO 05-07 02:13:56 [backends.py:420] Using cache directory: "
        "/root/.cache/vllm/torch_compile_cache/3069c682cd/rank_0_0 for vLLM's torch.compile\n"
        "(EngineCore_DP0 pid=5) INFO 05-07 02:13:56 [backends.py:430] Dynamo bytecode transform time: 3.58 s\n"
        '(EngineCore_DP0 pid=5) ERROR 05-07 02:14:09 [core.py:700]   File "/usr/local/lib/python3.12/dist-packages/'
        'torch/_inductor/compile_fx.py", line 1700, in compile_fx\n'
        "(EngineCore_DP0 pid=5) ERROR 05-07 02:14:09 [core.py:700] RuntimeError: CUDA error: out of memory\n",
        {"exit": 1, "kind": "cuda_oom", "line": 4, "values": {"phase": "torch.compile"}, "advice": "--enforce-eager"},
    ),
    Case(
        "oom-capturing-cuda-graphs",
        "vllm/v1/worker/gpu_model_runner.py (capture_model progress bar), torch OOM",
        "(VllmWorker rank=0 pid=9) INFO 08-20 18:01:00 [gpu_worker.py:276] Available KV cache memory: 60.12 GiB\n"
        "(VllmWorker rank=0 pid=9) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  45%|████▌     | "
        "30/67 [00:05<00:06,  5.9it/s]\n"
        "(VllmWorker rank=0 pid=9) ERROR 08-20 18:01:06 [multiproc_executor.py:671] torch.OutOfMemoryError: CUDA out "
        "of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 79.15 GiB of which 1.06 MiB is "
        "free.\n"
        "(EngineCore_DP0 pid=8) ERROR 08-20 18:01:07 [multiproc_executor.py:231] Worker proc VllmWorker-0 died "
        "unexpectedly, shutting down executor.\n",
        {
            "exit": 1,
            "kind": "cuda_oom",
            "line": 3,
            "values": {"phase": "capturing CUDA graphs", "available_kv_gib": 60.12},
            "advice": "cudagraph_capture_sizes",
            "kinds": {"worker_died"},
        },
    ),
    Case(
        "ray-worker-nccl-error",
        "vllm/distributed/device_communicators/pynccl_wrapper.py, torch.distributed",
        "(RayWorkerWrapper pid=5678, ip=172.17.0.2) ERROR 09-01 10:00:00 [worker_base.py:620] "
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.21.5\n"
        "(EngineCore_DP0 pid=5600) ERROR 09-01 10:00:01 [core.py:700] EngineCore failed to start.\n",
        {
            "exit": 1,
            "kind": "nccl_error",
            "line": 1,
            "values": {"nccl_reason": "unhandled system error"},
            "advice": "NCCL_DEBUG=INFO",
        },
    ),
    Case(
        "worker-died-without-a-cause",
        "vllm/v1/executor/multiproc_executor.py (worker monitor); vllm/v1/engine/utils.py",
        "(Worker_TP0 pid=7068) INFO 01-24 19:13:03 [gpu_worker.py:358] Available KV cache memory: 9.05 GiB\n"
        "(EngineCore_DP0 pid=265) ERROR 02-27 10:31:24 [multiproc_executor.py:231] Worker proc VllmWorker-1 died "
        "unexpectedly, shutting down executor.\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above. Failed core "
        "proc(s): {'EngineCore_DP0': 1}\n",
        {
            "exit": 1,
            "kind": "worker_died",
            "line": 2,
            "values": {"worker": "VllmWorker-1", "failed_procs": "{'EngineCore_DP0': 1}"},
            "advice": "OOM killer",
        },
    ),
    Case(
        "engine-failed-unknown-cause-names-last-exception",
        "vllm/v1/engine/core.py (EngineCore failed to start); vllm/v1/executor/multiproc_executor.py",
        "(EngineCore_DP0 pid=18235) ERROR 12-04 11:46:32 [core.py:843] EngineCore failed to start.\n"
        "(EngineCore_DP0 pid=18235) ERROR 12-04 11:46:32 [core.py:843] ImportError: libcudart.so.13: cannot open "
        "shared object file\n"
        "(EngineCore_DP0 pid=18235) ERROR 12-04 11:46:32 [core.py:843] Exception: WorkerProc initialization failed "
        "due to an exception in a background process. See stack trace for root cause.\n",
        {"exit": 1, "kind": "engine_failed", "line": 1, "failure": "ImportError: libcudart.so.13"},
    ),
    Case(
        "v1-no-cache-memory",
        "vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory); vllm-project/vllm#27508",
        '(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708]     raise ValueError("No available memory '
        'for the cache blocks. "\n'
        "(EngineCore_DP0 pid=223840) ERROR 10-25 13:08:43 [core.py:708] ValueError: No available memory for the "
        "cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine.\n",
        {"exit": 1, "kind": "no_cache_memory", "line": 2, "advice": "raise --gpu-memory-utilization"},
    ),
    Case(
        "device-memory-held-nested-prefixes",
        "vllm/v1/worker/gpu_worker.py (init_device: free memory below the requested utilization)",
        "(APIServer pid=10) (DPEngineCoreActor pid=11) ERROR 12-23 23:04:22 [core.py:1525] ValueError: Free memory "
        "on device cuda:0 (10.5/79.19 GiB) on startup is less than desired GPU memory utilization (0.9, 71.27 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes.\n",
        {
            "exit": 1,
            "kind": "device_memory",
            "line": 1,
            "values": {"free_gib": 10.5, "total_gib": 79.19},
            "advice": "below 0.13",
        },
    ),
]


def _run(log: Path) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["capacity", "--vllm-log", str(log), "--json"])
    return code, json.loads(out.getvalue())


def check(case: Case, tmp_path: Path) -> None:
    """Run the real command on the log; its exit code, named failure, values and advice are the expected."""
    log = tmp_path / "server.log"
    log.write_text(case.given, encoding="utf-8")
    code, result = _run(log)
    want = case.expect
    assert code == want["exit"]
    assert next(iter(result)) == "failure"  # the failure is named first, in one line
    assert result["failure_kind"] == want["kind"]
    assert (result["failure"] is None) == (want["kind"] is None)
    findings = result["findings"]
    if want["kind"] is not None:
        [named] = [f for f in findings if f["kind"] == want["kind"] and f["role"]][:1]
        assert named["line_no"] == want["line"]
        assert named["text"] in case.given.splitlines()[want["line"] - 1]
        assert f"(line {want['line']})" in result["failure"]
    values: dict[str, Any] = {}
    for finding in reversed(findings):  # the earliest finding's value wins
        values.update(finding["values"])
    for key, value in want.get("values", {}).items():
        assert values.get(key) == (pytest.approx(value, abs=1e-3) if isinstance(value, float) else value), key
    assert want.get("kinds", set()) <= {f["kind"] for f in findings}
    advice = " ".join(result["advice"])
    assert want.get("advice", "") in advice
    assert not any(fragment in advice for fragment in want.get("not_advice", ()))
    assert want.get("failure", "") in (result["failure"] or "")
