"""The startup-log explainer: vLLM's KV-cache lines and startup failures, what they mean, what to change.

Every line is first stripped of what wraps vLLM's message (ANSI colours; docker, kubectl or CI
timestamps; a compose service's `name |`; journalctl's `Nov 29 09:00:01 host vllm[7]:`; `kubectl logs
--prefix`'s `[pod/name/container]`; torch's `[rank0]:`; process prefixes such as `(EngineCore_DP0 pid=7)`,
`(VllmWorker rank=1 pid=9)` or `(RayWorkerWrapper pid=5, ip=10.0.0.2)`; the logger's
`LEVEL MM-DD HH:MM:SS [file.py:N]`), then matched against `_RULES`, one row per message vLLM (or
torch under it) prints. A row's `role` says whether the message is a fact, a cause of a failed start,
or a symptom (the engine or a worker gave up; the cause is elsewhere); rows are in order of
precedence, so the failure named first is the most specific cause found.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from llmload.capacity.kv import GIB, blocks_for
from llmload.errors import InputError, validation_message
from llmload.models import DEVICE_DEFAULTS, ServeConfig

LogKind = Literal[
    "kv_cache_size",
    "max_concurrency",
    "kv_size_disagrees",
    "available_kv_memory",
    "model_loading",
    "kv_memory_set",
    "kv_blocks",
    "max_model_len_used",
    "auto_fit",
    "max_len_over_model",
    "batched_tokens_below_len",
    "parallel_size",
    "too_few_gpus",
    "dtype_unsupported",
    "no_kernel_image",
    "no_kv_memory",
    "max_len_too_long",
    "max_len_over_kv_tokens",
    "no_cache_memory",
    "device_memory",
    "node_memory",
    "profiling_error",
    "sampler_oom",
    "cuda_oom",
    "nccl_error",
    "worker_died",
    "engine_failed",
]
Role = Literal["cause", "symptom"]
LogValue = int | float | str
Values = dict[str, LogValue]
SERVE_SETTINGS = frozenset(ServeConfig.model_fields) - {"not_modelled", "origins"}


class LogFinding(BaseModel):
    line_no: int
    kind: LogKind
    text: str = Field(description="the message, without timestamps, process and logger prefixes")
    origin: str | None = Field(default=None, description="the process prefix, e.g. 'VllmWorker rank=1 pid=9'")
    values: Values = Field(description="numbers as logged; sizes in GiB (MiB/KiB converted); 'phase' for an OOM")
    meaning: str
    role: Role | None = Field(default=None, description="cause: stops vLLM; symptom: vLLM stopped, cause elsewhere")
    vllm_source: str = Field(description="the source file that prints the message")
    advice: list[str] = Field(default_factory=list, description="what to change, for this finding")


class LogExplanation(BaseModel):
    failure: str | None = Field(default=None, description="the failed start in one line; None when none is shown")
    failure_kind: LogKind | None = None
    source: str
    findings: list[LogFinding]
    settings: dict[str, LogValue] = Field(description="from 'non-default args' / the engine config line")
    on_cpu: bool = Field(default=False, description="the server ran vLLM's CPU backend")
    failed: bool = Field(description="the log shows a failed start (a cause or a symptom)")
    vllm_lines: int = Field(default=0, description="lines in vLLM's logger format (LEVEL MM-DD HH:MM:SS [file:N])")
    implied_bytes_per_token: float | None = None
    implied_bytes_per_token_basis: str | None = None
    advice: list[str] = Field(default_factory=list)

    def serve_config(self) -> ServeConfig:
        """The logged settings ServeConfig models, typed, each one's origin the log; a value vLLM
        would not have logged (the log edited by hand) is an InputError naming the log."""
        given = {key: value for key, value in self.settings.items() if key in SERVE_SETTINGS}
        try:
            return ServeConfig.model_validate({**given, "origins": dict.fromkeys(given, f"--vllm-log {self.source}")})
        except ValidationError as exc:
            raise InputError(f"{self.source}: {validation_message(exc)}") from None


@dataclass(frozen=True)
class _Context:
    """What advice needs beyond a finding's own values: the whole log's numbers and settings."""

    facts: Values
    settings: dict[str, LogValue]
    block_size: int
    bytes_per_token: float | None

    @property
    def tp(self) -> int:
        tp = self.settings.get("tensor_parallel_size")
        return tp if isinstance(tp, int) else 1


Advice = Callable[[Values, _Context], list[str]]


@dataclass(frozen=True)
class _Rule:
    kind: LogKind
    regex: re.Pattern[str]
    meaning: Callable[[Values], str]
    vllm_source: str
    role: Role | None = None
    advice: Advice | None = None
    phased: bool = False  # the finding's values get 'phase', the startup step it happened in


def _num(text: str) -> int | float:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


_N = r"[\d,]+(?:\.\d+)?"
_MEM = rf"{_N} ?[KMG]iB"
_UNITS = {"K": 1 / (1 << 20), "M": 1 / 1024, "G": 1.0}
_TEXT_KEYS = frozenset(
    {
        "pool",
        "how",
        "device",
        "limit_key",
        "worker",
        "failed_procs",
        "phase",
        "gpu_name",
        "quantization",
        "model_type",
        "ray_pool",
    }
    | {"nccl_reason", "nccl_code", "nccl_cuda"}
)


def _value(key: str, text: str) -> LogValue:
    if key in _TEXT_KEYS:
        return text.strip()
    sized = re.fullmatch(rf"(-?{_N}) ?([KMG])iB", text)
    if sized:
        return round(float(_num(sized[1])) * _UNITS[sized[2]], 4)
    try:
        return _num(text)
    except ValueError:  # a rule's group caught text where a number was expected: keep it as logged
        return text.strip()


# --------------------------------------------------------------------------- advice


def _max_len_advice(v: Values, ctx: _Context) -> list[str]:
    """max_model_len above the KV cache: the longest that fits, the memory that would fit it, fp8, TP."""
    advice: list[str] = []
    estimated = ctx.facts.get("estimated_max_len") or ctx.facts.get("kv_tokens")
    if isinstance(estimated, int) and estimated > 0:
        limit = estimated // ctx.block_size * ctx.block_size
        advice.append(f"Lower --max-model-len to {limit:,} or less (the longest that fits this KV memory).")
    length = v.get("max_model_len")
    if isinstance(length, int) and "kv_cache_memory_bytes" in ctx.settings and ctx.bytes_per_token:
        blocks = blocks_for(length, ctx.block_size) + 1  # + vLLM's null block
        need = math.ceil(blocks * ctx.block_size * ctx.bytes_per_token)
        advice.append(
            f"Or raise --kv-cache-memory-bytes to at least {need:,} ({blocks} blocks of {ctx.block_size} tokens: "
            f"{length:,} tokens plus the null block)."
        )
    else:
        advice.append("Or give KV more memory: raise --gpu-memory-utilization, or free memory on the GPU.")
    if not str(ctx.settings.get("kv_cache_dtype", "auto")).startswith("fp8"):
        advice.append("--kv-cache-dtype fp8 halves bytes per token, doubling the tokens that fit.")
    advice.append(
        f"--tensor-parallel-size {2 * ctx.tp} splits KV heads and weights over twice the GPUs "
        "(not the KV of MLA models, which every rank stores whole)."
    )
    return advice


def _no_memory_advice(v: Values, ctx: _Context) -> list[str]:
    return [
        "Weights and activations use all of gpu_memory_utilization × memory: raise --gpu-memory-utilization, "
        f"use a quantized checkpoint or more GPUs (--tensor-parallel-size {2 * ctx.tp}); on CPU, "
        f"--kv-cache-memory-bytes must exceed one block ({ctx.block_size} tokens × bytes per token), which vLLM "
        "keeps as the null block."
    ]


def _held_memory_advice(free: str, total: str) -> Advice:
    def advice(v: Values, ctx: _Context) -> list[str]:
        # rounded down, never up: 19.77 / 22.05 = 0.8966 allows 0.89, not 0.90
        ceiling = math.floor(float(v[free]) / float(v[total]) * 100 + 1e-9) / 100
        return [
            f"Lower --gpu-memory-utilization to {ceiling:.2f} or less ({v[free]} of {v[total]} GiB is free), or set "
            "--kv-cache-memory-bytes explicitly (CPU: VLLM_CPU_KVCACHE_SPACE); on CPU the flag is the share of "
            "the NUMA node's RAM."
        ]

    return advice


def _max_len_over_model_advice(v: Values, ctx: _Context) -> list[str]:
    if v.get("limit_key") == "sliding_window":  # vLLM caps at the window when sliding window is disabled
        return [
            f"--disable-sliding-window caps max_model_len at the window, {v['derived_max_len']:,} tokens: drop "
            "--disable-sliding-window (on older vLLM also --enable-prefix-caching, which required it), or lower "
            f"--max-model-len to {v['derived_max_len']:,}; VLLM_ALLOW_LONG_MAX_MODEL_LEN does not apply."
        ]
    return [
        f"Lower --max-model-len to {v['derived_max_len']:,} or less, the context the model was trained for; only "
        "with RoPE scaling configured (e.g. --hf-overrides with a YaRN rope_scaling) set "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 to go past it (without scaling, longer positions give garbage or NaN)."
    ]


def _batched_tokens_advice(v: Values, ctx: _Context) -> list[str]:
    return [
        f"Raise --max-num-batched-tokens to at least {v['max_model_len']:,} (max_model_len), or lower "
        f"--max-model-len to {v['max_num_batched_tokens']:,}; or leave chunked prefill on (drop "
        "--no-enable-chunked-prefill / enable_chunked_prefill=False), which splits a long prompt over steps."
    ]


def _parallel_advice(v: Values, ctx: _Context) -> list[str]:
    """The sizes that divide the model's heads (or layers), and a TP × PP split that uses the GPUs asked for."""
    total, size = int(v.get("num_heads", v.get("num_layers", 1))), int(v["parallel_size"])
    what = "attention heads" if "num_heads" in v else "hidden layers"
    flag = "--tensor-parallel-size" if "num_heads" in v else "--pipeline-parallel-size"
    fits = [d for d in range(1, min(total, 2 * size) + 1) if total % d == 0]
    below = max((d for d in fits if d < size), default=1)
    advice = [f"Use a {flag} that divides the {total} {what}: {', '.join(map(str, fits))}."]
    if "num_heads" in v:
        pp = size // below if size % below == 0 else size
        tp = below if size % below == 0 else 1
        advice.append(
            f"To use all {size} GPUs, split layers instead: --tensor-parallel-size {tp} --pipeline-parallel-size "
            f"{pp} ({tp} × {pp} GPUs), at some cost in latency."
        )
    return advice


