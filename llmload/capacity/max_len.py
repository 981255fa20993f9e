"""The model's limit on max_model_len, as vLLM derives and enforces it.

vLLM 0.32 derives the longest sequence a model takes from its config.json
(vllm/transformers_utils/model_arch_config_convertor.py, ``derive_max_model_len_and_key``) and
checks --max-model-len against it in vllm/config/model.py, ``_get_and_verify_max_len``: a larger
value is refused at startup with a ValueError unless VLLM_ALLOW_LONG_MAX_MODEL_LEN is set
(vllm/envs.py). ``read_context_limit`` reads the facts that rule needs from a config.json dict;
``verify_max_model_len`` applies it. Not modelled: the tokenizer's model_max_length (vLLM reads it only
for pooling models with absolute position embeddings), a sentence-transformers encoder's
max_seq_length, transformers' per-class defaults for keys a config.json leaves out (LlamaConfig's
max_position_embeddings 2048), and per-layer configs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping

from pydantic import Field

from llmload.errors import InputError
from llmload.models import Strict

# ModelArchConfigConvertorBase.derive_max_model_len_and_key: the smallest of these keys, tried in this order.
MAX_LEN_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_target_positions",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)
# transformers' attribute_map: in these config classes one of those keys answers with another key's value
# (GPT-2's max_position_embeddings is its n_positions), so vLLM finds it under the first name.
_GPT_STYLE = ("gpt2", "gpt_bigcode", "gptj", "gpt-sw3", "codegen", "ctrl", "openai-gpt", "imagegpt")
_ALIASES: dict[str, dict[str, str]] = {
    **{name: {"max_position_embeddings": "n_positions"} for name in (*_GPT_STYLE, "decision_transformer")},
    "dbrx": {"max_position_embeddings": "max_seq_len"},
    "rwkv": {"max_position_embeddings": "context_length"},
    "kimi_linear": {"max_position_embeddings": "model_max_length"},
    "inkling_text": {"model_max_length": "max_position_embeddings"},
}
# Decoder config classes with no RoPE parameters (transformers 5): vLLM has no RoPE factor to apply.
_NO_ROPE_TYPES = frozenset(
    {*_GPT_STYLE, "decision_transformer", "gpt_neo", "opt", "bloom", "mpt", "xglm", "biogpt", "rwkv", "whisper"}
)
# RoPE types whose max_position_embeddings is already the scaled length: vLLM leaves their factor out.
_UNSCALED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
# vLLM's patch_legacy_rope_type (vllm/transformers_utils/config.py) renames these.
_LEGACY_ROPE_TYPES = {"su": "longrope", "mrope": "default", "telechat3-yarn": "yarn"}
# transformers' ALLOWED_LAYER_TYPES: rope_parameters keyed only by these hold one dict per layer type.
_LAYER_TYPES = frozenset(
    {
        "full_attention",
        "sliding_attention",
        "chunked_attention",
        "window_attention",
        "indexed_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "minimax_m3_sparse",
        "conv",
        "moe",
        "hybrid",
        "hybrid_sliding",
        "linear_attention",
        "sparse",
        "dense",
    }
)
DEFAULT_MAX_LEN = 2048  # vLLM's length for a config that names none
ALLOW_LONG_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
_LONG_WARNING = (
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme caution. If the model uses relative position "
    "encoding (RoPE), positions exceeding derived_max_model_len lead to nan. If the model uses absolute position "
    "encoding, positions exceeding derived_max_model_len will cause a CUDA array out-of-bounds error."
)
_NO_KEY_WARNING = (
    "The model's config.json does not contain any of the keys to determine the original maximum length of the "
    f"model. Assuming the model's maximum length is {DEFAULT_MAX_LEN}."
)

Number = int | float


class ContextLimit(Strict):
    """What a config.json tells vLLM about the longest sequence (vllm/config/model.py
    ``_get_and_verify_max_len``), numbers as vLLM holds them: an int, or a float once a RoPE factor
    (1.0 when the config gives none) has multiplied it, which is how vLLM prints it (4096.0)."""

    derived_max_model_len: Number | None = Field(
        default=None, description="vLLM's derived max_model_len (default settings); None: the config names no length"
    )
    key: str | None = Field(default=None, description="the config key vLLM derives the limit from")
    key_value: Number | None = Field(default=None, description="that key's value, before RoPE scaling")
    rope_factor: Number | None = Field(
        default=None, description="what vLLM multiplies it by; None: no RoPE parameters (or Gemma 3, already scaled)"
    )
    model_max_length: Number | None = Field(default=None, description="a longer --max-model-len up to it is allowed")
    sliding_window: int | None = Field(default=None, description="the limit under --disable-sliding-window")
    longrope_original: Number | None = Field(
        default=None, description="LongRoPE: vLLM's default max_model_len (original_max_position_embeddings)"
    )
    longrope: bool = False

    def derived(self, *, disable_sliding_window: bool) -> tuple[Number | None, str | None]:
        """vLLM's derived max_model_len and the key it names (None: no key, any --max-model-len is taken)."""
        value, key = self.key_value, self.key
        if disable_sliding_window and self.sliding_window is not None and self.sliding_window < (value or math.inf):
            value, key = self.sliding_window, "sliding_window"
        if value is None:
            return None, None
        return (value if self.rope_factor is None else value * self.rope_factor), key

    def longest_accepted(self, *, disable_sliding_window: bool) -> int | None:
        """The longest --max-model-len vLLM starts with (None: any)."""
        derived, _ = self.derived(disable_sliding_window=disable_sliding_window)
        if derived is None:
            return None
        return math.floor(max(derived, self.model_max_length or 0))

    def limiting_key(self, *, disable_sliding_window: bool) -> str | None:
        """The key `longest_accepted` comes from."""
        derived, key = self.derived(disable_sliding_window=disable_sliding_window)
        if derived is not None and self.model_max_length is not None and self.model_max_length > derived:
            return "model_max_length"
        return key


