"""The plan: KV bytes/token, cache size, concurrency and max_model_len for one model on one server.

``plan_capacity`` splits each GPU's memory as vLLM's determine_available_memory does (budget,
weights, overhead, KV), sizes the pool with ``llmload.capacity.kv`` and says what to change when
the plan falls short.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from llmload.capacity.kv import (
    DEFAULT_BLOCK_SIZE,
    DTYPE_BYTES,
    GIB,
    KVCache,
    KVCacheDtype,
    KVLayout,
    ModelDtype,
    RequestFit,
    capacity_for_request_tokens,
    kv_cache_pool,
    kv_layout,
    logged_kv_cache_tokens,
    max_len_for_concurrency,
    resolve_dtype,
)
from llmload.capacity.model import ModelSpec, estimate_parameters
from llmload.errors import InputError
from llmload.models import Strict

# vLLM 0.32's default CacheConfig.gpu_memory_utilization.
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
# Per-GPU reserve for what vLLM's profiling run measures besides weights: the activation peak
# (grows with --max-num-batched-tokens), CUDA graphs and non-torch memory (NCCL, cuBLAS).
DEFAULT_OVERHEAD_GIB = 2.0
# vLLM's --max-num-seqs default for the OpenAI server on most GPUs (engine/arg_utils.py).
MAX_NUM_SEQS_DEFAULT = 256
# --max-model-len -1 (or auto): vLLM takes the longest sequence its KV cache holds.
AUTO_FIT = -1


class CapacityInputs(Strict):
    """Serving settings, named after vLLM's flags; sizes in GiB (2**30 bytes)."""

    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    gpu_memory_gib: PositiveFloat | None = Field(default=None, description="total memory of one GPU")
    gpu_memory_utilization: float = Field(default=DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1)
    weights_gib: NonNegativeFloat | None = Field(default=None, description="whole model; None: estimate")
    overhead_gib: NonNegativeFloat = Field(default=DEFAULT_OVERHEAD_GIB, description="per GPU, besides weights")
    kv_cache_gib: PositiveFloat | None = Field(default=None, description="per GPU, like --kv-cache-memory-bytes")
    cpu_offload_gib: NonNegativeFloat = Field(default=0.0, description="weights per GPU kept in CPU memory")
    dtype: ModelDtype = "auto"
    kv_cache_dtype: KVCacheDtype = "auto"
    block_size: PositiveInt = DEFAULT_BLOCK_SIZE
    max_model_len: int | None = Field(default=None, description="-1: the longest the KV cache holds (vLLM's auto)")
    request_tokens: PositiveInt | None = None
    min_concurrency: PositiveFloat | None = None

    @field_validator("max_model_len")
    @classmethod
    def _length_or_auto(cls, value: int | None) -> int | None:
        if value is not None and value < 1 and value != AUTO_FIT:
            raise ValueError(f"must be positive, or {AUTO_FIT} for the longest that fits; got {value}")
        return value


class MemoryBudget(BaseModel):
    """Per-GPU memory, as vLLM's determine_available_memory splits it (GiB)."""

    kv_cache_gib: float
    kv_cache_explicit: bool = Field(description="given as --kv-cache-gib rather than derived")
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    requested_gib: float | None = Field(default=None, description="ceil(total × utilization)")
    weights_gib: float | None = Field(default=None, description="per GPU (whole model / TP / PP − CPU offload)")
    weights_estimated: bool = False
    parameters: int | None = None
    overhead_gib: float | None = None


class CapacityReport(BaseModel):
    model: ModelSpec
    layout: KVLayout
    memory: MemoryBudget
    cache: KVCache
    max_model_len: int
    at_max_model_len: RequestFit
    vllm_log_kv_cache_tokens: int = Field(description="what vLLM's 'KV cache size: N tokens' line will say")
    at_request_tokens: RequestFit | None = None
    recommended_max_model_len: int = Field(description="longest one sequence can be, capped by the model")
    min_concurrency: float | None = None
    max_model_len_for_min_concurrency: int | None = None
    starts: bool = Field(description="vLLM would pass its KV-cache startup check with max_model_len")
    startup_error: str | None = Field(default=None, description="the error vLLM would raise at startup, its words")
    warnings: list[str] = Field(default_factory=list)
    advice: list[str] = Field(default_factory=list)