def _gpus_advice(v: Values, ctx: _Context) -> list[str]:
    pp = ctx.settings.get("pipeline_parallel_size")
    need = v.get("world_size", ctx.tp * (pp if isinstance(pp, int) else 1))
    have = v.get("gpus")
    fewer = (
        "lower --tensor-parallel-size" + (f" to {have}" if have else "") + (" or fewer" if have and have != 1 else "")
    )
    return [
        f"--tensor-parallel-size × --pipeline-parallel-size needs {need} GPUs"
        + (f", {have} visible" if have is not None else "")
        + f": make them visible (CUDA_VISIBLE_DEVICES, docker --gpus all, a pod's nvidia.com/gpu limit of {need}), "
        f"or {fewer} (a size that divides the attention heads); across nodes, start a Ray cluster and use "
        "--distributed-executor-backend ray."
    ]


def _capability(value: LogValue) -> str:
    """vLLM prints a quantization's capability as major×10 + minor (75), bf16's as 8.0."""
    return f"{int(value) // 10}.{int(value) % 10}" if isinstance(value, int) and value >= 10 else str(value)


def _dtype_advice(v: Values, ctx: _Context) -> list[str]:
    if "model_type" in v:
        return [
            f"Use --dtype bfloat16 (the {v['model_type']} checkpoints' own dtype; GPUs of compute capability 8.0+), "
            "or --dtype float32 on older GPUs (twice the weight memory); not --dtype half or float16."
        ]
    if "quantization" in v:
        return [
            f"This GPU (compute capability {_capability(v['capability'])}) cannot run {v['quantization']} kernels, "
            f"which need {_capability(v['min_capability'])}+: serve an unquantized checkpoint (--dtype half) or one "
            "quantized in a method this GPU supports (vLLM's supported-hardware table), or use a newer GPU."
        ]
    return [
        "Add --dtype half (float16): this GPU has no bfloat16; float16 keeps the same memory. A model that "
        "overflows in float16 (NaN or garbage output) needs --dtype float32 (twice the memory) or a newer GPU."
    ]


