"""The plan: KV bytes/token, cache size, concurrency and max_model_len for one model on one server.

``plan_capacity`` splits each GPU's memory as vLLM's determine_available_memory does (budget,
weights, overhead, KV), sizes the pool with ``llmload.capacity.kv`` and says what to change when
the plan falls short.
"""

from __future__ import annotations

import math
from typing import get_args

from pydantic import BaseModel, Field, NonNegativeFloat, PositiveFloat, PositiveInt

from llmload.capacity.kv import (
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
from llmload.capacity.max_len import MaxLenCheck, allow_long_max_model_len, verify_max_model_len
from llmload.capacity.model import ModelSpec, estimate_parameters
from llmload.capacity.overhead import estimate_overhead
from llmload.errors import InputError
from llmload.models import AUTO_FIT, ServeConfig, Strict

# vLLM's --max-num-seqs default for the OpenAI server on most GPUs (engine/arg_utils.py).
MAX_NUM_SEQS_DEFAULT = 256
# vLLM's --dtype spellings that name the same dtype.
_DTYPE_ALIASES = {"float": "float32", "half": "float16"}


class CapacityInputs(Strict):
    """The server's vLLM settings (`serving`, None: vLLM's default) and what vLLM measures rather than is
    told (GPU memory, weights, overhead), with the question asked of the plan; sizes in GiB (2**30 bytes)."""

    serving: ServeConfig = ServeConfig()
    gpu_memory_gib: PositiveFloat | None = Field(default=None, description="total memory of one GPU")
    weights_gib: NonNegativeFloat | None = Field(default=None, description="whole model; None: estimate")
    overhead_gib: NonNegativeFloat | None = Field(
        default=None, description="per GPU, besides weights; None: estimated (llmload.capacity.overhead)"
    )
    request_tokens: PositiveInt | None = None
    min_concurrency: PositiveFloat | None = None

    @property
    def kv_cache_gib(self) -> float | None:
        """Per GPU, as --kv-cache-memory-bytes gives it."""
        given = self.serving.kv_cache_memory_bytes
        return None if given is None else given / GIB

    @property
    def dtype(self) -> ModelDtype:
        return self._modelled("dtype", get_args(ModelDtype))  # type: ignore[return-value]

    @property
    def kv_cache_dtype(self) -> KVCacheDtype:
        return self._modelled("kv_cache_dtype", get_args(KVCacheDtype))  # type: ignore[return-value]

    def _modelled(self, key: str, allowed: tuple[str, ...]) -> str:
        """A dtype setting by its canonical name; InputError, naming where it was set, when llmload cannot size it."""
        value = getattr(self.serving.resolved(), key)
        value = _DTYPE_ALIASES.get(value, value)
        if value not in allowed:
            raise InputError(
                f"{self.serving.origins.get(key, key)}: {key.replace('_', '-')} {value!r} is not modelled by llmload "
                f"(modelled: {', '.join(allowed)})"
            )
        return str(value)

    def layout(self, model: ModelSpec) -> KVLayout:
        """`model`'s KV page geometry under these settings (parallelism, dtypes, block size): the one
        place the serving settings become a `kv_layout`, for the plan and for a calibration's sizing alike."""
        vllm = self.serving.resolved()
        return kv_layout(
            model,
            tensor_parallel_size=vllm.tensor_parallel_size,
            pipeline_parallel_size=vllm.pipeline_parallel_size,
            dtype=self.dtype,
            kv_cache_dtype=self.kv_cache_dtype,
            block_size=vllm.block_size,
        )

    def changed(self, **settings: object) -> CapacityInputs:
        """These inputs with some vLLM settings changed (what-if advice)."""
        return self.model_copy(update={"serving": self.serving.model_copy(update=settings)})


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
    overhead_gib: float | None = Field(default=None, description="activation peak + non-torch memory")
    overhead_estimated: bool = Field(default=False, description="sized by llmload.capacity.overhead, not given")
    activation_gib: float | None = Field(default=None, description="estimated torch_peak_increase of the profile run")
    non_torch_gib: float | None = Field(default=None, description="estimated non_torch_increase (NCCL, cuBLAS)")
    profile_tokens: int | None = Field(default=None, description="tokens of vLLM's dummy forward pass")


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
    max_model_len_limit: int | None = Field(
        default=None, description="the longest max_model_len vLLM starts with for the model; None: any"
    )
    max_model_len_limit_key: str | None = Field(default=None, description="the config key that limit comes from")
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
    vllm = inputs.serving.resolved()
    requested = math.ceil(inputs.gpu_memory_gib * GIB * vllm.gpu_memory_utilization) / GIB
    params = None
    if inputs.weights_gib is None:
        params = estimate_parameters(model)
        per_param = model.weight_bytes_per_param or DTYPE_BYTES[resolve_dtype(model, inputs.dtype)]
        weights = params * per_param / GIB
    else:
        weights = inputs.weights_gib
    per_gpu = max(
        0.0,
        weights / (vllm.tensor_parallel_size * vllm.pipeline_parallel_size) - vllm.cpu_offload_gb,
    )
    overhead = inputs.overhead_gib
    estimate = None
    if overhead is None:
        given_len = inputs.serving.max_model_len
        estimate = estimate_overhead(
            model,
            activation_bytes=DTYPE_BYTES[resolve_dtype(model, inputs.dtype)],
            gpu_memory_gib=inputs.gpu_memory_gib,
            tensor_parallel_size=vllm.tensor_parallel_size,
            pipeline_parallel_size=vllm.pipeline_parallel_size,
            max_num_batched_tokens=vllm.max_num_batched_tokens,
            max_num_seqs=vllm.max_num_seqs,
            enable_chunked_prefill=vllm.enable_chunked_prefill,
            max_model_len=given_len if given_len and given_len > 0 else model.max_position_embeddings,
        )
        overhead = estimate.total_gib
    return MemoryBudget(
        kv_cache_gib=requested - per_gpu - overhead,
        kv_cache_explicit=False,
        gpu_memory_gib=inputs.gpu_memory_gib,
        gpu_memory_utilization=vllm.gpu_memory_utilization,
        requested_gib=requested,
        weights_gib=per_gpu,
        weights_estimated=params is not None,
        parameters=params,
        overhead_gib=overhead,
        overhead_estimated=estimate is not None,
        activation_gib=estimate.activation_gib if estimate else None,
        non_torch_gib=estimate.non_torch_gib if estimate else None,
        profile_tokens=estimate.profile_tokens if estimate else None,
    )


def _pool(model: ModelSpec, inputs: CapacityInputs) -> tuple[KVLayout, MemoryBudget, KVCache]:
    layout = inputs.layout(model)
    budget = _budget(model, inputs)
    return layout, budget, kv_cache_pool(layout, math.floor(budget.kv_cache_gib * GIB))


def _what_if(model: ModelSpec, inputs: CapacityInputs, max_model_len: int, **change: object) -> str:
    """Tokens and concurrency under one changed setting, for advice."""
    layout, _, cache = _pool(model, inputs.changed(**change))
    fit = capacity_for_request_tokens(layout, cache, max_model_len)
    return f"{cache.tokens:,} tokens, {fit.max_concurrency:.2f}x at {max_model_len:,}"


def _advice(model: ModelSpec, inputs: CapacityInputs, report: CapacityReport) -> list[str]:
    """What to change, only when the model refuses max_model_len or the KV cache falls short (no start, or below
    --min-concurrency); a scheduler refusal says its own remedy. No length advised exceeds the model's limit."""
    short_of_concurrency = (
        report.min_concurrency is not None and report.at_max_model_len.max_concurrency < report.min_concurrency
    )
    too_long = _length_check(model, inputs)[0].error is not None
    if report.at_max_model_len.fits and not short_of_concurrency and not too_long:
        return []
    length = report.max_model_len
    advice = []
    concurrency_length = report.max_model_len_for_min_concurrency
    concurrency = (
        f"--max-model-len {concurrency_length:,}{capped_note(report, concurrency_length)} gives "
        f"{report.min_concurrency:g}x concurrency at full length."
        if short_of_concurrency and concurrency_length
        else None
    )
    if too_long:  # past the model's positions, what the KV cache holds there does not matter
        advice.append(
            f"Lower --max-model-len to {report.recommended_max_model_len:,}"
            f"{capped_note(report, report.recommended_max_model_len) or ' (the longest that fits)'}: vLLM refuses "
            f"a longer one than the model's {report.max_model_len_limit_key} unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1, "
            "and positions past it give NaN (RoPE) or out-of-bounds errors."
        )
        return advice + ([concurrency] if concurrency else [])
    if report.cache.longest_servable_len == 0:
        advice.append(
            "No memory is left for even one KV block (vLLM: 'No available memory for the cache blocks'): "
            "use more GPUs, a quantized checkpoint, or a larger --gpu-memory-utilization."
        )
    elif not report.at_max_model_len.fits:
        recommended = report.recommended_max_model_len
        note = capped_note(report, recommended) or " (the longest that fits)"
        advice.append(f"Lower --max-model-len to {recommended:,}{note}.")
    if concurrency:
        advice.append(concurrency)
    if report.layout.dtype_bytes > 1:
        advice.append(
            f"--kv-cache-dtype fp8 halves bytes per token: {_what_if(model, inputs, length, kv_cache_dtype='fp8')}."
        )
    if not report.memory.kv_cache_explicit:
        vllm = inputs.serving.resolved()
        if vllm.gpu_memory_utilization < 0.95:
            advice.append(
                f"--gpu-memory-utilization 0.95: {_what_if(model, inputs, length, gpu_memory_utilization=0.95)}."
            )
        tp = 2 * vllm.tensor_parallel_size
        if model.num_attention_heads % tp == 0 and (model.mla is not None or model.num_kv_heads % tp == 0):
            advice.append(f"--tensor-parallel-size {tp}: {_what_if(model, inputs, length, tensor_parallel_size=tp)}.")
    return advice


def plan_capacity(model: ModelSpec, inputs: CapacityInputs) -> CapacityReport:
    """KV bytes/token, cache size, concurrency and max_model_len for one model on one server."""
    layout, budget, cache = _pool(model, inputs)
    tp = inputs.serving.resolved().tensor_parallel_size
    check, limit, limit_key = _length_check(model, inputs)
    recommended = _capped(cache.longest_servable_len, limit)
    length = recommended if inputs.serving.max_model_len == AUTO_FIT else check.max_model_len
    at_max = capacity_for_request_tokens(layout, cache, length)
    scheduler_refusal = _scheduler_error(inputs.serving, length)
    at_request = capacity_for_request_tokens(layout, cache, inputs.request_tokens) if inputs.request_tokens else None
    warnings = [*model.notes, *check.warnings]
    if budget.weights_estimated:
        warnings.append(
            f"weights estimated from the config: {budget.parameters or 0:,} parameters; pass --weights-gib "
            "(vLLM logs 'Model loading took X GiB') for the real size"
        )
    if inputs.kv_cache_gib is not None and inputs.gpu_memory_gib is not None:
        warnings.append(
            "--kv-cache-gib given: the GPU memory budget is ignored, as vLLM does with --kv-cache-memory-bytes"
        )
    if model.mla is not None and tp > 1:
        warnings.append("MLA: every TP rank stores the whole latent, so more TP does not shrink KV per token")
    elif model.mla is None and tp > model.num_kv_heads:
        warnings.append(
            f"{model.num_kv_heads} KV heads on TP {tp}: each head is replicated on {tp // model.num_kv_heads} GPUs"
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
        max_model_len_limit=limit,
        max_model_len_limit_key=limit_key,
        min_concurrency=inputs.min_concurrency,
        max_model_len_for_min_concurrency=(
            _capped(max_len_for_concurrency(layout, cache, inputs.min_concurrency), limit)
            if inputs.min_concurrency
            else None
        ),
        starts=at_max.fits and scheduler_refusal is None and check.error is None,
        warnings=warnings,
    )
    # vLLM checks the length against the model's config first (ModelConfig), the scheduler's budget next.
    report.startup_error = check.error or startup_error(report) or scheduler_refusal
    report.advice = _advice(model, inputs, report)
    return report


def _length_check(model: ModelSpec, inputs: CapacityInputs) -> tuple[MaxLenCheck, int | None, str | None]:
    """vLLM's verdict on the server's --max-model-len for the model (llmload/capacity/max_len.py, after
    vllm/config/model.py ``_get_and_verify_max_len``, with VLLM_ALLOW_LONG_MAX_MODEL_LEN read from this
    process's environment as vllm/envs.py reads it), the longest length it accepts (None: any) and the
    config key that sets it."""
    not_modelled = inputs.serving.not_modelled  # keyed as the reader spells vLLM's flags: dashes
    disable = any(not_modelled.get(k) is True for k in ("disable-sliding-window", "disable_sliding_window"))
    limit = model.context_limit
    check = verify_max_model_len(
        limit, inputs.serving.max_model_len, disable_sliding_window=disable, allow_long=allow_long_max_model_len()
    )
    longest = limit.longest_accepted(disable_sliding_window=disable)
    return check, longest, limit.limiting_key(disable_sliding_window=disable) if longest is not None else None


def _capped(length: int, limit: int | None) -> int:
    """A recommended max_model_len, no longer than the model's limit."""
    return length if limit is None else min(length, limit)


def capped_note(report: CapacityReport, length: int | None) -> str:
    """' (capped at the model's limit of 4,096 (max_position_embeddings))' when `length` is the model's limit
    rather than what the KV cache holds, else ''."""
    limit = report.max_model_len_limit
    if length is None or limit is None or length != limit or report.cache.longest_servable_len <= limit:
        return ""
    return f" (capped at the model's limit of {limit:,} ({report.max_model_len_limit_key}))"


def _scheduler_error(serving: ServeConfig, max_model_len: int) -> str | None:
    """vLLM's SchedulerConfig ValueError: without chunked prefill a prompt is prefilled in one step, so a
    step's token budget must hold the longest sequence (unset, vLLM raises the budget to it itself)."""
    budget = serving.max_num_batched_tokens
    if serving.enable_chunked_prefill is not False or budget is None or budget >= max_model_len:
        return None
    return (
        f"max_num_batched_tokens ({budget}) is smaller than max_model_len ({max_model_len}). This effectively "
        "limits the maximum sequence length to max_num_batched_tokens and makes vLLM reject longer sequences. "
        "Please increase max_num_batched_tokens or decrease max_model_len."
    )


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
    if plan.at_max_model_len.fits:
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