class MaxLenCheck(Strict):
    """vLLM's answer to a --max-model-len: the length it runs with, or its refusal, and its warnings."""

    max_model_len: int
    error: str | None = None
    warnings: list[str] = Field(default_factory=list)


def allow_long_max_model_len(environ: Mapping[str, str] = os.environ) -> bool:
    """VLLM_ALLOW_LONG_MAX_MODEL_LEN as vllm/envs.py reads it: `1` or `true`, any case, spaces stripped."""
    return environ.get(ALLOW_LONG_ENV, "0").strip().lower() in ("1", "true")


def verify_max_model_len(
    limit: ContextLimit, max_model_len: int | None, *, disable_sliding_window: bool = False, allow_long: bool = False
) -> MaxLenCheck:
    """vllm/config/model.py ``_get_and_verify_max_len``: None or -1 takes the derived length (LongRoPE: its
    original_max_position_embeddings; 2048 when the config names none); a longer one than the derived
    length (and than model_max_length) is refused with vLLM's ValueError text, or, with
    VLLM_ALLOW_LONG_MAX_MODEL_LEN, taken with vLLM's warning."""
    derived, key = limit.derived(disable_sliding_window=disable_sliding_window)
    given = None if max_model_len == -1 else max_model_len
    if given is None:
        warnings = [] if derived is not None else [_NO_KEY_WARNING]
        if derived is None:
            derived = DEFAULT_MAX_LEN if limit.rope_factor is None else DEFAULT_MAX_LEN * limit.rope_factor
        default = limit.longrope_original if limit.longrope and limit.longrope_original is not None else derived
        return MaxLenCheck(max_model_len=int(default), warnings=warnings)
    if derived is None:
        return MaxLenCheck(max_model_len=given)
    if given <= derived or (limit.model_max_length is not None and given <= limit.model_max_length):
        return MaxLenCheck(max_model_len=given)
    msg = (
        f"User-specified max_model_len ({given}) is greater than the derived max_model_len ({key}="
        f"{derived} or model_max_length={limit.model_max_length} in model's config.json)."
    )
    if allow_long:
        return MaxLenCheck(max_model_len=given, warnings=[f"{msg} {_LONG_WARNING}"])
    return MaxLenCheck(
        max_model_len=given,
        error=f"{msg} To allow overriding this maximum, set the env var {ALLOW_LONG_ENV}=1. {_LONG_WARNING}",
    )


