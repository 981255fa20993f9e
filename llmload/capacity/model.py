"""A model as capacity sees it: ModelSpec read from a HF config.json, and the bundled configs.

``model_spec_from_config`` reads a config.json dict as vLLM does; ``estimate_parameters`` sizes
the weights from it. The configs named by ``--model-config`` are JSON files in ``models/`` beside
this module (package data).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from llmload.capacity.max_len import ContextLimit, read_context_limit
from llmload.errors import InputError, json_object
from llmload.models import Strict

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
    context_limit: ContextLimit = Field(
        default_factory=ContextLimit,
        description="the longest max_model_len vLLM starts with (llmload/capacity/max_len.py)",
    )
    weight_bytes_per_param: PositiveFloat | None = Field(description="from quantization_config; None: dtype size")
    quantization: str | None = Field(
        default=None, description="the checkpoint's quant_method (compressed-tensors: with its scheme)"
    )
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
        raise InputError(f"{where}: unsupported dtype {value!r} (float32, float16 or bfloat16)")
    return name


def _int_field(cfg: Mapping[str, object], keys: tuple[str, ...], source: str) -> int | None:
    """First of ``keys`` holding a positive int; None/0 count as absent (as vLLM treats head_dim 0)."""
    for key in keys:
        value = cfg.get(key)
        if value is None or value == 0:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InputError(f"{source}: field {key!r} must be a positive integer, got {value!r}")
        return value
    return None


def _required_int(cfg: Mapping[str, object], keys: tuple[str, ...], source: str, why: str) -> int:
    value = _int_field(cfg, keys, source)
    if value is None:
        raise InputError(f"{source}: missing field {keys[0]!r} ({why})")
    return value


class Quantization(NamedTuple):
    """A checkpoint's quantization_config as a step reads it: the method and the weights' bytes each."""

    method: str
    """quant_method, with compressed-tensors' scheme: `awq`, `fp8`, `compressed-tensors-w8a8-int8`..."""
    weight_bytes: float | None
    """Bytes per quantized weight (None: not understood; the dtype's size is used)."""


def _compressed_tensors(quant: Mapping[str, object]) -> Quantization:
    """compressed-tensors (llm-compressor): its first config group's weight and activation types, e.g.
    INT8 weights and activations (W8A8), FP8 (W8A8), or 4-bit INT weights (W4A16)."""
    groups = quant.get("config_groups")
    group = next(iter(groups.values()), None) if isinstance(groups, Mapping) and groups else None
    weights = group.get("weights") if isinstance(group, Mapping) else None
    inputs = group.get("input_activations") if isinstance(group, Mapping) else None
    if not isinstance(weights, Mapping) or not isinstance(weights.get("num_bits"), int):
        return Quantization("compressed-tensors", None)
    bits = int(weights["num_bits"])
    kind = "fp" if weights.get("type") == "float" else "int"
    act = f"a{inputs.get('num_bits')}" if isinstance(inputs, Mapping) and inputs.get("num_bits") else "a16"
    return Quantization(f"compressed-tensors-w{bits}{act}-{kind}{bits}", bits / 8)


def _quantization(quant: object, source: str, notes: list[str]) -> Quantization | None:
    """The checkpoint's quantization_config: GPTQ/AWQ ``bits`` → bits/8 bytes, fp8 → 1, compressed-tensors
    by its config groups (vLLM's compressed_tensors.py reads the same fields)."""
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "?"))
    bits = quant.get("bits")
    if isinstance(bits, int) and bits > 0:
        return Quantization(method, bits / 8)
    if method == "compressed-tensors":
        found = _compressed_tensors(quant)
        if found.weight_bytes is None:
            notes.append(f"{source}: compressed-tensors without a weight width; weights estimated at the dtype's size")
        return found
    if "fp8" in method:
        return Quantization(method, 1.0)
    notes.append(f"{source}: quantization {method!r} not understood; weights estimated at the dtype's size")
    return Quantization(method, None)


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
        raise InputError(
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
    quant = _quantization(config.get("quantization_config", cfg.get("quantization_config")), where, notes)
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
        context_limit=read_context_limit(cfg, where),
        weight_bytes_per_param=quant.weight_bytes if quant else None,
        quantization=quant.method if quant else None,
        mla=mla,
        moe=moe,
        notes=notes,
    )


