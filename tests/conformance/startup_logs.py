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
            "advice": "to 0.13 or less",
        },
    ),
    Case(
        "v0-bfloat16-on-volta",
        "vllm/worker/worker.py (V0 _check_if_gpu_supports_dtype); vllm-project/vllm#946, transformerlab-app#370",
        "INFO 04-16 12:12:41 llm_engine.py:174] Initializing an LLM engine (v0.5.4) with config: "
        "model='deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B', tokenizer_mode=auto, dtype=torch.bfloat16, "
        "max_seq_len=131072, load_format=LoadFormat.AUTO, tensor_parallel_size=1, pipeline_parallel_size=1, "
        "quantization=None, enforce_eager=False, kv_cache_dtype=auto, device_config=cuda, seed=0\n"
        "Traceback (most recent call last):\n"
        "  " + _TRACE.format("worker/worker.py", 358, "_check_if_gpu_supports_dtype") + "\n"
        "    raise ValueError(\n"
        "ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla "
        "V100-SXM2-32GB GPU has compute capability 7.0. You can use float16 instead by explicitly setting the`dtype` "
        "flag in CLI, for example: --dtype=half.\n",
        {
            "exit": 1,
            "kind": "dtype_unsupported",
            "line": 5,
            "values": {"gpu_name": "Tesla V100-SXM2-32GB", "capability": 7.0, "min_capability": 8.0},
            "advice": "--dtype half",
        },
    ),
    Case(
        "awq-on-volta-quantization-capability",
        "vllm/model_executor/model_loader/utils.py (_get_quantization_config); vllm-project/vllm#4202",
        "(APIServer pid=1) INFO 06-27 18:00:45 [api_server.py:1000] vLLM API server version 0.8.5.post1\n"
        "(APIServer pid=1) ERROR 06-27 18:00:52 [core.py:396] ValueError: The quantization method awq is not "
        "supported for the current GPU. Minimum capability: 75. Current capability: 70.\n"
        "(APIServer pid=1) RuntimeError: Engine core initialization failed. See root cause above.\n",
        {
            "exit": 1,
            "kind": "dtype_unsupported",
            "line": 2,
            "values": {"quantization": "awq", "min_capability": 75, "capability": 70},
            "advice": "need 7.5+",
            "kinds": {"engine_failed"},
        },
    ),
    Case(
        "v0-tp-does-not-divide-heads",
        "vllm/config.py (ModelConfig.verify_with_parallel_config); vllm-project/vllm#2652",
        "INFO 01-29 10:00:00 llm_engine.py:70] Initializing an LLM engine with config: "
        "model='cognitivecomputations/WizardLM-33B-V1.0-Uncensored', dtype=torch.float16, max_seq_len=2048, "
        "tensor_parallel_size=8, quantization=None, enforce_eager=False, kv_cache_dtype=auto, seed=0\n"
        "  " + _TRACE.format("config.py", 218, "verify_with_parallel_config") + "\n"
        "    raise ValueError(\n"
        "ValueError: Total number of attention heads (52) must be divisible by tensor parallel size (8).\n",
        {
            "exit": 1,
            "kind": "parallel_size",
            "line": 4,
            "values": {"num_heads": 52, "parallel_size": 8},
            "advice": "--tensor-parallel-size 4 --pipeline-parallel-size 2",
        },
    ),
    Case(
        "tp3-heads-args-namespace",
        "vllm/config.py (verify_with_parallel_config), api_server `args: Namespace(...)`; gpustack/gpustack#2259",
        "INFO 06-19 11:30:25 [api_server.py:1043] vLLM API server version 0.8.5.post1\n"
        "INFO 06-19 11:30:25 [api_server.py:1044] args: Namespace(subparser='serve', "
        "model_tag='/models/gemma-3-27b-it', host='0.0.0.0', port=40059, max_model_len=8192, block_size=None, "
        "gpu_memory_utilization=0.9, "
        "max_num_seqs=None, tensor_parallel_size=3, pipeline_parallel_size=1, kv_cache_dtype='auto')\n"
        "ValueError: Total number of attention heads (32) must be divisible by tensor parallel size (3).\n",
        {
            "exit": 1,
            "kind": "parallel_size",
            "line": 3,
            "values": {"num_heads": 32, "parallel_size": 3},
            "advice": "--tensor-parallel-size 1 --pipeline-parallel-size 3",
        },
    ),
    Case(
        "v0-batched-tokens-below-max-len-ray-prefix",
        "vllm/config.py (V0 SchedulerConfig._verify_args); verl-project/verl#259",
        "\x1b[36m(main_task pid=3523385)\x1b[0m ValueError: max_num_batched_tokens (8192) is smaller than "
        "max_model_len (9216). This effectively limits the maximum sequence length to max_num_batched_tokens and "
        "makes vLLM reject longer sequences. Please increase max_num_batched_tokens or decrease max_model_len.\n",
        {
            "exit": 1,
            "kind": "batched_tokens_below_len",
            "line": 1,
            "values": {"max_num_batched_tokens": 8192, "max_model_len": 9216},
            "advice": "Raise --max-num-batched-tokens to at least 9,216",
        },
    ),
    Case(
        "batched-tokens-below-max-len-pydantic",
        "vllm/config/scheduler.py (verify_max_model_len, SchedulerConfig validation); verl-project/verl#7632",
        "(APIServer pid=1) INFO 08-31 10:00:00 [utils.py:253] non-default args: {'max_model_len': 128000, "
        "'max_num_batched_tokens': 8192, 'enable_chunked_prefill': False}\n"
        "pydantic_core._pydantic_core.ValidationError: 1 validation error for SchedulerConfig\n"
        "  Value error, max_num_batched_tokens (8192) is smaller than max_model_len (128000). This effectively "
        "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. "
        "Please increase max_num_batched_tokens or decrease max_model_len. [type=value_error]\n",
        {
            "exit": 1,
            "kind": "batched_tokens_below_len",
            "line": 3,
            "values": {"max_model_len": 128000},
            "advice": "lower --max-model-len to 8,192",
        },
    ),
    Case(
        "device-memory-no-device-name-v0-9",
        "vllm/v1/worker/gpu_worker.py (init_device, vLLM 0.9.1 wording); vllm-project/vllm#20305",
        "INFO 07-01 09:00:00 [core.py:69] Initializing a V1 LLM engine (v0.9.1) with config: model='Qwen/Qwen3-8B', "
        "dtype=torch.bfloat16, max_seq_len=40960, tensor_parallel_size=1, kv_cache_dtype=auto, device_config=cuda\n"
        "ERROR 07-01 09:00:03 [core.py:515] EngineCore failed to start.\n"
        "ERROR 07-01 09:00:03 [core.py:515] ValueError: Free memory on device (19.77/22.05 GiB) on startup is less "
        "than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization or reduce GPU memory "
        "used by other processes.\n",
        {
            "exit": 1,
            "kind": "device_memory",
            "line": 3,
            "values": {"free_gib": 19.77, "total_gib": 22.05, "requested_gib": 19.84},
            "advice": "to 0.89 or less",
        },
    ),
    Case(
        "device-memory-ray-worker-bracketed-ci-timestamps",
        "vllm/v1/worker/gpu_worker.py via vllm/v1/executor/ray_utils.py (RayWorkerWrapper); pytorch/pytorch#175666",
        "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) ray.exceptions.RayTaskError(ValueError): "
        "ray::RayWorkerWrapper.execute_method() (pid=7106, ip=192.168.10.10, actor_id=ad5a2b63, "
        "repr=<vllm.v1.executor.ray_utils.RayWorkerWrapper object at 0x7f9440a4fc80>)\n"
        "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940)   "
        + _TRACE.format("v1/worker/worker_base.py", 341, "execute_method")
        + "\n"
        "[2026-02-24T20:21:58Z] (EngineCore_DP0 pid=6940) ValueError: Free memory on device cuda:0 (19.77/22.05 GiB) "
        "on startup is less than desired GPU memory utilization (0.9, 19.84 GiB). Decrease GPU memory utilization "
        "or reduce GPU memory used by other processes.\n"
        "[2026-02-24T20:21:59Z] (APIServer pid=6800) RuntimeError: Engine core initialization failed. See root cause "
        "above. Failed core proc(s): {}\n",
        {"exit": 1, "kind": "device_memory", "line": 3, "values": {"utilization": 0.9}, "advice": "to 0.89 or less"},
    ),
    Case(
        "v0-oom-profiling-after-weights-loaded",
        "vllm/worker/model_runner.py (V0 'Loading model weights took N GB', in GiB), torch OOM in profile_run",
        "INFO 07-23 10:00:00 model_runner.py:160] Loading model weights took 14.9888 GB\n"
        "ERROR 07-23 10:00:09 worker_base.py:464] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
        "1.95 GiB. GPU 0 has a total capacity of 23.65 GiB of which 1.20 GiB is free. Including non-PyTorch "
        "memory, this process has 22.44 GiB memory in use.\n",
        {
            "exit": 1,
            "kind": "cuda_oom",
            "line": 2,
            "values": {"weights_gib": 14.9888, "phase": "the profiling run"},
            "advice": "lower --max-num-batched-tokens",
            "not_advice": ("The weights alone do not fit",),
        },
    ),
    Case(
        "v0-model-larger-than-gpus-tp2",
        "torch OOM raised under vllm/model_executor/model_loader/loader.py (V0 load_model), engine config line",
        "INFO 10-17 08:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.3) with config: "
        "model='meta-llama/Llama-3.1-70B-Instruct', dtype=torch.bfloat16, max_seq_len=8192, tensor_parallel_size=2, "
        "pipeline_parallel_size=1, kv_cache_dtype=auto, device_config=cuda\n"
        "(VllmWorkerProcess pid=412) INFO 10-17 08:00:20 model_runner.py:1056] Starting to load model "
        "meta-llama/Llama-3.1-70B-Instruct...\n"
        "(VllmWorkerProcess pid=412) ERROR 10-17 08:01:40 multiproc_worker_utils.py:233]   "
        + _TRACE.format("model_executor/model_loader/loader.py", 403, "load_model")
        + "\n"
        "(VllmWorkerProcess pid=412) ERROR 10-17 08:01:40 multiproc_worker_utils.py:233] torch.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 1.75 GiB. GPU 1 has a total capacity of 44.35 GiB of which 1.12 GiB "
        "is free. Process 412 has 43.22 GiB memory in use.\n",
        {
            "exit": 1,
            "kind": "cuda_oom",
            "line": 4,
            "values": {"phase": "loading the weights", "gpu": 1, "gpu_total_gib": 44.35},
            "advice": "--tensor-parallel-size 4",
        },
    ),
    Case(
        "v1-max-len-too-long-qwen3-vl-262144",
        "vllm/v1/core/kv_cache_utils.py (check_enough_kv_cache_memory), a Qwen3-VL-30B deployment note",
        "(EngineCore_DP0 pid=268) INFO 10-21 00:34:58 [gpu_worker.py:298] Available KV cache memory: 8.04 GiB\n"
        "(EngineCore_DP0 pid=268) ERROR 10-21 00:35:03 [core.py:708] ValueError: To serve at least one request with "
        "the models's max seq len (262144), (24.00 GiB KV cache is needed, which is larger than the available KV "
        "cache memory (8.04 GiB). Based on the available memory, the estimated maximum model length is 87840. Try "
        "increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n",
        {
            "exit": 1,
            "kind": "max_len_too_long",
            "line": 2,
            "values": {"max_model_len": 262144, "needed_gib": 24.0, "estimated_max_len": 87840},
            "advice": "Lower --max-model-len to 87,840",
        },
    ),
    Case(
        "ray-raylet-worker-died-then-engine-failed",
        "ray raylet message under vllm/v1/executor/ray_executor.py; vllm-project/vllm#38529, #13535",
        "(EngineCore pid=1879) (raylet) A worker died or was killed while executing a task by an unexpected system "
        "error. To troubleshoot the problem, check the logs for the dead worker. Worker IP address: 192.168.13.226 "
        "Worker port: 10002 Worker PID: 442 Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly "
        "exits with a connection error code 2. End of file. Some common causes include: (1) the process was killed "
        "by the OOM killer due to high memory usage, (2) ray stop --force was called, or (3) the worker crashed "
        "unexpectedly due to SIGSEGV or another unexpected error.\n"
        "(EngineCore pid=1879) ERROR 03-29 12:59:53 [core.py:1099] EngineCore failed to start.\n"
        "(EngineCore pid=1879) ERROR 03-29 12:59:53 [core.py:1099] Traceback (most recent call last):\n",
        {
            "exit": 1,
            "kind": "worker_died",
            "line": 1,
            "values": {"pid": 442, "exit_type": "SYSTEM_ERROR"},
            "advice": "OOM killer",
            "kinds": {"engine_failed"},
        },
    ),
    Case(
        "v0-rank-prefixed-nccl-unhandled-cuda-error",
        "vllm/distributed/device_communicators/pynccl_wrapper.py (NCCL_CHECK), torch `[rank0]:`; vllm#6732",
        "(VllmWorkerProcess pid=759) ERROR 07-24 08:26:01 multiproc_worker_utils.py:226]   "
        + _TRACE.format("worker/worker.py", 132, "init_device")
        + "\n"
        "[rank0]: Traceback (most recent call last):\n"
        "[rank0]: RuntimeError: NCCL error: unhandled cuda error (run with NCCL_DEBUG=INFO for details)\n",
        {
            "exit": 1,
            "kind": "nccl_error",
            "line": 3,
            "values": {"nccl_reason": "unhandled cuda error"},
            "advice": "NCCL_P2P_DISABLE=1",
            "not_advice": ("check all 1 GPUs",),  # the log does not say how many
        },
    ),
    Case(
        "nccl-system-error-code-only",
        "torch.distributed ProcessGroupNCCL (ncclSystemError), raised in a vLLM worker's init_device",
        "(VllmWorker rank=1 pid=97) ERROR 05-02 11:00:04 [multiproc_executor.py:546] torch.distributed."
        "DistBackendError: ncclSystemError: System call (e.g. socket, malloc) or external library call failed or "
        "device error.\n"
        "(EngineCore_0 pid=90) ERROR 05-02 11:00:05 [core.py:700] EngineCore failed to start.\n",
        {"exit": 1, "kind": "nccl_error", "line": 1, "values": {"nccl_code": "ncclSystemError"}},
    ),
    Case(
        "nccl-warn-peer-access-not-supported",
        "NCCL's `NCCL WARN Cuda failure '...'` under vLLM's tensor-parallel init; vllm-project/vllm#406",
        "INFO 07-08 23:11:35 llm_engine.py:60] Initializing an LLM engine with config: "
        "model='openlm-research/open_llama_13b', dtype=torch.float16, tensor_parallel_size=4, seed=0)\n"
        "(Worker pid=4225) ip-172-31-68-176:4225:4225 [0] transport/p2p.cc:191 NCCL WARN Cuda failure 'peer access "
        "is not supported between these two devices'\n",
        {
            "exit": 1,
            "kind": "nccl_error",
            "line": 2,
            "values": {"nccl_cuda": "peer access is not supported between these two devices"},
            "advice": "check all 4 GPUs are visible",
        },
    ),
    Case(
        "no-kernel-image-for-this-gpu",
        "torch CUDA error (cudaErrorNoKernelImageForDevice) in a vLLM worker; a V100 deployment note (cu130 torch)",
        "(EngineCore_DP0 pid=61) INFO 06-27 17:10:02 [gpu_model_runner.py:1800] Starting to load model "
        "Qwen/Qwen2.5-7B-Instruct...\n"
        "(EngineCore_DP0 pid=61) ERROR 06-27 17:10:05 [core.py:700] [rank0]: torch.AcceleratorError: CUDA error: no "
        "kernel image is available for execution on the device\n",
        {"exit": 1, "kind": "no_kernel_image", "line": 2, "advice": "TORCH_CUDA_ARCH_LIST"},
    ),
    Case(
        "gemma3-refuses-float16-pydantic",
        "vllm/config/model.py (_check_valid_dtype); Gemma-3 deployment notes (`--dtype float16` rejected)",
        "(APIServer pid=1) INFO 08-24 09:00:00 [utils.py:253] non-default args: {'model': 'google/gemma-3-4b-it', "
        "'dtype': 'float16', 'max_model_len': 32768}\n"
        "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
        "(APIServer pid=1)   Value error, The model type 'gemma3' does not support float16. Reason: Numerical "
        "instability. Please use bfloat16 or float32 instead. [type=value_error, input_value=ArgsKwargs((), "
        "{'model': 'google/gemma-3-4b-it'}), input_type=ArgsKwargs]\n",
        {
            "exit": 1,
            "kind": "dtype_unsupported",
            "line": 3,
            "values": {"model_type": "gemma3"},
            "advice": "--dtype bfloat16",
            "not_advice": ("Add --dtype half",),
        },
    ),
    Case(
        "max-len-over-model-none-key-runpod-wording",
        "vllm/config.py (_get_and_verify_max_len, a config without max_position_embeddings), worker-vllm README",
        "INFO 05-01 10:00:00 [api_server.py:1000] vLLM API server version 0.6.3\n"
        "ValueError: User-specified max_model_len (25000) is greater than the derived max_model_len (None=4096 in "
        "model's config.json). This may lead to incorrect model outputs or CUDA errors. Make sure the value is "
        "correct and within the model context size.\n",
        {
            "exit": 1,
            "kind": "max_len_over_model",
            "line": 2,
            "values": {"max_model_len": 25000, "derived_max_len": 4096},
            "advice": "Lower --max-model-len to 4,096",
            "failure": "4,096 (config.json)",
        },
    ),
    Case(
        "max-len-capped-by-disabled-sliding-window",
        "vllm/config.py (_get_and_verify_max_len with disable_sliding_window); vllm-project/vllm#6253",
        "INFO 07-09 10:00:00 api_server.py:206] vLLM API server version 0.5.1\n"
        "INFO 07-09 10:00:00 api_server.py:207] args: Namespace(host=None, port=8000, model='Vigostral-7B-Chat-AWQ', "
        "max_model_len=8192, quantization='awq', enable_prefix_caching=True, disable_sliding_window=True)\n"
        "ValueError: User-specified max_model_len (8192) is greater than the derived max_model_len "
        "(sliding_window=4096 or model_max_length=None in model's config.json). This may lead to incorrect model "
        "outputs or CUDA errors. Make sure the value is correct and within the model context size.\n",
        {
            "exit": 1,
            "kind": "max_len_over_model",
            "line": 3,
            "values": {"derived_max_len": 4096, "limit_key": "sliding_window"},
            "advice": "drop --disable-sliding-window",
            "not_advice": ("set VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",),
        },
    ),
    Case(
        "journalctl-negative-kv-then-no-cache-memory",
        "vllm/v1/worker/gpu_worker.py, vllm/v1/core/kv_cache_utils.py, as `journalctl -u vllm` prints them",
        "Nov 29 09:00:01 gpu-node-3 vllm[2211]: (EngineCore_DP0 pid=2290) INFO 11-29 09:00:01 [gpu_worker.py:298] "
        "Available KV cache memory: -0.62 GiB\n"
        "Nov 29 09:00:01 gpu-node-3 vllm[2211]: (EngineCore_DP0 pid=2290) ERROR 11-29 09:00:01 [core.py:708] "
        "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
        "initializing the engine.\n",
        {"exit": 1, "kind": "no_kv_memory", "line": 1, "values": {"available_kv_gib": -0.62}},
    ),
    Case(
        "journalctl-engine-failed-names-unknown-exception",
        "vllm/v1/engine/core.py (EngineCore failed to start), as `journalctl -u vllm` prints it",
        "Nov 29 09:10:11 gpu-node-3 vllm[3011]: (EngineCore_DP0 pid=3090) ERROR 11-29 09:10:11 [core.py:708] "
        "EngineCore failed to start.\n"
        "Nov 29 09:10:11 gpu-node-3 vllm[3011]: (EngineCore_DP0 pid=3090) ERROR 11-29 09:10:11 [core.py:708] "
        "ModuleNotFoundError: No module named 'vllm._C'\n",
        {"exit": 1, "kind": "engine_failed", "line": 1, "failure": "No module named 'vllm._C'"},
    ),
    Case(
        "kubectl-prefix-max-len-over-kv-tokens",
        "vllm/v1/core/kv_cache_utils.py (older wording), as `kubectl logs --prefix` prints it",
        "[pod/vllm-6c9f7b-x2x4k/vllm] (EngineCore_DP0 pid=300) ERROR 03-02 10:00:00 [core.py:390] ValueError: The "
        "model's max seq len (131072) is larger than the maximum number of tokens that can be stored in KV cache "
        "(54832). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.\n"
        "[pod/vllm-6c9f7b-x2x4k/vllm] (APIServer pid=1) RuntimeError: Engine core initialization failed. See root "
        "cause above. Failed core proc(s): {}\n",
        {
            "exit": 1,
            "kind": "max_len_over_kv_tokens",
            "line": 1,
            "values": {"kv_tokens": 54832},
            "advice": "Lower --max-model-len to 54,832",
        },
    ),
    Case(
        "k8s-world-size-above-visible-gpus-pydantic",
        "vllm/config/parallel.py (ParallelConfig world size check), a Kubernetes TP=2 pod with one GPU",
        "(APIServer pid=1) INFO 09-14 02:00:00 [utils.py:253] non-default args: {'model': 'Qwen/Qwen3-8B', "
        "'tensor_parallel_size': 2}\n"
        "(APIServer pid=1) pydantic_core._pydantic_core.ValidationError:\n"
        "  1 validation error for ParallelConfig\n"
        "  Value error, World size (2) is larger than the number of available GPUs (1) in this\n"
        "  node. If this is intentional and you are using:\n"
        "  - ray, set '--distributed-executor-backend ray'.\n",
        {
            "exit": 1,
            "kind": "too_few_gpus",
            "line": 4,
            "values": {"world_size": 2, "gpus": 1},
            "advice": "lower --tensor-parallel-size to 1 (a size",
        },
    ),
    Case(
        "ray-placement-group-too-few-gpus",
        "vllm/executor/ray_utils.py (initialize_ray_cluster); vllm-project/vllm#3416, a docker TP=2 launch",
        "INFO 10-02 08:00:00 llm_engine.py:237] Initializing an LLM engine (v0.6.2) with config: "
        "model='meta-llama/Llama-3.2-11B-Vision-Instruct', dtype=torch.float16, max_seq_len=30000, "
        "tensor_parallel_size=2, pipeline_parallel_size=1, device_config=cuda\n"
        "ValueError: The number of required GPUs exceeds the total number of available GPUs in the placement group.\n",
        {
            "exit": 1,
            "kind": "too_few_gpus",
            "line": 2,
            "values": {"ray_pool": "placement group"},
            "advice": "needs 2 GPUs",
        },
    ),
    Case(
        "v0-profiling-results-max-len-over-kv-tokens",
        "vllm/worker/worker.py (V0 determine_num_available_blocks, raise_if_cache_size_invalid); vllm#10517",
        "INFO 12-02 10:00:00 model_runner.py:1072] Loading model weights took 14.9888 GB\n"
        "INFO 12-02 10:00:04 worker.py:232] Memory profiling results: total_gpu_memory=23.58GiB "
        "initial_memory_usage=15.34GiB peak_torch_memory=17.98GiB memory_usage_post_profile=15.35GiB "
        "non_torch_memory=0.35GiB kv_cache_size=2.89GiB gpu_memory_utilization=0.90\n"
        "INFO 12-02 10:00:04 gpu_executor.py:113] # GPU blocks: 1478, # CPU blocks: 2048\n"
        "INFO 12-02 10:00:04 gpu_executor.py:117] Maximum concurrency for 29000 tokens per request: 0.82x\n"
        "ERROR 12-02 10:00:04 engine.py:366] The model's max seq len (29000) is larger than the maximum number of "
        "tokens that can be stored in KV cache (23648). Try increasing `gpu_memory_utilization` or decreasing "
        "`max_model_len` when initializing the engine.\n",
        {
            "exit": 1,
            "kind": "max_len_over_kv_tokens",
            "line": 5,
            "values": {"num_blocks": 1478, "weights_gib": 14.9888, "kv_tokens": 23648, "available_kv_gib": 2.89},
            "advice": "Lower --max-model-len to 23,648",
        },
    ),
    Case(
        "hybrid-qwen3-5-quoted-without-dates",
        "vllm/v1/core/kv_cache_utils.py (num_blocks // len(groups) token figure); vllm-project/vllm#40691",
        "INFO [kv_cache_utils.py:1319] GPU KV cache size: 290,864 tokens\n"
        "INFO [kv_cache_utils.py:1324] Maximum concurrency for 32,768 tokens per request: 33.04x\n",
        {
            "exit": 0,
            "kind": None,
            "values": {"concurrency": 33.04, "tokens": 290_864},
            "kinds": {"kv_size_disagrees"},
            "advice": "Plan on 33.04 requests of 32,768 tokens",
            "not_advice": ("290,864 / P99",),
        },
    ),
    Case(
        "v0-profiling-results-negative-kv",
        "vllm/worker/worker.py (V0 'Memory profiling results', then 'No available memory for the cache blocks')",
        "INFO 11-25 08:20:00 model_runner.py:1077] Loading model weights took 15.5083 GB\n"
        "INFO 11-25 08:20:09 worker.py:232] Memory profiling results: total_gpu_memory=23.64GiB "
        "initial_memory_usage=15.79GiB peak_torch_memory=22.13GiB memory_usage_post_profile=15.86GiB "
        "non_torch_memory=0.33GiB kv_cache_size=-1.18GiB gpu_memory_utilization=0.90\n"
        "INFO 11-25 08:20:09 gpu_executor.py:113] # GPU blocks: 0, # CPU blocks: 4681\n"
        "ERROR 11-25 08:20:09 engine.py:366] No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine.\n",
        {
            "exit": 1,
            "kind": "no_kv_memory",
            "line": 2,
            "values": {"available_kv_gib": -1.18, "num_blocks": 0},
            "advice": "raise --gpu-memory-utilization",
            "kinds": {"no_cache_memory"},
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