_OOM_ADVICE = {
    "loading the weights": "The weights alone do not fit: split them over more GPUs (--tensor-parallel-size {tp2} "
    "or --pipeline-parallel-size), use a quantized checkpoint (fp8, AWQ, GPTQ), and check no other process "
    "holds this GPU's memory; --gpu-memory-utilization does not change this.",
    "torch.compile": "torch.compile (inductor) ran out of memory: --enforce-eager skips compilation and CUDA graphs "
    "(slower decoding), or lower --max-num-batched-tokens, the largest shape compiled.",
    "the profiling run": "The profiling run, one forward pass of --max-num-batched-tokens tokens (and "
    "--max-num-seqs sequences), does not fit beside the weights: lower --max-num-batched-tokens and "
    "--max-num-seqs, or add GPUs (--tensor-parallel-size {tp2}); lowering --gpu-memory-utilization does not help.",
    "allocating the KV cache": "GPU memory changed between profiling and allocating the KV cache: lower "
    "--gpu-memory-utilization (or set --kv-cache-memory-bytes) and keep other processes off the GPU.",
    "capturing CUDA graphs": "CUDA graphs do not fit in what the KV cache left: lower --gpu-memory-utilization, "
    'capture fewer sizes (--max-cudagraph-capture-size, --compilation-config \'{{"cudagraph_capture_sizes": '
    "[...]}}', or a lower --max-num-seqs, which bounds them), or --enforce-eager to capture none.",
    "warming up the sampler": "The sampler's warm-up over --max-num-seqs requests does not fit: lower "
    "--max-num-seqs{seqs} or --gpu-memory-utilization.",
}
_OOM_UNKNOWN_PHASE = (
    "The startup step could not be told from the log: lower --gpu-memory-utilization, --max-num-seqs and "
    "--max-num-batched-tokens, or add GPUs (--tensor-parallel-size {tp2})."
)


def _oom_advice(v: Values, ctx: _Context) -> list[str]:
    seqs = v.get("num_seqs", ctx.settings.get("max_num_seqs"))
    template = _OOM_ADVICE.get(str(v.get("phase")), _OOM_UNKNOWN_PHASE)
    return [template.format(tp2=2 * ctx.tp, seqs=f" below {seqs} (e.g. {int(seqs) // 2})" if seqs else "")]


def _constant(*advice: str) -> Advice:
    return lambda v, ctx: list(advice)


def _concurrency_advice(v: Values, ctx: _Context) -> list[str]:
    return [
        f"Concurrency is quoted for full-length requests; for your workload's P99 request it is about "
        f"{v['tokens']:,} / P99 tokens: `llmload capacity --model-config ... --request-tokens P99`."
    ]


def _disagreement_advice(v: Values, ctx: _Context) -> list[str]:
    return [
        f"Plan on {v['concurrency']:.2f} requests of {v['request_tokens']:,} tokens at once; do not divide "
        f"{v['tokens']:,} by your P99 length (it counts one KV-cache group's share of the blocks). For shorter "
        "requests measure it on the server (a load test, or `llmload sim calibrate`): sliding-window and state "
        "layers need less per token than full attention, so concurrency does not scale with length."
    ]


# --------------------------------------------------------------------------- the rules

_GPU_WORKER = "vllm/v1/worker/gpu_worker.py"
_KV_UTILS = "vllm/v1/core/kv_cache_utils.py"
_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
_EXECUTOR = "vllm/v1/executor/multiproc_executor.py"
_TORCH_OOM = "torch (c10/cuda/CUDACachingAllocator.cpp), raised in a vLLM worker"
_ENGINE_ADVICE = _constant(
    "vLLM's engine did not start; the cause is an earlier line (the first Traceback of an EngineCore or "
    "worker process): give the whole log, not its tail."
)
_WORKER_ADVICE = _constant(
    "The worker's own lines (its rank's prefix) hold the cause; a worker killed without a traceback "
    "(exit code -9) was usually the host's OOM killer (dmesg) or, in a container, a small /dev/shm "
    "(docker --ipc=host or --shm-size 16g)."
)

