"""KV-cache capacity planning for vLLM: bytes per token, blocks, concurrency, max_model_len.

The arithmetic mirrors vLLM 0.32 itself (page sizes in ``vllm/v1/kv_cache_interface.py``, block
counts, the startup check and the logged capacity in ``vllm/v1/core/kv_cache_utils.py``), so the
figures match the lines vLLM prints at startup; docs/capacity.md explains each formula. Pure
computation and result models first, then the startup-log explainer, then text rendering. File
and command-line handling live in ``llmload.capacity_cli``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from llmload.models import Strict

GIB = 1 << 30
# vLLM 0.32 defaults: CacheConfig.gpu_memory_utilization and CacheConfig.DEFAULT_BLOCK_SIZE (GPU;
# the CPU backend uses 128, FlashMLA 64).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92
DEFAULT_BLOCK_SIZE = 16
# Per-GPU reserve for what vLLM's profiling run measures besides weights: the activation peak
# (grows with --max-num-batched-tokens), CUDA graphs and non-torch memory (NCCL, cuBLAS).
DEFAULT_OVERHEAD_GIB = 2.0
# vLLM's --max-num-seqs default for the OpenAI server on most GPUs (engine/arg_utils.py).
MAX_NUM_SEQS_DEFAULT = 256

ModelDtype = Literal["auto", "float32", "float16", "bfloat16"]
KVCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
_DTYPE_ALIASES = {"float": "float32", "half": "float16", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# vLLM's ModelArchConfigConvertor.get_total_num_kv_heads order; absent → MHA (= attention heads).
_KV_HEAD_KEYS = ("n_head_kv", "num_kv_heads", "num_key_value_heads", "multi_query_group_num")
_EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
# Config keys of state-space / linear-attention hybrids, whose cache is not per-token KV.
_HYBRID_KEYS = (
    "layers_block_type",
    "hybrid_override_pattern",
    "mamba_d_state",
    "ssm_state_size",
    "linear_num_value_heads",
)


class CapacityInputError(ValueError):
    """Input the planner cannot use (bad config, unknown model, impossible sizes): CLI exit 2."""


# --------------------------------------------------------------------------- model description


class MLAConfig(Strict):
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): one compressed latent per token."""

    kv_lora_rank: PositiveInt
    qk_rope_head_dim: PositiveInt
    qk_nope_head_dim: NonNegativeInt
    v_head_dim: PositiveInt
    q_lora_rank: PositiveInt | None


class MoEConfig(Strict):
    num_experts: PositiveInt
    experts_per_token: PositiveInt | None
    moe_intermediate_size: PositiveInt
    shared_intermediate_size: NonNegativeInt = Field(description="summed width of the always-on shared expert(s)")
    first_dense_layers: NonNegativeInt = Field(description="leading layers with a dense MLP (first_k_dense_replace)")


class ModelSpec(Strict):
    """What capacity needs from a HF config.json (the text model's, for multimodal configs)."""

    name: str
    source: str
    model_type: str | None
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_attention_heads: PositiveInt
    num_kv_heads: PositiveInt
    head_dim: PositiveInt
    intermediate_size: PositiveInt
    vocab_size: PositiveInt
    tie_word_embeddings: bool
    dtype: str = Field(description="the config's dtype/torch_dtype; float32 when absent, as in vLLM")
    max_position_embeddings: PositiveInt | None
    weight_bytes_per_param: PositiveFloat | None = Field(description="from quantization_config; None: dtype size")
    mla: MLAConfig | None = None
    moe: MoEConfig | None = None
    notes: list[str] = Field(default_factory=list)

    @property
    def attention(self) -> str:
        if self.mla is not None:
            return "MLA"
        if self.num_kv_heads == self.num_attention_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"


def _normalize_dtype(value: str, where: str) -> str:
    name = _DTYPE_ALIASES.get(value.removeprefix("torch."), value.removeprefix("torch."))
    if name not in ("float32", "float16", "bfloat16"):
        raise CapacityInputError(f"{where}: unsupported dtype {value!r} (float32, float16 or bfloat16)")
    return name


def _int_field(cfg: Mapping[str, object], keys: tuple[str, ...], source: str) -> int | None:
    """First of ``keys`` holding a positive int; None/0 count as absent (as vLLM treats head_dim 0)."""
    for key in keys:
        value = cfg.get(key)
        if value is None or value == 0:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise CapacityInputError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
        return value
    return None


def _required_int(cfg: Mapping[str, object], keys: tuple[str, ...], source: str, why: str) -> int:
    value = _int_field(cfg, keys, source)
    if value is None:
        raise CapacityInputError(f"{source}: missing field {keys[0]!r} ({why})")
    return value