def _budget(model: ModelSpec, inputs: CapacityInputs) -> MemoryBudget:
    if inputs.kv_cache_gib is not None:
        return MemoryBudget(kv_cache_gib=inputs.kv_cache_gib, kv_cache_explicit=True)
    if inputs.gpu_memory_gib is None:
        raise InputError("give --gpu-memory-gib (memory of one GPU) or --kv-cache-gib (KV memory per GPU)")
    requested = math.ceil(inputs.gpu_memory_gib * GIB * inputs.gpu_memory_utilization) / GIB
    params = None
    if inputs.weights_gib is None:
        params = estimate_parameters(model)
        per_param = model.weight_bytes_per_param or DTYPE_BYTES[resolve_dtype(model, inputs.dtype)]
        weights = params * per_param / GIB
    else:
        weights = inputs.weights_gib
    per_gpu = max(0.0, weights / (inputs.tensor_parallel_size * inputs.pipeline_parallel_size) - inputs.cpu_offload_gib)
    return MemoryBudget(
        kv_cache_gib=requested - per_gpu - inputs.overhead_gib,
        kv_cache_explicit=False,
        gpu_memory_gib=inputs.gpu_memory_gib,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        requested_gib=requested,
        weights_gib=per_gpu,
        weights_estimated=params is not None,
        parameters=params,
        overhead_gib=inputs.overhead_gib,
    )


def _pool(model: ModelSpec, inputs: CapacityInputs) -> tuple[KVLayout, MemoryBudget, KVCache]:
    layout = kv_layout(
        model,
        tensor_parallel_size=inputs.tensor_parallel_size,
        pipeline_parallel_size=inputs.pipeline_parallel_size,
        dtype=inputs.dtype,
        kv_cache_dtype=inputs.kv_cache_dtype,
        block_size=inputs.block_size,
    )
    budget = _budget(model, inputs)
    return layout, budget, kv_cache_pool(layout, math.floor(budget.kv_cache_gib * GIB))


def _what_if(model: ModelSpec, inputs: CapacityInputs, max_model_len: int, **change: object) -> str:
    """Tokens and concurrency under one changed setting, for advice."""
    layout, _, cache = _pool(model, inputs.model_copy(update=change))
    fit = capacity_for_request_tokens(layout, cache, max_model_len)
    return f"{cache.tokens:,} tokens, {fit.max_concurrency:.2f}x at {max_model_len:,}"


def _advice(model: ModelSpec, inputs: CapacityInputs, report: CapacityReport) -> list[str]:
    """What to change, only when the plan falls short (no start, or below --min-concurrency)."""
    short_of_concurrency = (
        report.min_concurrency is not None and report.at_max_model_len.max_concurrency < report.min_concurrency
    )
    if report.starts and not short_of_concurrency:
        return []
    length = report.max_model_len
    advice = []
    if report.cache.longest_servable_len == 0:
        advice.append(
            "No memory is left for even one KV block (vLLM: 'No available memory for the cache blocks'): "
            "use more GPUs, a quantized checkpoint, or a larger --gpu-memory-utilization."
        )
    elif not report.starts:
        advice.append(f"Lower --max-model-len to {report.recommended_max_model_len:,} (the longest that fits).")
    if short_of_concurrency and report.max_model_len_for_min_concurrency:
        advice.append(
            f"--max-model-len {report.max_model_len_for_min_concurrency:,} gives {report.min_concurrency:g}x "
            "concurrency at full length."
        )
    if report.layout.dtype_bytes > 1:
        advice.append(
            f"--kv-cache-dtype fp8 halves bytes per token: {_what_if(model, inputs, length, kv_cache_dtype='fp8')}."
        )
    if not report.memory.kv_cache_explicit:
        if inputs.gpu_memory_utilization < 0.95:
            advice.append(
                f"--gpu-memory-utilization 0.95: {_what_if(model, inputs, length, gpu_memory_utilization=0.95)}."
            )
        tp = 2 * inputs.tensor_parallel_size
        if model.num_attention_heads % tp == 0 and (model.mla is not None or model.num_kv_heads % tp == 0):
            advice.append(f"--tensor-parallel-size {tp}: {_what_if(model, inputs, length, tensor_parallel_size=tp)}.")
    return advice