_RULES: tuple[_Rule, ...] = (
    # facts
    _Rule(
        "kv_cache_size",
        re.compile(rf"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_N}) tokens"),
        lambda v: f"the {v['pool']} KV cache holds {v['tokens']:,} tokens, as vLLM counts them",
        _KV_UTILS,
        advice=_concurrency_advice,
    ),
    _Rule(
        "max_concurrency",
        re.compile(rf"Maximum concurrency for (?P<request_tokens>{_N}) tokens per request: (?P<concurrency>{_N})x"),
        lambda v: (
            f"{v['concurrency']:.2f}x requests of {v['request_tokens']:,} tokens fit at once, counted in whole blocks "
            f"(blocks ÷ ⌈{v['request_tokens']:,} / block_size⌉); shorter requests fit more"
        ),
        _KV_UTILS,
    ),
    _Rule(
        "available_kv_memory",
        re.compile(rf"Available KV cache memory: (?P<available_kv_gib>{_N}) ?GiB"),
        lambda v: f"{v['available_kv_gib']} GiB per GPU is left for KV after weights, activation peak and CUDA graphs",
        _GPU_WORKER,
    ),
    _Rule(
        "available_kv_memory",
        re.compile(rf"Memory profiling results:.*?\bkv_cache_size=(?P<available_kv_gib>-?{_N}) ?GiB"),
        lambda v: f"{v['available_kv_gib']} GiB per GPU is left for KV after weights and the activation peak",
        "vllm/worker/worker.py (V0 determine_num_available_blocks)",
    ),
    _Rule(
        "model_loading",
        re.compile(rf"(?:Model loading|Loading model weights) took (?P<weights_gib>{_N}) ?Gi?B"),  # V0: "GB", in GiB
        lambda v: f"the weights take {v['weights_gib']} GiB per GPU",
        f"{_RUNNER} (V0: vllm/worker/model_runner.py)",
    ),
    _Rule(
        "kv_memory_set",
        re.compile(
            rf"(?P<how>Explicitly|Auto) set \((?P<kv_set_gib>{_N})/(?P<node_total_gib>{_N})\) GiB for KV cache "
            r"on node (?P<node>\d+)"
        ),
        lambda v: (
            f"{str(v['how']).lower()} set {v['kv_set_gib']} GiB (of {v['node_total_gib']} GiB on NUMA node "
            f"{v['node']}) for the KV cache"
        ),
        "vllm/v1/worker/cpu_worker.py",
    ),
    _Rule(
        "kv_blocks",
        re.compile(r"# (?P<device>\w+) blocks: (?P<num_blocks>\d+)"),
        lambda v: f"{v['num_blocks']:,} KV-cache blocks on the {v['device']} device",
        "vllm/executor/executor_base.py (V0)",
    ),
    _Rule(
        "max_model_len_used",
        re.compile(r"Using max model len (?P<max_model_len>\d+)"),
        lambda v: f"max_model_len is {v['max_model_len']:,} tokens",
        "vllm/config/model.py",
    ),
    _Rule(
        "auto_fit",
        re.compile(r"Auto-fit max_model_len: reduced from (?P<derived_max_len>\d+) to (?P<max_model_len>\d+)"),
        lambda v: (
            f"--max-model-len -1 chose {v['max_model_len']:,}, the longest that fits (the model allows "
            f"{v['derived_max_len']:,})"
        ),
        _KV_UTILS,
    ),
    # causes, most specific first
    _Rule(
        "max_len_over_model",
        re.compile(
            r"User-specified max_model_len \((?P<max_model_len>\d+)\) is greater than the derived max_model_len "
            r"\((?:(?P<limit_key>\w+)=)?(?P<derived_max_len>\d+)"
        ),
        lambda v: (
            f"max_model_len {v['max_model_len']:,} is above the model's own limit, {v['derived_max_len']:,} "
            f"({v['limit_key'] if v.get('limit_key', 'None') != 'None' else 'config.json'}), so vLLM refuses the "
            "configuration"
        ),
        "vllm/config/model.py (older: vllm/config.py, _get_and_verify_max_len)",
        role="cause",
        advice=_max_len_over_model_advice,
    ),
    _Rule(
        "batched_tokens_below_len",
        re.compile(
            r"max_num_batched_tokens \((?P<max_num_batched_tokens>\d+)\) is smaller than max_model_len "
            r"\((?P<max_model_len>\d+)\)"
        ),
        lambda v: (
            f"with chunked prefill off, one step takes at most max_num_batched_tokens "
            f"({v['max_num_batched_tokens']:,}) tokens, fewer than a {v['max_model_len']:,}-token prompt "
            "(max_model_len), so vLLM refuses the configuration"
        ),
        "vllm/config/scheduler.py (verify_max_model_len; older: vllm/config.py, SchedulerConfig)",
        role="cause",
        advice=_batched_tokens_advice,
    ),
    _Rule(
        "parallel_size",
        re.compile(
            r"Total number of (?:attention heads \((?P<num_heads>\d+)\) must be divisible by tensor parallel size"
            r"|hidden layers \((?P<num_layers>\d+)\) must be divisible by pipeline parallel size) "
            r"\((?P<parallel_size>\d+)\)"
        ),
        lambda v: (
            f"{v.get('num_heads', v.get('num_layers'))} "
            + ("attention heads" if "num_heads" in v else "hidden layers")
            + f" do not split evenly over {v['parallel_size']} GPUs, so vLLM refuses the "
            + ("tensor" if "num_heads" in v else "pipeline")
            + " parallel size"
        ),
        "vllm/config/model.py (verify_with_parallel_config; older: vllm/config.py)",
        role="cause",
        advice=_parallel_advice,
    ),
    _Rule(
        "too_few_gpus",
        re.compile(
            r"World size \((?P<world_size>\d+)\) is larger than the number of available GPUs \((?P<gpus>\d+)\)"
            r"|The number of required GPUs exceeds the total number of available GPUs in the "
            r"(?P<ray_pool>placement group|cluster)"
        ),
        lambda v: (
            f"the tensor × pipeline parallel size ({v['world_size']}) is more than the {v['gpus']} GPU(s) visible"
            if "world_size" in v
            else f"Ray's {v['ray_pool']} has fewer GPUs than tensor × pipeline parallel size asks for"
        ),
        "vllm/config/parallel.py (world size check); Ray: vllm/v1/executor/ray_utils.py (V0: vllm/executor/)",
        role="cause",
        advice=_gpus_advice,
    ),
    _Rule(
        "dtype_unsupported",
        re.compile(
            r"Bfloat16 is only supported on GPUs with compute capability of at least "
            r"(?P<min_capability>\d+(?:\.\d+)?)\. Your (?P<gpu_name>.+?) GPU has compute capability "
            r"(?P<capability>\d+(?:\.\d+)?)"
        ),
        lambda v: (
            f"the {v['gpu_name']} (compute capability {v['capability']}) has no bfloat16, which the model's "
            f"dtype asks for (it needs {v['min_capability']}+)"
        ),
        "vllm/platforms/cuda.py (check_if_supports_dtype; older: vllm/worker/worker.py, _check_if_gpu_supports_dtype)",
        role="cause",
        advice=_dtype_advice,
    ),
    _Rule(
        "dtype_unsupported",
        re.compile(
            r"The quantization method (?P<quantization>\S+) is not supported for the current GPU\. Minimum "
            r"capability: (?P<min_capability>\d+)\. Current capability: (?P<capability>\d+)"
        ),
        lambda v: (
            f"the {v['quantization']} quantization needs compute capability {_capability(v['min_capability'])}+, "
            f"this GPU has {_capability(v['capability'])}"
        ),
        "vllm/config/vllm.py (_get_quantization_config; older: vllm/model_executor/model_loader/utils.py)",
        role="cause",
        advice=_dtype_advice,
    ),
    _Rule(
        "dtype_unsupported",
        re.compile(r"The model type '(?P<model_type>[\w.-]+)' does not support float16"),
        lambda v: f"vLLM refuses float16 for {v['model_type']} models (numerically unstable in float16)",
        "vllm/config/model.py (_check_valid_dtype, _FLOAT16_NOT_SUPPORTED_MODELS)",
        role="cause",
        advice=_dtype_advice,
    ),
    _Rule(
        "no_kernel_image",
        re.compile(r"no kernel image is available for execution on the device"),
        lambda v: (
            "the installed torch/vLLM build has no CUDA kernels for this GPU's architecture (too old, or too new, "
            "for the CUDA version it was built with)"
        ),
        "torch / vLLM CUDA kernels (cudaErrorNoKernelImageForDevice), raised in a vLLM worker",
        role="cause",
        advice=_constant(
            "Install a torch and vLLM built for this GPU's compute capability and your driver's CUDA (check "
            "`torch.cuda.get_arch_list()` lists its sm_XY; older GPUs need older CUDA wheels, e.g. cu12x not cu13x), "
            "or build vLLM from source with TORCH_CUDA_ARCH_LIST set to it."
        ),
    ),
    _Rule(
        "no_kv_memory",
        re.compile(rf"Available KV cache memory: (?P<available_kv_gib>-{_N}|0(?:\.0+)?) ?GiB"),
        lambda v: (
            f"{v['available_kv_gib']} GiB is left for the KV cache: weights, activation peak and CUDA graphs take "
            "more than gpu_memory_utilization × memory, so vLLM raises 'No available memory for the cache blocks'"
        ),
        _GPU_WORKER,
        role="cause",
        advice=_no_memory_advice,
    ),
    _Rule(
        "no_kv_memory",
        re.compile(rf"Memory profiling results:.*?\bkv_cache_size=(?P<available_kv_gib>-{_N}|0(?:\.0+)?) ?GiB"),
        lambda v: (
            f"{v['available_kv_gib']} GiB is left for the KV cache: weights and the activation peak take more than "
            "gpu_memory_utilization × memory, so vLLM raises 'No available memory for the cache blocks'"
        ),
        "vllm/worker/worker.py (V0 determine_num_available_blocks)",
        role="cause",
        advice=_no_memory_advice,
    ),
    _Rule(
        "max_len_too_long",
        re.compile(
            rf"max seq len \((?P<max_model_len>\d+)\),? \(?(?P<needed_gib>{_N}) GiB KV cache is needed, which is "
            rf"larger than the available KV cache memory \((?P<available_gib>{_N}) GiB\)"
            r"(?:.*?estimated maximum model length is (?P<estimated_max_len>\d+))?"
        ),
        lambda v: (
            f"one {v['max_model_len']:,}-token request needs {v['needed_gib']} GiB of KV per GPU, more than the "
            f"{v['available_gib']} GiB available, so vLLM refuses to start"
            + (f"; the longest that fits is {v['estimated_max_len']:,}" if "estimated_max_len" in v else "")
        ),
        _KV_UTILS,
        role="cause",
        advice=_max_len_advice,
    ),
    _Rule(
        "max_len_over_kv_tokens",
        re.compile(
            r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be "
            r"stored in KV cache \((?P<kv_tokens>\d+)\)"
        ),
        lambda v: (
            f"max_model_len {v['max_model_len']:,} exceeds the {v['kv_tokens']:,} tokens the KV cache holds, "
            "so vLLM refuses to start"
        ),
        f"{_KV_UTILS} (V0: vllm/worker/worker.py)",
        role="cause",
        advice=_max_len_advice,
    ),
    _Rule(
        "no_cache_memory",
        re.compile(r"No available memory for the cache blocks"),
        lambda v: "after weights and activations nothing (or at most the one reserved null block) is left for KV",
        f"{_KV_UTILS} (V0: vllm/worker/worker.py)",
        role="cause",
        advice=_no_memory_advice,
    ),
    _Rule(
        "device_memory",
        re.compile(
            rf"(?i:free) memory on device (?:\S+ )?\((?P<free_gib>{_N})/(?P<total_gib>{_N}) GiB\) on startup is less "
            rf"than desired GPU memory utilization \((?P<utilization>{_N}), (?P<requested_gib>{_N}) GiB\)"
        ),
        lambda v: (
            f"only {v['free_gib']} of {v['total_gib']} GiB is free on the GPU, less than utilization "
            f"{v['utilization']} asks for ({v['requested_gib']} GiB): another process holds GPU memory"
        ),
        _GPU_WORKER,
        role="cause",
        advice=_held_memory_advice("free_gib", "total_gib"),
    ),
    _Rule(
        "node_memory",
        re.compile(
            rf"Available memory on node (?P<node>\d+) \((?P<node_free_gib>{_N})/(?P<node_total_gib>{_N}) GiB\) on "
            rf"(?:startup|kv cache allocation) is less than (?:desired CPU memory utilization "
            rf"\((?P<utilization>{_N}), (?P<requested_gib>{_N}) GiB\)|requested memory for kv "
            rf"\((?P<requested_kv_gib>{_N}))"
        ),
        lambda v: (
            f"NUMA node {v['node']} has {v['node_free_gib']} of {v['node_total_gib']} GiB free, less than vLLM "
            + (
                f"asks for (utilization {v['utilization']} = {v['requested_gib']} GiB)"
                if "utilization" in v
                else f"needs for the KV cache ({v['requested_kv_gib']} GiB)"
            )
        ),
        "vllm/v1/worker/cpu_worker.py",
        role="cause",
        advice=_held_memory_advice("node_free_gib", "node_total_gib"),
    ),
    _Rule(
        "profiling_error",
        re.compile(r"Error in memory profiling"),
        lambda v: "free GPU memory rose while vLLM profiled: another process on the GPU released memory",
        _GPU_WORKER,
        role="cause",
        advice=_constant("Run vLLM alone on its GPUs (its own container, no other process on them) and restart."),
    ),
    _Rule(
        "sampler_oom",
        re.compile(r"out of memory occurred when warming up sampler with (?P<num_seqs>\d+) dummy requests"),
        lambda v: f"CUDA ran out of memory warming up the sampler with {v['num_seqs']} sequences (max_num_seqs)",
        f"{_RUNNER} (_dummy_sampler_run)",
        role="cause",
        advice=_oom_advice,
        phased=True,
    ),
    _Rule(
        "cuda_oom",
        re.compile(
            rf"(?:CUDA|HIP|XPU) out of memory\. Tried to allocate (?P<tried_gib>{_MEM})\. GPU (?P<gpu>\d+) has a "
            rf"total capacity of (?P<gpu_total_gib>{_MEM}) of which (?P<gpu_free_gib>{_MEM}) is free"
        ),
        lambda v: (
            f"CUDA out of memory while {v.get('phase', 'starting')}: {v['tried_gib']} GiB asked for, "
            f"{v['gpu_free_gib']} of {v['gpu_total_gib']} GiB free on GPU {v['gpu']}"
        ),
        _TORCH_OOM,
        role="cause",
        advice=_oom_advice,
        phased=True,
    ),
    _Rule(
        "cuda_oom",
        re.compile(
            rf"(?:CUDA|HIP) out of memory\. Tried to allocate (?P<tried_gib>{_MEM}) \(GPU (?P<gpu>\d+); "
            rf"(?P<gpu_total_gib>{_MEM}) total capacity; {_MEM} already allocated; (?P<gpu_free_gib>{_MEM}) free"
        ),
        lambda v: (
            f"CUDA out of memory while {v.get('phase', 'starting')}: {v['tried_gib']} GiB asked for, "
            f"{v['gpu_free_gib']} of {v['gpu_total_gib']} GiB free on GPU {v['gpu']}"
        ),
        f"{_TORCH_OOM} (torch < 2.3 wording)",
        role="cause",
        advice=_oom_advice,
        phased=True,
    ),
    _Rule(
        "cuda_oom",
        re.compile(r"CUDA error: out of memory|(?:CUDA|HIP) out of memory\.?$"),
        lambda v: f"CUDA out of memory while {v.get('phase', 'starting')}",
        "torch (c10/cuda/CUDAException.cpp), raised in a vLLM worker",
        role="cause",
        advice=_oom_advice,
        phased=True,
    ),
    _Rule(
        "nccl_error",
        re.compile(
            r"NCCL error:? (?:in: \S+ )?(?P<nccl_reason>[^,(]{0,80})"
            r"|\b(?P<nccl_code>nccl(?:UnhandledCuda|System|Internal|InvalidArgument|InvalidUsage|Remote)Error)\b"
            r"|Cuda failure '(?P<nccl_cuda>[^']+)'"
        ),
        lambda v: (
            "NCCL, the GPUs' communication library, failed "
            f"({v.get('nccl_reason') or v.get('nccl_code') or v.get('nccl_cuda')})"
        ),
        "vllm/distributed/device_communicators/pynccl_wrapper.py, torch.distributed",
        role="cause",
        advice=lambda v, ctx: [
            "Run with NCCL_DEBUG=INFO to see which transport failed; in a container give it shared memory "
            "(--ipc=host or --shm-size 16g); on GPUs without peer-to-peer access set NCCL_P2P_DISABLE=1; check all "
            + (f"{ctx.tp} " if "tensor_parallel_size" in ctx.settings else "the tensor-parallel ")
            + "GPUs are visible (CUDA_VISIBLE_DEVICES), or try a smaller --tensor-parallel-size."
        ],
    ),
    # symptoms: the engine or a worker gave up; the cause is another line
    _Rule(
        "worker_died",
        re.compile(r"(?:Worker proc (?P<worker>\S+)|RayWorkerProc rank=(?P<ray_rank>\S+)) died unexpectedly"),
        lambda v: f"worker {v.get('worker', v.get('ray_rank'))} died, so vLLM shut the executor down",
        _EXECUTOR,
        role="symptom",
        advice=_WORKER_ADVICE,
    ),
    _Rule(
        "worker_died",
        re.compile(r"Worker (?P<worker>\S+) pid (?P<pid>\d+) died, exit code: (?P<exit_code>-?\d+)"),
        lambda v: (
            f"worker {v['worker']} (pid {v['pid']}) died with exit code {v['exit_code']}"
            + (" (killed by SIGKILL, usually the host's OOM killer)" if v["exit_code"] == -9 else "")
        ),
        "vllm/executor/multiproc_worker_utils.py (V0)",
        role="symptom",
        advice=_WORKER_ADVICE,
    ),
    _Rule(
        "worker_died",
        re.compile(
            r"A worker died or was killed while executing a task by an unexpected system error"
            r"(?:.*?Worker PID: (?P<pid>\d+))?(?:.*?Worker exit type: (?P<exit_type>\w+))?"
            r"|ray\.exceptions\.ActorDiedError: The actor died"
        ),
        lambda v: (
            "a Ray worker process died"
            + (f" (pid {v['pid']})" if "pid" in v else "")
            + (f", exit type {v['exit_type']}" if "exit_type" in v else "")
            + " without a Python error of its own: usually killed (the host's OOM killer) or crashed (SIGSEGV)"
        ),
        "ray (raylet), under vllm/v1/executor/ray_executor.py (V0: ray_distributed_executor.py)",
        role="symptom",
        advice=_WORKER_ADVICE,
    ),
    _Rule(
        "engine_failed",
        re.compile(r"WorkerProc (?:initialization failed|failed to start)"),
        lambda v: "a worker process failed to initialise; its own traceback above holds the cause",
        _EXECUTOR,
        role="symptom",
        advice=_ENGINE_ADVICE,
    ),
    _Rule(
        "engine_failed",
        re.compile(r"EngineCore failed to start"),
        lambda v: "vLLM's engine core did not start",
        "vllm/v1/engine/core.py",
        role="symptom",
        advice=_ENGINE_ADVICE,
    ),
    _Rule(
        "engine_failed",
        re.compile(
            r"Engine core initialization failed\. See root cause above\.(?: Failed core proc\(s\): "
            r"(?P<failed_procs>\{[^}]*\}))?"
        ),
        lambda v: (
            "the API server gave up: its engine core did not start"
            + (f" (exit codes {v['failed_procs']})" if v.get("failed_procs", "{}") != "{}" else "")
        ),
        "vllm/v1/engine/utils.py",
        role="symptom",
        advice=_ENGINE_ADVICE,
    ),
    _Rule(
        "engine_failed",
        re.compile(r"Engine process failed to start"),
        lambda v: "the API server gave up: its engine process did not start",
        "vllm/entrypoints/openai/api_server.py (V0)",
        role="symptom",
        advice=_ENGINE_ADVICE,
    ),
)
_PRECEDENCE = {rule.kind: i for i, rule in reversed(list(enumerate(_RULES)))}
_SYMPTOMS = tuple(rule.regex for rule in _RULES if rule.role == "symptom")