def _weight_bytes_per_param(quant: object, source: str, notes: list[str]) -> float | None:
    """Bytes per weight from ``quantization_config``: fp8 → 1, GPTQ/AWQ ``bits`` → bits/8."""
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "?"))
    bits = quant.get("bits")
    if isinstance(bits, int) and bits > 0:
        return bits / 8
    if "fp8" in method:
        return 1.0
    notes.append(f"{source}: quantization {method!r} not understood; weights estimated at the dtype's size")
    return None


def model_spec_from_config(config: Mapping[str, object], *, name: str, source: str) -> ModelSpec:
    """Read a HF config.json dict as vLLM does (``text_config`` first for multimodal models)."""
    text = config.get("text_config")
    cfg: Mapping[str, object] = text if isinstance(text, Mapping) else config
    where = f"{source} (text_config)" if cfg is not config else source
    hybrid = [k for k in _HYBRID_KEYS if cfg.get(k) is not None]
    layer_types = cfg.get("layer_types")
    kinds = set(layer_types) if isinstance(layer_types, list) else set()
    if hybrid or kinds - {"full_attention", "sliding_attention"}:
        what = ", ".join(hybrid) or f"layer_types {sorted(kinds - {'full_attention', 'sliding_attention'})}"
        raise CapacityInputError(
            f"{where}: hybrid state-space/linear-attention model ({what}) is not supported: vLLM pads its "
            "state pages to the attention page size, so per-token KV arithmetic does not apply. "
            "Start vLLM once and run `llmload capacity --vllm-log` on its log instead."
        )
    notes: list[str] = []
    if "sliding_attention" in kinds or (cfg.get("sliding_window") and cfg.get("use_sliding_window", True)):
        notes.append(
            f"{where}: sliding-window layers are counted as full attention, an upper bound (vLLM's hybrid "
            "KV-cache manager keeps only the window for them)"
        )
    layers = _required_int(cfg, ("num_hidden_layers", "n_layer", "num_layers"), where, "number of layers")
    hidden = _required_int(cfg, ("hidden_size", "d_model", "n_embd"), where, "model width")
    heads = _required_int(cfg, ("num_attention_heads", "n_head"), where, "attention heads")
    kv_heads = _int_field(cfg, _KV_HEAD_KEYS, where) or heads
    head_dim = _int_field(cfg, ("head_dim",), where) or hidden // heads
    mla = None
    if cfg.get("kv_lora_rank") is not None:
        mla = MLAConfig(
            kv_lora_rank=_required_int(cfg, ("kv_lora_rank",), where, "MLA latent width"),
            qk_rope_head_dim=_required_int(cfg, ("qk_rope_head_dim",), where, "MLA rope width"),
            qk_nope_head_dim=_int_field(cfg, ("qk_nope_head_dim",), where) or 0,
            v_head_dim=_int_field(cfg, ("v_head_dim",), where) or head_dim,
            q_lora_rank=_int_field(cfg, ("q_lora_rank",), where),
        )
    intermediate = _required_int(cfg, ("intermediate_size", "ffn_dim", "n_inner"), where, "MLP width")
    moe = None
    experts = _int_field(cfg, _EXPERT_KEYS, where)
    if experts:
        expert_width = _int_field(cfg, ("moe_intermediate_size",), where) or intermediate
        shared = (_int_field(cfg, ("n_shared_experts",), where) or 0) * expert_width
        moe = MoEConfig(
            num_experts=experts,
            experts_per_token=_int_field(cfg, ("num_experts_per_tok", "num_experts_per_token", "moe_topk"), where),
            moe_intermediate_size=expert_width,
            shared_intermediate_size=shared or _int_field(cfg, ("shared_expert_intermediate_size",), where) or 0,
            first_dense_layers=_int_field(cfg, ("first_k_dense_replace",), where) or 0,
        )
    raw_dtype = next(
        (d for d in (config.get("dtype"), config.get("torch_dtype"), cfg.get("dtype"), cfg.get("torch_dtype")) if d),
        "float32",
    )
    return ModelSpec(
        name=name,
        source=source,
        model_type=str(cfg.get("model_type")) if cfg.get("model_type") else None,
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=_required_int(cfg, ("vocab_size",), where, "embedding rows"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
        dtype=_normalize_dtype(str(raw_dtype), where),
        max_position_embeddings=_int_field(cfg, ("max_position_embeddings", "max_seq_len", "n_positions"), where),
        weight_bytes_per_param=_weight_bytes_per_param(
            config.get("quantization_config", cfg.get("quantization_config")), where, notes
        ),
        mla=mla,
        moe=moe,
        notes=notes,
    )


def estimate_parameters(model: ModelSpec) -> int:
    """Parameter count from the config: embeddings, attention (GQA/MLA), gated MLPs incl. experts.

    Norms and biases are left out (well under 0.1%), so it is an estimate, close to the published
    counts (Llama-3.1-8B 8.03 B, Mixtral-8x7B 46.7 B, DeepSeek-V3 671 B).
    """
    h, heads = model.hidden_size, model.num_attention_heads
    embeddings = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    if model.mla is not None:
        m = model.mla
        qk_dim = m.qk_nope_head_dim + m.qk_rope_head_dim
        q_proj = h * m.q_lora_rank + m.q_lora_rank * heads * qk_dim if m.q_lora_rank else h * heads * qk_dim
        kv_proj = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * heads * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        attention = q_proj + kv_proj + heads * m.v_head_dim * h
    else:
        attention = h * model.head_dim * (2 * heads + 2 * model.num_kv_heads)
    dense_mlp = 3 * h * model.intermediate_size  # gate, up, down
    if model.moe is None:
        return embeddings + model.num_layers * (attention + dense_mlp)
    moe = model.moe
    moe_mlp = 3 * h * (moe.num_experts * moe.moe_intermediate_size + moe.shared_intermediate_size) + h * moe.num_experts
    dense_layers = min(moe.first_dense_layers, model.num_layers)
    return (
        embeddings
        + model.num_layers * attention
        + dense_layers * dense_mlp
        + (model.num_layers - dense_layers) * moe_mlp
    )


# --------------------------------------------------------------------------- KV arithmetic


class KVLayout(BaseModel):
    """One GPU's KV page geometry (vLLM's AttentionSpec / MLAAttentionSpec for every layer)."""

    attention: str
    layers: int
    tensor_parallel_size: int
    kv_heads_per_gpu: int
    head_size: int = Field(description="K width per head (the latent width for MLA)")
    head_size_v: int = Field(description="V width per head; 0 for MLA, which stores one latent vector")
    dtype: str = Field(description="KV cache element type")
    dtype_bytes: int
    block_size: int
    bytes_per_token: int = Field(description="per GPU, all layers")
    bytes_per_block: int = Field(description="per GPU, all layers: one page of block_size tokens")
    bytes_per_token_model: int = Field(description="the whole model's KV per token, each head counted once")
    bytes_per_token_all_gpus: int = Field(description="summed over the TP group (replicated heads count twice)")
    naive_bytes_per_token: int = Field(description="2 × layers × hidden_size × bytes: ignores GQA/MLA")


def resolve_dtype(model: ModelSpec, dtype: ModelDtype = "auto") -> str:
    """vLLM's ``--dtype auto``: the config's dtype, but float32 checkpoints run in bfloat16."""
    if dtype != "auto":
        return dtype
    return "bfloat16" if model.dtype == "float32" else model.dtype


def kv_layout(
    model: ModelSpec,
    *,
    tensor_parallel_size: int = 1,
    dtype: ModelDtype = "auto",
    kv_cache_dtype: KVCacheDtype = "auto",
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> KVLayout:
    """Bytes per token and per block on one GPU.

    Per layer a token stores K and V for each KV head on this rank: ``(head + head_v) × bytes ×
    kv_heads // TP`` (at least one head: vLLM replicates KV heads when TP exceeds them). MLA stores
    one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, not split across TP ranks.
    """
    tp = tensor_parallel_size
    if tp < 1 or block_size < 1:
        raise CapacityInputError("tensor_parallel_size and block_size must be positive")
    if model.num_attention_heads % tp:
        raise CapacityInputError(
            f"{model.name}: vLLM needs num_attention_heads ({model.num_attention_heads}) divisible by "
            f"tensor_parallel_size ({tp})"
        )
    if model.mla is None and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise CapacityInputError(
            f"{model.name}: {model.num_kv_heads} KV heads cannot be split or replicated evenly over "
            f"tensor_parallel_size {tp}"
        )
    cache_dtype = resolve_dtype(model, dtype) if kv_cache_dtype == "auto" else kv_cache_dtype
    nbytes = DTYPE_BYTES[cache_dtype]
    if model.mla is not None:
        heads, k, v = 1, model.mla.kv_lora_rank + model.mla.qk_rope_head_dim, 0
    else:
        heads, k, v = max(1, model.num_kv_heads // tp), model.head_dim, model.head_dim
    per_token = model.num_layers * heads * (k + v) * nbytes
    model_heads = 1 if model.mla is not None else model.num_kv_heads
    return KVLayout(
        attention=model.attention,
        layers=model.num_layers,
        tensor_parallel_size=tp,
        kv_heads_per_gpu=heads,
        head_size=k,
        head_size_v=v,
        dtype=cache_dtype,
        dtype_bytes=nbytes,
        block_size=block_size,
        bytes_per_token=per_token,
        bytes_per_block=per_token * block_size,
        bytes_per_token_model=model.num_layers * model_heads * (k + v) * nbytes,
        bytes_per_token_all_gpus=per_token * tp,
        naive_bytes_per_token=2 * model.num_layers * model.hidden_size * nbytes,
    )


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks one request of ``tokens`` occupies: whole pages only."""
    return -(-tokens // block_size)


def longest_servable_len(kv_cache_bytes: int, layout: KVLayout) -> int:
    """vLLM's "estimated maximum model length": whole blocks, after the null block it keeps back."""
    usable = kv_cache_bytes - layout.bytes_per_block
    return max(0, usable // layout.bytes_per_block) * layout.block_size


class KVCache(BaseModel):
    """One GPU's KV pool; every rank holds the same tokens (its share of the heads)."""

    bytes_per_gpu: int
    num_blocks: int
    tokens: int = Field(description="num_blocks × block_size, the physical capacity")
    longest_servable_len: int = Field(description="the longest single sequence vLLM will accept")


def kv_cache_pool(layout: KVLayout, kv_cache_bytes: int) -> KVCache:
    """``num_blocks = memory // bytes_per_block`` as in vLLM's get_kv_cache_config_from_groups."""
    blocks = max(0, kv_cache_bytes) // layout.bytes_per_block
    return KVCache(
        bytes_per_gpu=max(0, kv_cache_bytes),
        num_blocks=blocks,
        tokens=blocks * layout.block_size,
        longest_servable_len=longest_servable_len(kv_cache_bytes, layout),
    )


class RequestFit(BaseModel):
    tokens: int = Field(description="tokens per request (prompt + output)")
    blocks: int
    kv_bytes_per_gpu: int = Field(description="what vLLM reports as 'GiB KV cache is needed'")
    max_concurrency: float = Field(description="vLLM's 'Maximum concurrency for N tokens per request'")
    fits: bool = Field(description="one such request passes vLLM's startup check")


def capacity_for_request_tokens(layout: KVLayout, cache: KVCache, request_tokens: int) -> RequestFit:
    """How many requests of ``request_tokens`` (e.g. a workload's P99) the KV cache holds at once.

    vLLM counts whole blocks: ``num_blocks / ceil(tokens / block_size)``.
    """
    if request_tokens < 1:
        raise CapacityInputError(f"request tokens must be positive, got {request_tokens}")
    blocks = blocks_for(request_tokens, layout.block_size)
    return RequestFit(
        tokens=request_tokens,
        blocks=blocks,
        kv_bytes_per_gpu=blocks * layout.bytes_per_block,
        max_concurrency=cache.num_blocks / blocks,
        fits=request_tokens <= cache.longest_servable_len,
    )


def logged_kv_cache_tokens(fit: RequestFit) -> int:
    """The N of vLLM's "KV cache size: N tokens": ``int(concurrency × max_model_len)``.

    Below ``num_blocks × block_size`` when max_model_len is not a block multiple.
    """
    return int(fit.max_concurrency * fit.tokens)


def max_len_for_concurrency(layout: KVLayout, cache: KVCache, concurrency: float) -> int:
    """Largest block-multiple length with at least ``concurrency`` full-length requests in cache."""
    blocks = math.floor(cache.num_blocks / concurrency)
    return min(blocks * layout.block_size, cache.longest_servable_len)


# --------------------------------------------------------------------------- the plan


class CapacityInputs(Strict):
    """Serving settings, named after vLLM's flags; sizes in GiB (2**30 bytes)."""

    tensor_parallel_size: PositiveInt = 1
    gpu_memory_gib: PositiveFloat | None = Field(default=None, description="total memory of one GPU")
    gpu_memory_utilization: float = Field(default=DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1)
    weights_gib: NonNegativeFloat | None = Field(default=None, description="whole model; None: estimate")
    overhead_gib: NonNegativeFloat = Field(default=DEFAULT_OVERHEAD_GIB, description="per GPU, besides weights")
    kv_cache_gib: PositiveFloat | None = Field(default=None, description="per GPU, like --kv-cache-memory-bytes")
    dtype: ModelDtype = "auto"
    kv_cache_dtype: KVCacheDtype = "auto"
    block_size: PositiveInt = DEFAULT_BLOCK_SIZE
    max_model_len: PositiveInt | None = None
    request_tokens: PositiveInt | None = None
    min_concurrency: PositiveFloat | None = None


class MemoryBudget(BaseModel):
    """Per-GPU memory, as vLLM's determine_available_memory splits it (GiB)."""

    kv_cache_gib: float
    kv_cache_explicit: bool = Field(description="given as --kv-cache-gib rather than derived")
    gpu_memory_gib: float | None = None
    gpu_memory_utilization: float | None = None
    requested_gib: float | None = Field(default=None, description="ceil(total × utilization)")
    weights_gib: float | None = Field(default=None, description="per GPU (whole model / TP)")
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
    warnings: list[str] = Field(default_factory=list)
    advice: list[str] = Field(default_factory=list)


def _budget(model: ModelSpec, inputs: CapacityInputs) -> MemoryBudget:
    if inputs.kv_cache_gib is not None:
        return MemoryBudget(kv_cache_gib=inputs.kv_cache_gib, kv_cache_explicit=True)
    if inputs.gpu_memory_gib is None:
        raise CapacityInputError("give --gpu-memory-gib (memory of one GPU) or --kv-cache-gib (KV memory per GPU)")
    requested = math.ceil(inputs.gpu_memory_gib * GIB * inputs.gpu_memory_utilization) / GIB
    params = None
    if inputs.weights_gib is None:
        params = estimate_parameters(model)
        per_param = model.weight_bytes_per_param or DTYPE_BYTES[resolve_dtype(model, inputs.dtype)]
        weights = params * per_param / GIB
    else:
        weights = inputs.weights_gib
    per_gpu = weights / inputs.tensor_parallel_size
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
    length = inputs.max_model_len or model.max_position_embeddings
    if length is None:
        raise CapacityInputError(f"{model.source}: no max_position_embeddings; give --max-model-len")
    at_max = capacity_for_request_tokens(layout, cache, length)
    at_request = capacity_for_request_tokens(layout, cache, inputs.request_tokens) if inputs.request_tokens else None
    longest = cache.longest_servable_len
    recommended = min(longest, model.max_position_embeddings or longest)
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
    report.advice = _advice(model, inputs, report)
    return report


# --------------------------------------------------------------------------- startup-log explainer

LogKind = Literal[
    "kv_cache_size",
    "max_concurrency",
    "available_kv_memory",
    "model_loading",
    "kv_memory_set",
    "max_len_too_long",
    "max_len_over_kv_tokens",
    "auto_fit",
    "no_cache_memory",
    "node_memory",
    "device_memory",
]
_FAILURES = frozenset({"max_len_too_long", "max_len_over_kv_tokens", "no_cache_memory", "node_memory", "device_memory"})
LogValue = int | float | str


class LogFinding(BaseModel):
    line_no: int
    kind: LogKind
    text: str = Field(description="the message, without the logger prefix")
    values: dict[str, LogValue]
    meaning: str


class LogExplanation(BaseModel):
    source: str
    findings: list[LogFinding]
    settings: dict[str, LogValue] = Field(description="from 'non-default args' / the engine config line")
    failed: bool = Field(description="the log shows a KV-cache startup failure")
    implied_bytes_per_token: float | None = None
    implied_bytes_per_token_basis: str | None = None
    advice: list[str] = Field(default_factory=list)


def _num(text: str) -> int | float:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


@dataclass(frozen=True)
class _Pattern:
    kind: LogKind
    regex: re.Pattern[str]
    meaning: Callable[[dict[str, LogValue]], str]


_N = r"[\d,]+(?:\.\d+)?"
_PATTERNS = (
    _Pattern(
        "kv_cache_size",
        re.compile(rf"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_N}) tokens"),
        lambda v: (
            f"the {v['pool']} KV cache holds {v['tokens']:,} tokens; vLLM prints concurrency × max_model_len, "
            "which is blocks × block_size when max_model_len is a block multiple"
        ),
    ),
    _Pattern(
        "max_concurrency",
        re.compile(rf"Maximum concurrency for (?P<request_tokens>{_N}) tokens per request: (?P<concurrency>{_N})x"),
        lambda v: (
            f"{v['concurrency']:.2f}x requests of {v['request_tokens']:,} tokens fit at once, counted in whole blocks "
            f"(blocks ÷ ⌈{v['request_tokens']:,} / block_size⌉); shorter requests fit more"
        ),
    ),
    _Pattern(
        "available_kv_memory",
        re.compile(rf"Available KV cache memory: (?P<available_kv_gib>{_N}) ?GiB"),
        lambda v: f"{v['available_kv_gib']} GiB per GPU is left for KV after weights, activation peak and CUDA graphs",
    ),
    _Pattern(
        "model_loading",
        re.compile(rf"Model loading took (?P<weights_gib>{_N}) ?GiB"),
        lambda v: f"the weights take {v['weights_gib']} GiB per GPU",
    ),
    _Pattern(
        "kv_memory_set",
        re.compile(
            rf"(?P<how>Explicitly|Auto) set \((?P<kv_set_gib>{_N})/(?P<node_total_gib>{_N})\) GiB for KV cache "
            r"on node (?P<node>\d+)"
        ),
        lambda v: (
            f"{str(v['how']).lower()} set {v['kv_set_gib']} GiB (of {v['node_total_gib']} GiB on NUMA node "
            f"{v['node']}) for the KV cache"
        ),
    ),
    _Pattern(
        "max_len_too_long",
        re.compile(
            rf"max seq len \((?P<max_model_len>\d+)\), \((?P<needed_gib>{_N}) GiB KV cache is needed, which is "
            rf"larger than the available KV cache memory \((?P<available_gib>{_N}) GiB\)"
            r"(?:.*?estimated maximum model length is (?P<estimated_max_len>\d+))?"
        ),
        lambda v: (
            f"one {v['max_model_len']:,}-token request needs {v['needed_gib']} GiB of KV per GPU, more than the "
            f"{v['available_gib']} GiB available, so vLLM refuses to start"
            + (f"; the longest that fits is {v['estimated_max_len']:,}" if "estimated_max_len" in v else "")
        ),
    ),
    _Pattern(
        "max_len_over_kv_tokens",
        re.compile(
            r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be "
            r"stored in KV cache \((?P<kv_tokens>\d+)\)"
        ),
        lambda v: (
            f"max_model_len {v['max_model_len']:,} exceeds the {v['kv_tokens']:,} tokens the KV cache holds, "
            "so vLLM refuses to start"
        ),
    ),
    _Pattern(
        "auto_fit",
        re.compile(r"Auto-fit max_model_len: reduced from (?P<derived_max_len>\d+) to (?P<max_model_len>\d+)"),
        lambda v: (
            f"--max-model-len -1 chose {v['max_model_len']:,}, the longest that fits (the model allows "
            f"{v['derived_max_len']:,})"
        ),
    ),
    _Pattern(
        "no_cache_memory",
        re.compile(r"No available memory for the cache blocks"),
        lambda v: "after weights and activations nothing (or at most the one reserved null block) is left for KV",
    ),
    _Pattern(
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
    ),
    _Pattern(
        "device_memory",
        re.compile(
            rf"Free memory on device (?:\S+ )?\((?P<free_gib>{_N})/(?P<total_gib>{_N}) GiB\) on startup is less "
            rf"than desired GPU memory utilization \((?P<utilization>{_N}), (?P<requested_gib>{_N}) GiB\)"
        ),
        lambda v: (
            f"only {v['free_gib']} of {v['total_gib']} GiB is free on the GPU, less than utilization "
            f"{v['utilization']} asks for ({v['requested_gib']} GiB): another process holds GPU memory"
        ),
    ),
)
_SETTINGS_LINE = re.compile(r"non-default args:|Initializing a V1 LLM engine")
_SETTING = re.compile(
    r"(?<![\w])['\"]?(?P<key>max_model_len|max_seq_len|kv_cache_memory_bytes|gpu_memory_utilization|"
    r"tensor_parallel_size|kv_cache_dtype|block_size|device_config)['\"]?\s*[:=]\s*['\"]?(?P<value>[\w.]+)"
)
_MESSAGE_START = re.compile(r"^.*?\] (?:\w+Error: )?|^\w+Error: ")


def _settings(lines: Iterable[str]) -> dict[str, LogValue]:
    found: dict[str, LogValue] = {}
    for line in lines:
        if _SETTINGS_LINE.search(line):
            for m in _SETTING.finditer(line):
                key = "max_model_len" if m["key"] == "max_seq_len" else m["key"]
                value = m["value"]
                found.setdefault(key, _num(value) if re.fullmatch(r"[\d.]+", value) else value)
    return found


def _implied_bytes_per_token(
    facts: dict[str, LogValue], settings: dict[str, LogValue], block_size: int
) -> tuple[float | None, str | None]:
    """KV bytes per token (per GPU) from whichever numbers the log gives, most exact first."""
    kv_bytes = settings.get("kv_cache_memory_bytes")
    tokens, length = facts.get("tokens"), facts.get("request_tokens")
    physical = None
    if isinstance(tokens, int) and isinstance(length, int):
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
    if isinstance(available, float) and physical:
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


def _log_advice(
    facts: dict[str, LogValue], kinds: set[str], settings: dict[str, LogValue], bpt: float | None, block_size: int
) -> list[str]:
    advice: list[str] = []
    kv_dtype = str(settings.get("kv_cache_dtype", "auto"))
    tp = settings.get("tensor_parallel_size")
    tp = tp if isinstance(tp, int) else 1
    estimated = facts.get("estimated_max_len") or facts.get("kv_tokens")
    if isinstance(estimated, int) and estimated > 0:
        limit = estimated // block_size * block_size
        advice.append(f"Lower --max-model-len to {limit:,} or less (the longest that fits this KV memory).")
    length = facts.get("max_model_len")
    if kinds & {"max_len_too_long", "max_len_over_kv_tokens"} and isinstance(length, int):
        if "kv_cache_memory_bytes" in settings and bpt:
            blocks = blocks_for(length, block_size) + 1  # + vLLM's null block
            need = math.ceil(blocks * block_size * bpt)
            advice.append(
                f"Or raise --kv-cache-memory-bytes to at least {need:,} ({blocks} blocks of {block_size} tokens: "
                f"{length:,} tokens plus the null block)."
            )
        else:
            advice.append("Or give KV more memory: raise --gpu-memory-utilization, or free memory on the GPU.")
    if kinds & {"max_len_too_long", "max_len_over_kv_tokens"}:
        if not kv_dtype.startswith("fp8"):
            advice.append("--kv-cache-dtype fp8 halves bytes per token, doubling the tokens that fit.")
        advice.append(
            f"--tensor-parallel-size {2 * tp} splits KV heads and weights over twice the GPUs "
            "(not the KV of MLA models, which every rank stores whole)."
        )
    if "no_cache_memory" in kinds:
        advice.append(
            "Weights and activations use all of gpu_memory_utilization × memory: raise --gpu-memory-utilization, "
            "use a quantized checkpoint or more GPUs; on CPU, --kv-cache-memory-bytes must exceed one block "
            f"({block_size} tokens × bytes per token), which vLLM keeps as the null block."
        )
    for kind, free, total in (
        ("node_memory", "node_free_gib", "node_total_gib"),
        ("device_memory", "free_gib", "total_gib"),
    ):
        if kind in kinds and isinstance(facts.get(free), float) and isinstance(facts.get(total), float):
            ceiling = float(facts[free]) / float(facts[total])
            advice.append(
                f"Lower --gpu-memory-utilization below {ceiling:.2f} (free / total), or set --kv-cache-memory-bytes "
                "explicitly (CPU: VLLM_CPU_KVCACHE_SPACE); on CPU the flag is the share of the NUMA node's RAM."
            )
    if not kinds & _FAILURES and isinstance(facts.get("tokens"), int):
        advice.append(
            f"Concurrency is quoted for full-length requests; for your workload's P99 request it is about "
            f"{facts['tokens']:,} / P99 tokens: `llmload capacity --model-config ... --request-tokens P99`."
        )
    return advice


def explain_vllm_log(text: str, *, source: str = "<log>") -> LogExplanation:
    """Find vLLM's KV-cache lines and errors in a startup log; say what they mean and what to change."""
    lines = text.splitlines()
    findings: list[LogFinding] = []
    seen: set[tuple[str, str]] = set()
    facts: dict[str, LogValue] = {}
    for line_no, line in enumerate(lines, 1):
        for pattern in _PATTERNS:
            m = pattern.regex.search(line)
            if m is None:
                continue
            values: dict[str, LogValue] = {
                k: v if k in ("pool", "how") else _num(v) for k, v in m.groupdict().items() if v is not None
            }
            message = _MESSAGE_START.sub("", line, count=1).strip()
            if (pattern.kind, message) in seen:  # errors are printed twice: engine traceback, then re-raised
                continue
            seen.add((pattern.kind, message))
            findings.append(
                LogFinding(
                    line_no=line_no, kind=pattern.kind, text=message, values=values, meaning=pattern.meaning(values)
                )
            )
            facts.update(values)
    settings = _settings(lines)
    kinds: set[str] = {f.kind for f in findings}
    cpu = (
        "CPU" in str(facts.get("pool", ""))
        or "cpu" in str(settings.get("device_config", ""))
        or bool(kinds & {"kv_memory_set", "node_memory"})
    )
    logged_block_size = settings.get("block_size")
    block_size = logged_block_size if isinstance(logged_block_size, int) else 128 if cpu else DEFAULT_BLOCK_SIZE
    bpt, basis = _implied_bytes_per_token(facts, settings, block_size)
    return LogExplanation(
        source=source,
        findings=findings,
        settings=settings,
        failed=bool(kinds & _FAILURES),
        implied_bytes_per_token=bpt,
        implied_bytes_per_token_basis=basis,
        advice=_log_advice(facts, kinds, settings, bpt, block_size),
    )


# --------------------------------------------------------------------------- rendering


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


def _section(title: str, rows: Iterable[tuple[str, str]]) -> list[str]:
    rows = list(rows)
    width = max(len(label) for label, _ in rows)
    return ["", title, *(f"  {label.ljust(width)}  {value}" for label, value in rows)]


def _fit_row(label: str, fit: RequestFit) -> tuple[str, str]:
    refused = "" if fit.fits else "  (too long: vLLM refuses to start)"
    per_gpu = format_bytes(fit.kv_bytes_per_gpu)
    return label, f"{fit.tokens:,} tokens = {fit.blocks:,} blocks ({per_gpu}/GPU) → {fit.max_concurrency:.2f}x{refused}"


def render_capacity(report: CapacityReport) -> str:
    """The human-readable table printed by ``llmload capacity``."""
    lay, mem, cache = report.layout, report.memory, report.cache
    tp = lay.tensor_parallel_size
    if lay.head_size_v:
        formula = f"2 × {lay.layers} layers × {lay.kv_heads_per_gpu} KV heads × {lay.head_size} × {lay.dtype_bytes} B"
    else:
        formula = f"{lay.layers} layers × {lay.head_size} (kv_lora_rank + qk_rope_head_dim) × {lay.dtype_bytes} B"
    naive = lay.naive_bytes_per_token
    per_token = [
        ("per GPU", f"{format_bytes(lay.bytes_per_token)} ({lay.bytes_per_token:,} B) = {formula}"),
        (
            "naive 2×layers×hidden",
            f"{format_bytes(naive)}, {naive / lay.bytes_per_token_model:.1f}× the model's real KV",
        ),
    ]
    if tp > 1:
        per_token.insert(1, (f"all {tp} GPUs", format_bytes(lay.bytes_per_token_all_gpus)))
    budget = []
    if mem.requested_gib is not None:
        estimated = f" (estimated, {(mem.parameters or 0) / 1e9:.2f} B params)" if mem.weights_estimated else ""
        budget += [
            ("GPU × utilization", f"{mem.gpu_memory_gib:g} GiB × {mem.gpu_memory_utilization:g}"),
            ("= vLLM's budget", format_bytes(mem.requested_gib * GIB)),
            ("− weights", format_bytes((mem.weights_gib or 0) * GIB) + estimated),
            ("− activations/overhead", format_bytes((mem.overhead_gib or 0) * GIB)),
        ]
    budget.append(("= KV cache" + (" (given)" if mem.kv_cache_explicit else ""), format_bytes(cache.bytes_per_gpu)))
    if tp > 1:
        budget.append((f"KV cache, all {tp} GPUs", format_bytes(cache.bytes_per_gpu * tp)))
    cache_rows = [
        ("blocks", f"{cache.num_blocks:,} × {lay.block_size} tokens = {cache.tokens:,} tokens"),
        ("longest sequence", f"{cache.longest_servable_len:,} tokens (one block is kept as vLLM's null block)"),
    ]
    if report.starts:
        cache_rows.append(("vLLM will log", f"KV cache size: {report.vllm_log_kv_cache_tokens:,} tokens"))
    fits = [_fit_row("at max_model_len", report.at_max_model_len)]
    if report.at_request_tokens is not None:
        fits.append(_fit_row("at request tokens", report.at_request_tokens))
    recommended = [("one sequence fits", f"{report.recommended_max_model_len:,}")]
    if report.max_model_len_for_min_concurrency is not None:
        recommended.append(
            (f"≥ {report.min_concurrency:g}x concurrency", f"{report.max_model_len_for_min_concurrency:,}")
        )
    out = [
        f"llmload capacity: {report.model.name} ({lay.attention}), TP {tp}, KV {lay.dtype}, block {lay.block_size}",
        *_section("KV cache per token", per_token),
        *_section("Memory per GPU", budget),
        *_section("KV cache per GPU", cache_rows),
        *_section("Concurrency (requests held in KV at once)", fits),
        *_section("Recommended max_model_len", recommended),
    ]
    if report.warnings:
        out += ["", "Notes", *(f"  - {w}" for w in report.warnings)]
    if report.advice:
        out += ["", "What to change", *(f"  - {a}" for a in report.advice)]
    return "\n".join(out)


def render_log_explanation(explanation: LogExplanation) -> str:
    out = [f"llmload capacity: vLLM log {explanation.source}", ""]
    if explanation.settings:
        out.append("Settings: " + ", ".join(f"{k}={v}" for k, v in explanation.settings.items()))
        out.append("")
    previous = 0
    for f in explanation.findings:
        if f.line_no != previous:  # one log line can hold two findings (size and concurrency)
            out.append(f"line {f.line_no}: {f.text[:200]}")
        out.append(f"  → {f.meaning}")
        previous = f.line_no
    if explanation.implied_bytes_per_token is not None:
        out += [
            "",
            f"Implied KV per token (per GPU or CPU worker): {explanation.implied_bytes_per_token:,.0f} B "
            f"({explanation.implied_bytes_per_token_basis})",
        ]
    if explanation.advice:
        out += ["", "What to change", *(f"  - {a}" for a in explanation.advice)]
    return "\n".join(out)