def plan_capacity(model: ModelSpec, inputs: CapacityInputs) -> CapacityReport:
    """KV bytes/token, cache size, concurrency and max_model_len for one model on one server."""
    layout, budget, cache = _pool(model, inputs)
    longest = cache.longest_servable_len
    recommended = min(longest, model.max_position_embeddings or longest)
    length = recommended if inputs.max_model_len == AUTO_FIT else inputs.max_model_len or model.max_position_embeddings
    if not length:
        raise InputError(f"{model.source}: no max_position_embeddings; give --max-model-len")
    at_max = capacity_for_request_tokens(layout, cache, length)
    at_request = capacity_for_request_tokens(layout, cache, inputs.request_tokens) if inputs.request_tokens else None
    warnings = list(model.notes)
    if budget.weights_estimated:
        warnings.append(
            f"weights estimated from the config: {budget.parameters or 0:,} parameters; pass --weights-gib "
            "(vLLM logs 'Model loading took X GiB') for the real size"
        )
    if model.max_position_embeddings and length > model.max_position_embeddings:
        warnings.append(
            f"max_model_len {length:,} exceeds the model's max_position_embeddings "
            f"{model.max_position_embeddings:,}: vLLM refuses it unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1"
        )
    if inputs.kv_cache_gib is not None and inputs.gpu_memory_gib is not None:
        warnings.append(
            "--kv-cache-gib given: the GPU memory budget is ignored, as vLLM does with --kv-cache-memory-bytes"
        )
    if model.mla is not None and inputs.tensor_parallel_size > 1:
        warnings.append("MLA: every TP rank stores the whole latent, so more TP does not shrink KV per token")
    elif model.mla is None and inputs.tensor_parallel_size > model.num_kv_heads:
        warnings.append(
            f"{model.num_kv_heads} KV heads on TP {inputs.tensor_parallel_size}: each head is replicated on "
            f"{inputs.tensor_parallel_size // model.num_kv_heads} GPUs"
        )
    most = max(f.max_concurrency for f in (at_max, at_request) if f)
    if most > MAX_NUM_SEQS_DEFAULT:
        warnings.append(
            f"{most:.0f} requests fit in KV: vLLM's --max-num-seqs (default {MAX_NUM_SEQS_DEFAULT}; 1024 on "
            "H100/H200/B200-class GPUs) caps running requests first"
        )
    report = CapacityReport(
        model=model,
        layout=layout,
        memory=budget,
        cache=cache,
        max_model_len=length,
        at_max_model_len=at_max,
        vllm_log_kv_cache_tokens=logged_kv_cache_tokens(at_max),
        at_request_tokens=at_request,
        recommended_max_model_len=recommended,
        min_concurrency=inputs.min_concurrency,
        max_model_len_for_min_concurrency=(
            max_len_for_concurrency(layout, cache, inputs.min_concurrency) if inputs.min_concurrency else None
        ),
        starts=at_max.fits,
        warnings=warnings,
    )
    report.startup_error = startup_error(report)
    report.advice = _advice(model, inputs, report)
    return report


def _gib(value: int) -> str:
    """vLLM's format_gib: GiB rounded to two decimals, as Python prints a float."""
    return f"{round(value / GIB, 2)}"


def startup_error(plan: CapacityReport) -> str | None:
    """vLLM's ValueError text when its KV cache cannot hold one max_model_len sequence, else None."""
    usable = plan.cache.bytes_per_gpu - plan.layout.bytes_per_block  # vLLM keeps one null block back
    if usable <= 0:
        return (
            "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
            "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
            "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
        )
    if plan.starts:
        return None
    longest = plan.cache.longest_servable_len
    estimate = f"Based on the available memory, the estimated maximum model length is {longest}. " if longest else ""
    return (
        f"To serve at least one request with the model's max seq len ({plan.max_model_len}), "
        f"({_gib(plan.at_max_model_len.kv_bytes_per_gpu)} GiB KV cache is needed, which is larger than the "
        f"available KV cache memory ({_gib(usable)} GiB). {estimate}Try increasing `gpu_memory_utilization` "
        "(which also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the "
        "engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
    )