# The startup step a line shows vLLM in: its own progress lines, and the function of a traceback frame.
_PHASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"in _dummy_sampler_run$|Graph capturing finished"), "warming up the sampler"),
    (re.compile(r"Capturing CUDA ?graph|Capturing cudagraphs|in (?:capture_model|_capture_cudagraphs)$"),
     "capturing CUDA graphs"),
    (re.compile(r"/torch/_(?:inductor|dynamo)/|Compiling a graph|Dynamo bytecode transform|for vLLM's torch\.compile"),
     "torch.compile"),
    (re.compile(r"Available KV cache memory|# \w+ blocks:|in (?:initialize_kv_cache|_allocate_kv_cache\w*|"
                r"initialize_cache|_init_cache)$"), "allocating the KV cache"),
    (re.compile(r"Model loading took|Loading model weights took|torch\.compile takes|"
                r"in (?:profile_run|determine_available_memory|determine_num_available_blocks)$"), "the profiling run"),
    (re.compile(r"Starting to load model|Loading (?:weights|safetensors|pt checkpoint|model weights)|"
                r"in (?:load_model|load_weights)$"), "loading the weights"),
)  # fmt: skip

# What wraps vLLM's message: ANSI colours, then timestamps, a compose service's `name |`, journalctl's
# `Mon DD HH:MM:SS host unit[pid]:` and `kubectl logs --prefix`'s `[pod/…]`, then process prefixes, then the
# logger's `LEVEL MM-DD HH:MM:SS [file.py:N]` (V0 has no opening bracket), then torch's `[rankN]:`.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_WRAPPER = re.compile(
    r"^(?:\s*\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?\s+|\s*[\w.-]+\s+\|\s?|\s*\|\s+"
    r"|[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d [\w.-]+ [\w.@-]+(?:\[\d+\])?:\s+"  # journalctl
    r"|\[pod/[^\]\s]+\]\s+)*"  # kubectl logs --prefix: `[pod/name/container] `
    r"(?P<processes>(?:\([A-Za-z_][\w.-]*(?:[ ,]+\w+=[^\s,)]+)*\)\s*)*)"
    r"(?P<logger>(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?:(?:\d{4}-)?\d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
    r"\[?|\[)[\w./-]+:\d+\] ?)?"  # the date left out (a quoted log): then the bracket is there
    r"(?:\[rank\d+\]:\s?)?"  # torch.distributed's prefix on a rank's stderr
)
_PROCESS = re.compile(r"\(([^()]*)\)")
_EXCEPTION_TYPE = re.compile(r"^(?:(?:[\w.]+(?:Error|Exception)(?:\[\w+\])?: |Value error, ))+")
_SOURCE_CODE = re.compile(r"^(?:raise\b|return\b|[\w.]+\(|f?[\"']|\.\.\.<)")  # a traceback's quoted code
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): \S")