class ParameterCounts(NamedTuple):
    """A model's weights by where a forward pass reads them (counts of parameters, not bytes)."""

    embedding: int
    """The input embedding table: a step reads only its tokens' rows."""
    lm_head: int
    """The output projection (the embedding again when tied): read whole by every step that samples."""
    attention: int
    """Every layer's attention projections (q, k, v, o; MLA's low-rank ones)."""
    dense_mlp: int
    """Every dense gated MLP (gate, up, down), and MoE layers' shared experts and routers."""
    experts: int
    """Every routed expert of every MoE layer: a step reads only the experts its tokens chose."""
    expert_layers: int
    """MoE layers (0: a dense model)."""

    @property
    def total(self) -> int:
        tied = self.embedding if self.lm_head == 0 else self.embedding + self.lm_head
        return tied + self.attention + self.dense_mlp + self.experts


def parameter_counts(model: ModelSpec) -> ParameterCounts:
    """The config's parameters by kind: embeddings, attention (GQA/MLA), gated MLPs incl. experts.

    Norms and biases are left out (well under 0.1%). A tied LM head is the embedding table itself
    (``lm_head`` 0 in the count, read as the embedding by a step)."""
    h, heads = model.hidden_size, model.num_attention_heads
    embedding = model.vocab_size * h
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
    lm_head = 0 if model.tie_word_embeddings else embedding
    if model.moe is None:
        return ParameterCounts(embedding, lm_head, model.num_layers * attention, model.num_layers * dense_mlp, 0, 0)
    moe = model.moe
    dense_layers = min(moe.first_dense_layers, model.num_layers)
    moe_layers = model.num_layers - dense_layers
    shared_and_router = 3 * h * moe.shared_intermediate_size + h * moe.num_experts
    return ParameterCounts(
        embedding,
        lm_head,
        model.num_layers * attention,
        dense_layers * dense_mlp + moe_layers * shared_and_router,
        moe_layers * 3 * h * moe.num_experts * moe.moe_intermediate_size,
        moe_layers,
    )


def estimate_parameters(model: ModelSpec) -> int:
    """Parameter count from the config (``parameter_counts``), close to the published counts
    (Llama-3.1-8B 8.03 B, Mixtral-8x7B 46.7 B, DeepSeek-V3 671 B)."""
    return parameter_counts(model).total


# Package data (pyproject [tool.setuptools.package-data]); a plain path works installed or editable.
_BUNDLED = Path(__file__).with_name("models")


def known_models() -> list[str]:
    """Names accepted by ``--model-config``: the JSON files bundled in llmload/capacity/models."""
    return sorted(p.name.removesuffix(".json") for p in _BUNDLED.iterdir() if p.name.endswith(".json"))


def _parse_config(text: str, source: str, name: str) -> ModelSpec:
    return model_spec_from_config(json_object(text, source), name=name, source=source)


def load_bundled_model(name: str) -> ModelSpec:
    """A bundled config by name (case-insensitive), e.g. ``llama-3.1-8b``."""
    key = name.lower()
    if key not in known_models():
        raise InputError(f"unknown model {name!r}; known: {', '.join(known_models())} (or use --hf-config PATH)")
    path = _BUNDLED / f"{key}.json"
    return _parse_config(path.read_text(encoding="utf-8"), f"llmload/capacity/models/{key}.json", key)


def load_config_file(path: Path) -> ModelSpec:
    """A HF config.json, or a model directory holding one."""
    file = path / "config.json" if path.is_dir() else path
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{file}: cannot read ({exc.strerror or exc})") from exc
    name = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
    return _parse_config(text, str(file), name)


def load_model(reference: str) -> ModelSpec:
    """A model by reference: a bundled config's name, else a HF config.json (or its directory)."""
    return load_bundled_model(reference) if reference in known_models() else load_config_file(Path(reference))