def _number(cfg: Mapping[str, object], key: str, model_type: str | None, where: str) -> Number | None:
    """A length key as vLLM's getattr on the config sees it (through transformers' attribute_map)."""
    name = _ALIASES.get(model_type or "", {}).get(key, key)
    value = cfg.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where}: field {name!r} must be a number, got {value!r}")
    return value


def _rope_parameters(cfg: Mapping[str, object], model_type: str | None) -> list[Mapping[str, object]]:
    """The RoPE parameter dicts vLLM iterates (vllm/transformers_utils/config.py ``iter_rope_parameters``), as
    transformers' ``standardize_rope_params`` leaves them: ``rope_scaling`` or ``rope_parameters``, one dict
    or one per layer type, each with a rope_type (``type``, else `default`); a RoPE model's config class
    always has one (it holds rope_theta), a class without RoPE has none."""
    scaling, parameters = cfg.get("rope_scaling"), cfg.get("rope_parameters")
    raw = scaling or parameters
    if model_type is None or model_type in _NO_ROPE_TYPES:
        rope = (
            bool(scaling and cfg.get("rope_theta"))
            if model_type
            else any(cfg.get(k) is not None for k in ("rope_scaling", "rope_parameters", "rope_theta"))
        )
        if not rope:
            return []
    dicts: list[Mapping[str, object]]
    if isinstance(raw, Mapping) and raw and all(k in _LAYER_TYPES for k in raw):
        dicts = [p for p in raw.values() if isinstance(p, Mapping) and p]
    else:
        dicts = [raw if isinstance(raw, Mapping) else {}]
    out: list[Mapping[str, object]] = []
    for params in dicts:
        rope_type = str(params.get("rope_type", params.get("type", "default")))
        out.append({**params, "rope_type": _LEGACY_ROPE_TYPES.get(rope_type, rope_type)})
    return out


def read_context_limit(cfg: Mapping[str, object], where: str) -> ContextLimit:
    """The facts ``verify_max_model_len`` needs from a (text) config.json dict, read as vLLM reads them."""
    model_type = str(cfg["model_type"]) if cfg.get("model_type") else None
    key, key_value = None, None
    for name in MAX_LEN_KEYS:  # derive_max_model_len_and_key: the smallest, the first key holding it
        value = _number(cfg, name, model_type, where)
        if value is not None and (key_value is None or value < key_value):
            key, key_value = name, value
    model_max_length = _number(cfg, "model_max_length", model_type, where)
    if model_max_length:  # Command-R / Cohere: model_max_length wins outright
        key, key_value = "model_max_length", model_max_length
    params = _rope_parameters(cfg, model_type)
    factor: Number | None = None
    if params and "gemma3" not in (model_type or ""):  # Gemma 3's length is already scaled
        factor = 1.0
        for rp in params:
            if rp["rope_type"] not in _UNSCALED_ROPE_TYPES:
                found = rp.get("factor", factor)
                factor = found if isinstance(found, int | float) and not isinstance(found, bool) else None
        if factor is None:  # a null factor: vLLM warns and takes 1.0
            factor = 1.0
    longrope = any(rp["rope_type"] == "longrope" for rp in params)
    original = _number(cfg, "original_max_position_embeddings", model_type, where) if longrope else None
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None
    derived = None if key_value is None else key_value if factor is None else key_value * factor
    return ContextLimit(
        derived_max_model_len=derived,
        key=key,
        key_value=key_value,
        rope_factor=factor,
        model_max_length=model_max_length,
        sliding_window=window if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None,
        longrope_original=original,
        longrope=longrope,
    )