@dataclass(frozen=True)
class _Line:
    line_no: int
    origin: str | None
    is_vllm: bool  # in vLLM's logger format
    message: str


def _unwrap(lines: Iterable[str]) -> list[_Line]:
    """Every line's message, stripped of colours, timestamps, process and logger prefixes, once."""
    out = []
    for line_no, raw in enumerate(lines, 1):
        line = _ANSI.sub("", raw)
        m = _WRAPPER.match(line)
        assert m is not None  # every part of _WRAPPER is optional
        processes = _PROCESS.findall(m["processes"])
        out.append(
            _Line(line_no, processes[-1] if processes else None, m["logger"] is not None, line[m.end() :].strip())
        )
    return out


def _settings(lines: Iterable[_Line]) -> dict[str, LogValue]:
    found: dict[str, LogValue] = {}
    for line in lines:
        if _SETTINGS_LINE.search(line.message):
            for m in _SETTING.finditer(line.message):
                key = "max_model_len" if m["key"] == "max_seq_len" else m["key"]
                value = m["value"]
                if value == "None":  # an argparse Namespace's unset flag
                    continue
                found.setdefault(key, _num(value) if re.fullmatch(r"[\d.]+", value) else value)
    return found


# vLLM >= 0.10 logs `non-default args: {...}`; V1 and V0 the engine config (`Initializing a V1 LLM engine`,
# V0 `Initializing an LLM engine (v0.5.4) with config:` / `Initializing a V0 LLM engine`); older api_servers
# `args: Namespace(...)`, where unset flags are None.
_SETTINGS_LINE = re.compile(r"non-default args:|Initializing an? (?:V[01] )?LLM engine|\bargs: Namespace\(")
_SETTING = re.compile(
    r"(?<![\w])['\"]?(?P<key>max_model_len|max_seq_len|kv_cache_memory_bytes|gpu_memory_utilization|"
    r"tensor_parallel_size|pipeline_parallel_size|kv_cache_dtype|block_size|device_config|max_num_seqs|"
    r"max_num_batched_tokens|enable_prefix_caching)['\"]?\s*[:=]\s*['\"]?(?P<value>[\w.]+)"
)


