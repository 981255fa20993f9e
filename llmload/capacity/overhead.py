"""What vLLM's startup memory profile takes from each GPU besides the weights: the non-KV overhead.

vLLM sizes its KV cache as ``requested − non_kv_cache_memory`` (``vllm/v1/worker/gpu_worker.py``,
``Worker.determine_available_memory``), with ``requested = total × gpu_memory_utilization`` and
``non_kv_cache_memory = weights + torch_peak_increase + non_torch_increase`` measured by
``vllm/utils/mem_utils.py`` ``memory_profiling`` around one ``profile_run`` (the same split V0
logged as "model weights take X; non_torch_memory takes Y; PyTorch activation peak memory takes Z"
in ``vllm/worker/worker.py`` ``determine_num_available_blocks``, 0.6.5 to 0.10). This module
predicts the two measured terms besides the weights, per GPU:

- ``activation_peak_bytes``: ``torch_peak_increase``, the largest set of tensors alive at once
  during ``profile_run`` (``vllm/v1/worker/gpu_model_runner.py``): either the dummy forward pass of
  ``max_num_batched_tokens`` tokens (``_dummy_run``), whose peak is inside the MLP, or the dummy
  sampler run on ``max_num_seqs`` rows of full-vocabulary logits (``_dummy_sampler_run``). The two
  run one after the other, so the peak is the larger, not the sum.
- ``non_torch_bytes``: ``non_torch_increase``, memory the process holds outside PyTorch's allocator
  that appeared after the worker's first snapshot (``init_snapshot``, taken once the CUDA context
  exists): cuBLAS/cuDNN workspaces, attention-backend buffers, and with TP/PP the NCCL and custom
  all-reduce buffers (``vllm/distributed/device_communicators``).

CUDA graphs are captured after the KV cache is allocated (``compile_or_warm_up_model``) in the
versions whose logs the constants were read from (0.6–0.11), so they are not part of the overhead
here; newer vLLM subtracts an estimate of them as well ("Estimated CUDA graph memory: X GiB",
``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``), which llmload does not yet model.

The constants are read from public startup logs (tests/data/kv_startup_points.yaml lists them, with
their sources); docs/capacity.md tabulates predicted against logged KV tokens.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from llmload.capacity.kv import GIB
from llmload.capacity.model import ModelSpec

# GPUs with at least this much memory get vLLM's larger batch defaults (EngineArgs.get_batch_defaults:
# "H100/H200/MI300x-class", device memory >= 70 GiB; vLLM also excludes A100-80GB by name, which a
# memory size cannot tell) and, in the logs, a larger non-torch footprint.
LARGE_GPU_GIB = 70.0
# vLLM's OpenAI-server defaults (EngineArgs.get_batch_defaults, vllm/engine/arg_utils.py).
DEFAULT_BATCHED_TOKENS = {False: 2048, True: 8192}
DEFAULT_MAX_NUM_SEQS = {False: 256, True: 1024}
# SchedulerConfig's floor when the budget follows max_model_len (_DEFAULT_MAX_NUM_BATCHED_TOKENS).
MIN_BATCHED_TOKENS = 2048

# Elements per token alive at the MLP's peak besides the MLP's own: the residual stream, the normed
# input and the attention output (3 × hidden). Fitted with the MLP term below on vllm#10517 (RTX 3090,
# Llama-3.1-8B, 20,000 and 29,000 profile tokens: 2.07 and 2.99 GiB logged, 2.06 and 2.99 predicted).
_HIDDEN_COPIES = 3
# The dense MLP holds gate_up (2 × intermediate) and the SiluAndMul output (1 × intermediate) at once.
_MLP_COPIES = 3
# Bytes per full-vocabulary logit of the sampler warm-up: model-dtype logits (2), their float32 copy
# (4), the sort for top-k/top-p (values 4 + int64 indices 8), probabilities and log-probabilities (4 + 4),
# the exponential noise and the quotient of the Gumbel-max sample (4 + 4), ≈ 34, plus masks; read as
# 41 from vllm#10511 (H100, Llama-3-8B, 256 sequences × 128,256 vocab: 1.26 GiB at TP 1 and TP 2 alike,
# above the forward pass's 0.84 and 0.52 GiB).
SAMPLER_BYTES_PER_LOGIT = 40
# Non-torch memory, GiB per GPU, as logged: 0.20–0.35 on 24 GB cards at TP 1–4 (vllm#10517, #13061,
# #14447: PCIe, custom all-reduce off, NCCL over host memory); 1.79 on an H100 at TP 1 and 3.58 at TP 2
# (vllm#10511: SXM, NCCL NVLink/NVLS channels and custom all-reduce IPC buffers).
NON_TORCH_GIB = {False: 0.35, True: 1.79}
NCCL_GIB = {False: 0.0, True: 1.79}


class Overhead(BaseModel):
    """Per-GPU memory vLLM's profile run counts besides weights (GiB), and what it was sized from."""

    activation_gib: float = Field(description="torch_peak_increase: the larger of forward and sampler peaks")
    forward_gib: float = Field(description="the dummy forward pass of profile_tokens tokens")
    sampler_gib: float = Field(description="the dummy sampler run on profile_seqs rows of logits")
    non_torch_gib: float = Field(description="non_torch_increase: workspaces, NCCL/all-reduce buffers")
    profile_tokens: int = Field(description="max_num_batched_tokens as the profile run uses it")
    profile_seqs: int = Field(description="max_num_seqs as the sampler warm-up uses it")

    @property
    def total_gib(self) -> float:
        return self.activation_gib + self.non_torch_gib


