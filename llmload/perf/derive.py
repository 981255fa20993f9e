"""A model's step timing on a GPU, derived from its architecture and the GPU's data sheet.

`derive_timing` turns a model config (llmload.capacity.model), the server's settings (tensor
parallel size, dtypes, quantization, CUDA graphs), the KV page geometry vLLM would use
(llmload.capacity.kv) and a GPU of llmload/hardware into a `RooflineTiming`. Nothing is picked by
the model's name: two models with the same shape on the same GPU get the same timing.
"""

from __future__ import annotations

from pydantic import BaseModel

from llmload.capacity.kv import DTYPE_BYTES, KVLayout, ModelDtype, resolve_dtype
from llmload.capacity.model import ModelSpec, parameter_counts
from llmload.capacity.plan import CapacityInputs
from llmload.hardware.gpus import Dtype, GpuSpec, hbm_bytes_per_s, peak_flops
from llmload.models import ResolvedServeConfig
from llmload.perf.roofline import EFFICIENCY, Efficiency, RooflineTiming

# Activations travel between tensor-parallel GPUs in the model's dtype (bf16/fp16).
_ACTIVATION_BYTES = 2


def _model_dtype(serving: ResolvedServeConfig) -> ModelDtype:
    """--dtype as llmload.capacity reads it (`half` is float16, `float` float32)."""
    return CapacityInputs(serving=serving).dtype


class Precision(BaseModel):
    """How a server stores and multiplies a model's linear layers."""

    weight_bytes: float
    """Bytes per quantized linear-layer parameter (embeddings and the LM head stay in the model dtype)."""
    compute: Dtype
    """The tensor-core rate the matrix products run at: bf16, fp8 (W8A8 on GPUs with fp8) or int8 (W8A8)."""
    words: str


def precision(model: ModelSpec, serving: ResolvedServeConfig, gpu: GpuSpec) -> Precision:
    """The weights' width (from the checkpoint's quantization_config or --quantization, else the dtype)
    and the rate their products run at. 4-bit weights (AWQ, GPTQ) are dequantized to bf16 in the kernel
    (Marlin: W4A16); fp8 weights run as W8A8 where the GPU has fp8 tensor cores, else as W8A16 (vLLM's
    fp8 Marlin on Ampere); INT8 compressed-tensors checkpoints run as W8A8 int8."""
    dtype_bytes = DTYPE_BYTES[resolve_dtype(model, _model_dtype(serving))]
    width = model.weight_bytes_per_param or dtype_bytes
    method = (model.quantization or serving.quantization or "").lower()
    if width >= 2:
        return Precision(
            weight_bytes=width, compute="bf16", words=f"{resolve_dtype(model, _model_dtype(serving))} weights"
        )
    if width < 1:
        return Precision(
            weight_bytes=width, compute="bf16", words=f"{width * 8:g}-bit weights ({method}), W{width * 8:g}A16"
        )
    if "int8" in method or "w8a8" in method:
        return Precision(weight_bytes=width, compute="int8", words=f"INT8 weights and activations ({method})")
    compute: Dtype = "fp8" if gpu.fp8_tflops else "bf16"
    how = "W8A8" if compute == "fp8" else "W8A16: this GPU has no fp8 tensor cores"
    return Precision(weight_bytes=width, compute=compute, words=f"fp8 weights ({how})")


def derive_timing(
    model: ModelSpec,
    serving: ResolvedServeConfig,
    layout: KVLayout,
    gpu: GpuSpec,
    efficiency: Efficiency | None = None,
    *,
    enforce_eager: bool = False,
) -> RooflineTiming:
    """The step timing of `model` served with `serving` on `gpu`s (one per tensor-parallel rank).

    Per GPU: every step reads the weights it holds (all but the routed experts; those its tokens
    chose), and the KV of its sequences (`layout.bytes_per_token` per token, so fp8 KV halves it);
    it computes 2 FLOPs per active parameter per token, 4 × heads × head dim per layer per
    (token, context token) pair, and 2 × vocab × hidden per sampled sequence; under tensor
    parallelism it all-reduces hidden × 2 bytes per token twice a layer, a ring moving 2(n−1)/n of
    it. Pipeline parallelism is timed as its stages one after another (a request's latency).
    `efficiency` None: the fitted constants (efficiency.yaml).
    """
    efficiency = efficiency or EFFICIENCY
    tp = serving.tensor_parallel_size
    counts = parameter_counts(model)
    prec = precision(model, serving, gpu)
    model_bytes = DTYPE_BYTES[resolve_dtype(model, _model_dtype(serving))]
    lm_head = counts.lm_head or counts.embedding  # a tied head reads the embedding table
    dense = counts.attention + counts.dense_mlp
    moe = model.moe
    active_experts = counts.experts * (moe.experts_per_token or 1) / moe.num_experts if moe else 0
    layers_us = efficiency.eager_layer_us if enforce_eager else efficiency.layer_us
    heads = model.num_attention_heads
    if model.mla is not None:
        pair_width = heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim + model.mla.v_head_dim)
    else:
        pair_width = heads * 2 * model.head_dim
    link = gpu.interconnect_gb_s * 1e9 * efficiency.interconnect
    settings = [f"TP {tp}", prec.words]
    if layout.dtype != resolve_dtype(model, _model_dtype(serving)):
        settings.append(f"{layout.dtype} KV cache")
    if enforce_eager:
        settings.append("--enforce-eager")
    return RooflineTiming(
        derivation=f"derived: {model.name} on {gpu.product}, {', '.join(settings)} (llmload/perf, docs/prediction.md)",
        frontend_ms=efficiency.frontend_ms,
        api_server_ms=efficiency.api_server_ms,
        weight_bytes=round((dense * prec.weight_bytes + lm_head * model_bytes) / tp),
        expert_bytes=round(counts.experts * prec.weight_bytes / tp),
        experts=moe.num_experts if moe else 0,
        experts_per_token=(moe.experts_per_token or 1) if moe else 0,
        kv_bytes_per_token=layout.bytes_per_token,
        flops_per_token=2 * (dense + active_experts) / tp,
        lm_head_flops=2 * model.vocab_size * model.hidden_size / tp,
        attention_flops_per_pair=2 * pair_width * model.num_layers / tp,
        hbm_bytes_per_s=hbm_bytes_per_s(gpu) * efficiency.hbm,
        flops_per_s=peak_flops(gpu, prec.compute) * efficiency.compute,
        allreduces_per_step=2 * model.num_layers if tp > 1 else 0,
        allreduce_bytes_per_token=model.hidden_size * _ACTIVATION_BYTES * 2 * (tp - 1) / tp,
        interconnect_bytes_per_s=link,
        allreduce_s=efficiency.allreduce_us / 1e6,
        fixed_step_s=efficiency.step_ms / 1000 + model.num_layers * layers_us / 1e6,
        seq_s=efficiency.seq_us / 1e6,
    )