def _match(lines: list[_Line]) -> list[tuple[_Rule, LogFinding]]:
    """Every rule's finding, once per message (errors print twice: the traceback, then re-raised),
    an OOM's phase taken from the nearest preceding phase line of its process, else of any."""
    found: list[tuple[_Rule, LogFinding]] = []
    seen: set[tuple[str, str]] = set()
    phase: dict[str | None, str] = {}
    for line in lines:
        for regex, name in _PHASES:
            if regex.search(line.message):
                phase[line.origin] = phase[None] = name
                break
        for rule in () if _SOURCE_CODE.match(line.message) else _RULES:
            m = rule.regex.search(line.message)
            if m is None:
                continue
            key = (rule.kind, _EXCEPTION_TYPE.sub("", line.message))
            if key in seen:
                continue
            seen.add(key)
            values = {k: _value(k, v) for k, v in m.groupdict().items() if v}
            current = phase.get(line.origin, phase.get(None))
            if rule.phased and current is not None:
                values["phase"] = current
            finding = LogFinding(
                line_no=line.line_no,
                kind=rule.kind,
                text=line.message,
                origin=line.origin,
                values=values,
                meaning=rule.meaning(values),
                role=rule.role,
                vllm_source=rule.vllm_source,
            )
            found.append((rule, finding))
    return found


def _disagreement(facts: Values, findings: list[LogFinding], block_size: int) -> LogFinding | None:
    """vLLM's 'KV cache size' and 'Maximum concurrency' lines, when they disagree beyond rounding.

    vLLM logs concurrency = num_blocks / Σ_groups ⌈per-request bytes / page bytes⌉, summed over the
    KV-cache groups, and, before it printed int(concurrency × max_model_len), the token figure as
    num_blocks // len(groups) × block_size (kv_cache_utils.py, _report_kv_cache_config). For a model
    with one group the two agree to within whole-block rounding and the printed 2 decimals; for a
    hybrid model (sliding-window, chunked-local or Mamba layers beside full attention) the token
    figure is one group's share of the pool and the concurrency line is the capacity.
    """
    tokens, concurrency, length = facts.get("tokens"), facts.get("concurrency"), facts.get("request_tokens")
    if not (isinstance(tokens, int) and isinstance(concurrency, int | float) and isinstance(length, int)):
        return None
    whole = concurrency * length
    if abs(tokens - whole) <= 0.005 * length + concurrency * block_size + block_size:
        return None
    line = next(f for f in findings if f.kind == "max_concurrency")
    values: Values = {"tokens": tokens, "concurrency": concurrency, "request_tokens": length, "whole": int(whole)}
    return LogFinding(
        line_no=line.line_no,
        kind="kv_size_disagrees",
        text=line.text,
        origin=line.origin,
        values=values,
        meaning=(
            f"{concurrency:.2f} × {length:,} = {int(whole):,} tokens, not the {tokens:,} of 'KV cache size': the "
            "model has several KV-cache groups (sliding-window or state layers beside full attention), the token "
            f"figure is one group's share of the blocks, and the capacity is {concurrency:.2f} full-length requests"
        ),
        vllm_source=f"{_KV_UTILS} (_report_kv_cache_config, get_max_concurrency_for_kv_cache_config)",
    )