def profile_tokens(
    *,
    max_num_batched_tokens: int | None,
    enable_chunked_prefill: bool | None,
    max_model_len: int | None,
    large_gpu: bool,
) -> int:
    """The token count of vLLM's dummy forward pass (``profile_run`` → ``_dummy_run(max_num_tokens)``):
    ``max_num_batched_tokens`` when given; ``max(max_model_len, 2048)`` when chunked prefill is off and
    it is not (SchedulerConfig raises the budget to hold one whole prompt; V0 profiled the same);
    else the OpenAI server's default for the GPU (EngineArgs.get_batch_defaults)."""
    if max_num_batched_tokens is not None:
        return max_num_batched_tokens
    if enable_chunked_prefill is False and max_model_len:
        return max(max_model_len, MIN_BATCHED_TOKENS)
    return DEFAULT_BATCHED_TOKENS[large_gpu]


def mlp_elements_per_token(model: ModelSpec, tensor_parallel_size: int) -> int:
    """Elements alive per token at the MLP's peak on one TP rank: dense ``3 × intermediate / TP``
    (gate_up and the activation's output, ``MergedColumnParallelLinear`` + ``SiluAndMul``); for MoE,
    fused_moe's intermediate caches per routed copy, ``top_k × (3 × moe_intermediate / TP + hidden)``
    (``vllm/model_executor/layers/fused_moe``), plus the shared experts' dense MLP."""
    tp = tensor_parallel_size
    dense = _MLP_COPIES * math.ceil(model.intermediate_size / tp)
    moe = model.moe
    if moe is None:
        return dense
    top_k = moe.experts_per_token or 1
    routed = top_k * (_MLP_COPIES * math.ceil(moe.moe_intermediate_size / tp) + model.hidden_size)
    shared = _MLP_COPIES * math.ceil(moe.shared_intermediate_size / tp)
    return max(dense if moe.first_dense_layers else 0, routed + shared)


def estimate_overhead(
    model: ModelSpec,
    *,
    activation_bytes: float,
    gpu_memory_gib: float,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    enable_chunked_prefill: bool | None = None,
    max_model_len: int | None = None,
) -> Overhead:
    """Per-GPU overhead of one vLLM server: ``activation_peak + non_torch``.

    ``activation_peak = max(forward, sampler)`` with
    ``forward = tokens × (mlp_elements_per_token + 3 × hidden) × activation_bytes`` and
    ``sampler = max_num_seqs × vocab × SAMPLER_BYTES_PER_LOGIT`` (the LM head is vocab-parallel but
    its logits are gathered whole before sampling, so the vocabulary is not split by TP), and
    ``non_torch = NON_TORCH_GIB + NCCL_GIB`` when more than one GPU serves the model.
    ``activation_bytes`` is the width vLLM computes in (the resolved --dtype, not a quantized weight's).
    """
    large = gpu_memory_gib >= LARGE_GPU_GIB
    tokens = profile_tokens(
        max_num_batched_tokens=max_num_batched_tokens,
        enable_chunked_prefill=enable_chunked_prefill,
        max_model_len=max_model_len,
        large_gpu=large,
    )
    seqs = min(max_num_seqs or DEFAULT_MAX_NUM_SEQS[large], tokens)  # profile_run: one token per request at least
    per_token = mlp_elements_per_token(model, tensor_parallel_size) + _HIDDEN_COPIES * model.hidden_size
    forward = tokens * per_token * activation_bytes / GIB
    sampler = seqs * model.vocab_size * SAMPLER_BYTES_PER_LOGIT / GIB
    multi_gpu = tensor_parallel_size * pipeline_parallel_size > 1
    return Overhead(
        activation_gib=max(forward, sampler),
        forward_gib=forward,
        sampler_gib=sampler,
        non_torch_gib=NON_TORCH_GIB[large] + (NCCL_GIB[large] if multi_gpu else 0.0),
        profile_tokens=tokens,
        profile_seqs=seqs,
    )
