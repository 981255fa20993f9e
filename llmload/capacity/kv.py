"""KV arithmetic on one GPU: bytes per token and per block, the block pool, concurrency.

Page sizes as in vLLM 0.32's ``vllm/v1/kv_cache_interface.py`` (AttentionSpec, MLAAttentionSpec);
block counts, the startup check and the logged capacity as in ``vllm/v1/core/kv_cache_utils.py``.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from llmload.capacity.model import ModelSpec
from llmload.errors import InputError
from llmload.models import VLLM_DEFAULTS

GIB = 1 << 30

ModelDtype = Literal["auto", "float32", "float16", "bfloat16"]
KVCacheDtype = Literal["auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2"]

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


class KVLayout(BaseModel):
    """One GPU's KV page geometry (vLLM's AttentionSpec / MLAAttentionSpec for every layer)."""

    attention: str
    layers: int
    layers_per_gpu: int = Field(description="layers / pipeline_parallel_size: a pipeline stage holds only its own")
    tensor_parallel_size: int
    pipeline_parallel_size: int = 1
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
    pipeline_parallel_size: int = 1,
    dtype: ModelDtype = "auto",
    kv_cache_dtype: KVCacheDtype = "auto",
    block_size: int = VLLM_DEFAULTS.block_size,
) -> KVLayout:
    """Bytes per token and per block on one GPU.

    Per layer a token stores K and V for each KV head on this rank: ``(head + head_v) × bytes ×
    kv_heads // TP`` (at least one head: vLLM replicates KV heads when TP exceeds them). MLA stores
    one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer, not split across TP ranks. A
    pipeline stage stores only its own layers (the first stages get one more when they do not divide).
    """
    tp, pp = tensor_parallel_size, pipeline_parallel_size
    if tp < 1 or pp < 1 or block_size < 1:
        raise InputError("tensor_parallel_size, pipeline_parallel_size and block_size must be positive")
    if pp > model.num_layers:
        raise InputError(f"{model.name}: {model.num_layers} layers cannot be split over {pp} pipeline stages")
    if model.num_attention_heads % tp:
        raise InputError(
            f"{model.name}: vLLM needs num_attention_heads ({model.num_attention_heads}) divisible by "
            f"tensor_parallel_size ({tp})"
        )
    if model.mla is None and model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise InputError(
            f"{model.name}: {model.num_kv_heads} KV heads cannot be split or replicated evenly over "
            f"tensor_parallel_size {tp}"
        )
    cache_dtype = resolve_dtype(model, dtype) if kv_cache_dtype == "auto" else kv_cache_dtype
    nbytes = DTYPE_BYTES[cache_dtype]
    if model.mla is not None:
        heads, k, v = 1, model.mla.kv_lora_rank + model.mla.qk_rope_head_dim, 0
    else:
        heads, k, v = max(1, model.num_kv_heads // tp), model.head_dim, model.head_dim
    layers_per_gpu = -(-model.num_layers // pp)
    per_token = layers_per_gpu * heads * (k + v) * nbytes
    model_heads = 1 if model.mla is not None else model.num_kv_heads
    return KVLayout(
        attention=model.attention,
        layers=model.num_layers,
        layers_per_gpu=layers_per_gpu,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        kv_heads_per_gpu=heads,
        head_size=k,
        head_size_v=v,
        dtype=cache_dtype,
        dtype_bytes=nbytes,
        block_size=block_size,
        bytes_per_token=per_token,
        bytes_per_block=per_token * block_size,
        bytes_per_token_model=model.num_layers * model_heads * (k + v) * nbytes,
        bytes_per_token_all_gpus=model.num_layers * heads * (k + v) * nbytes * tp,
        naive_bytes_per_token=2 * model.num_layers * model.hidden_size * nbytes,
    )


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks one request of ``tokens`` occupies: whole pages only."""
    return -(-tokens // block_size)


def sequences_held(num_blocks: int, tokens: float, block_size: int) -> int:
    """Sequences of ``tokens`` each that ``num_blocks`` KV blocks hold at once, less the null block vLLM keeps."""
    return (num_blocks - 1) // blocks_for(math.ceil(tokens), block_size)


def longest_held(num_blocks: int, block_size: int, max_model_len: int) -> int:
    """The longest sequence a server takes: its max_model_len, or all its KV blocks but the null block."""
    return min(max_model_len, (num_blocks - 1) * block_size)


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
        raise InputError(f"request tokens must be positive, got {request_tokens}")
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