def _implied_bytes_per_token(
    facts: Values, settings: dict[str, LogValue], block_size: int
) -> tuple[float | None, str | None]:
    """KV bytes per token (per GPU) from whichever numbers the log gives, most exact first."""
    kv_bytes = settings.get("kv_cache_memory_bytes")
    tokens, length, blocks = facts.get("tokens"), facts.get("request_tokens"), facts.get("num_blocks")
    physical = None
    if isinstance(blocks, int):
        physical = blocks * block_size
    elif isinstance(tokens, int) and isinstance(length, int):
        # vLLM logs int(num_blocks / ceil(L / block_size) × L): invert it to whole blocks.
        per_request = blocks_for(length, block_size)
        physical = -(-tokens * per_request // length) * block_size
    elif isinstance(tokens, int):
        physical = tokens
    if isinstance(kv_bytes, int) and physical:
        return (
            kv_bytes / physical,
            f"kv_cache_memory_bytes {kv_bytes:,} / {physical:,} tokens ({block_size}-token blocks)",
        )
    available = facts.get("available_kv_gib")
    if isinstance(available, float) and available > 0 and physical:
        return available * GIB / physical, f"Available KV cache memory {available} GiB / {physical:,} tokens (±0.5%)"
    estimated = facts.get("estimated_max_len")
    if isinstance(kv_bytes, int) and isinstance(estimated, int):
        total = estimated + block_size  # the estimate leaves out the null block
        return (
            kv_bytes / total,
            f"kv_cache_memory_bytes {kv_bytes:,} / ({estimated:,} + one {block_size}-token null block)",
        )
    kv_tokens = facts.get("kv_tokens")
    if isinstance(kv_bytes, int) and isinstance(kv_tokens, int):
        return kv_bytes / kv_tokens, f"kv_cache_memory_bytes {kv_bytes:,} / {kv_tokens:,} KV tokens"
    needed, length = facts.get("needed_gib"), facts.get("max_model_len")
    if isinstance(needed, float) and needed > 0 and isinstance(length, int):
        rounded = blocks_for(length, block_size) * block_size
        return needed * GIB / rounded, f"{needed} GiB needed / {rounded:,} tokens (±0.5%)"
    return None, None


def _headline(findings: list[LogFinding]) -> LogFinding | None:
    """The failure to name first: a cause before a symptom, then by the rules' precedence, then the earliest."""
    failing = [f for f in findings if f.role is not None]
    return min(failing, key=lambda f: (f.role == "symptom", _PRECEDENCE[f.kind], f.line_no), default=None)


def _unknown_cause(lines: list[_Line]) -> str | None:
    """The last exception line that is not one of vLLM's wrappers: the likeliest cause no rule knows."""
    for line in reversed(lines):
        if _EXCEPTION_LINE.match(line.message) and not any(r.search(line.message) for r in _SYMPTOMS):
            return f"line {line.line_no}: {line.message[:200]}"
    return None


def explain_vllm_log(text: str, *, source: str = "<log>") -> LogExplanation:
    """Find vLLM's KV-cache lines and startup failures in a log; say what they mean and what to change.

    `text` is a server's log as printed (V0 or V1; docker/kubectl timestamps, process prefixes and
    ANSI colours allowed). Each finding carries its line number, the message, its values (tokens,
    GiB per GPU, sequences), the vLLM source that prints it and its advice; `failure` names the most
    specific failed start in one line. Never raises for odd text: a log without vLLM lines gives no
    findings and `vllm_lines == 0`.
    """
    lines = _unwrap(text.splitlines())
    matched = _match(lines)
    findings = [finding for _, finding in matched]
    facts: Values = {}
    for finding in findings:
        facts.update({k: v for k, v in finding.values.items() if k != "phase"})
    settings = _settings(lines)
    kinds: set[str] = {f.kind for f in findings}
    cpu = (
        "CPU" in str(facts.get("pool", ""))
        or "cpu" in str(settings.get("device_config", ""))
        or bool(kinds & {"kv_memory_set", "node_memory"})
    )
    logged_block_size = settings.get("block_size")
    default_block_size = DEVICE_DEFAULTS["cpu" if cpu else "gpu"].block_size
    block_size = logged_block_size if isinstance(logged_block_size, int) else default_block_size
    disagreement = _disagreement(facts, findings, block_size)
    rules: list[tuple[Advice | None, LogFinding]] = [(rule.advice, finding) for rule, finding in matched]
    if disagreement is not None:
        facts.pop("tokens")  # one group's share, not the pool: no bytes per token from it
        rules = [(None, f) if f.kind == "kv_cache_size" else (a, f) for a, f in rules]
        rules.append((_disagreement_advice, disagreement))
        findings.append(disagreement)
    headline = _headline(findings)
    bpt, basis = _implied_bytes_per_token(facts, settings, block_size)
    context = _Context(facts, settings, block_size, bpt)
    for advice, finding in rules:
        finding.advice = advice(finding.values, context) if advice else []
    ordered = ([headline] if headline else []) + [f for f in findings if f is not headline]
    failure = None
    if headline is not None:
        failure = f"vLLM did not start: {headline.meaning} (line {headline.line_no})"
        unknown = _unknown_cause(lines) if headline.role == "symptom" else None
        if unknown:
            failure += f"; no known cause found, the last exception is {unknown}"
    return LogExplanation(
        failure=failure,
        failure_kind=headline.kind if headline else None,
        source=source,
        findings=findings,
        settings=settings,
        on_cpu=cpu,
        failed=headline is not None,
        vllm_lines=sum(line.is_vllm for line in lines),
        implied_bytes_per_token=bpt,
        implied_bytes_per_token_basis=basis,
        advice=list(dict.fromkeys(a for f in ordered if f.role == (headline and headline.role) for a in f.advice)),
    )
