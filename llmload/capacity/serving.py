"""A `vllm serve` configuration (llmload/server/serve_config.py) as capacity inputs: the model it names and the
GPU it runs on."""

from __future__ import annotations

from pathlib import Path

from llmload.capacity.model import ModelSpec, known_models, load_model
from llmload.capacity.plan import CapacityInputs
from llmload.errors import InputError
from llmload.hardware.gpus import gpu
from llmload.models import ServeConfig, gpu_batch_defaults

# --quantization methods whose weight width llmload knows (bytes per parameter).
_QUANTIZED_BYTES = {"fp8": 1.0, "awq": 0.5, "awq_marlin": 0.5, "gptq": 0.5, "gptq_marlin": 0.5, "bitsandbytes": 0.5}


def gpu_memory_gib(name: str) -> float:
    """Total memory of the GPU called `name` (`--gpu NAME`, llmload/hardware/gpus.yaml) as torch reports
    it, GiB: what vLLM logs as the device's total."""
    try:
        return gpu(name).memory_gib
    except InputError as exc:
        raise InputError(f"{exc} (or give --gpu-memory-gib)") from None


def on_gpu(config: ServeConfig, name: str) -> ServeConfig:
    """`config` as vLLM's OpenAI server runs it on the GPU called `name`: max_num_seqs and
    max_num_batched_tokens, where the config leaves them out, are the defaults vLLM picks by the GPU
    (`gpu_batch_defaults`: an A100 keeps 256 and 2048 whatever its memory)."""
    card = gpu(name)
    defaults = gpu_batch_defaults(card.memory_gib, card.product)
    return config.model_copy(
        update={
            "max_num_seqs": config.max_num_seqs or defaults.max_num_seqs,
            "max_num_batched_tokens": config.max_num_batched_tokens or defaults.max_num_batched_tokens,
        }
    )


def model_reference(config: ServeConfig) -> str:
    """The config's model as llmload finds it: a local directory or config.json, or the bundled config
    whose name the Hugging Face id contains (`Qwen/Qwen3-8B` is `qwen3-8b`)."""
    name = config.model
    if name is None:
        raise InputError("the vLLM config names no model: add `model:` or give --model-config / --hf-config")
    if Path(name).exists():
        return name
    matches = [known for known in known_models() if known in name.lower()]
    if not matches:
        raise InputError(
            f"{config.origins.get('model', 'the vLLM config')}: model {name!r} is neither a local path nor one of "
            f"the bundled configs ({', '.join(known_models())}): give --hf-config path/to/config.json or --model-config"
        )
    return max(matches, key=len)


def serve_model(config: ServeConfig) -> ModelSpec:
    """The model the config serves, with its weights at the width `--quantization` loads them."""
    return with_quantization(load_model(model_reference(config)), config)


def with_quantization(spec: ModelSpec, config: ServeConfig) -> ModelSpec:
    """The model's weights at the width `--quantization` loads them."""
    method = config.quantization
    if method is None or spec.weight_bytes_per_param is not None:
        return spec
    if method not in _QUANTIZED_BYTES:
        note = f"quantization {method!r}: weight width unknown to llmload, estimated at the dtype's size"
        return spec.model_copy(update={"notes": [*spec.notes, note]})
    return spec.model_copy(update={"weight_bytes_per_param": _QUANTIZED_BYTES[method]})


def serve_inputs(config: ServeConfig, **measured: object) -> CapacityInputs:
    """Capacity inputs for the config on a server: `measured` (GPU memory, weights, overhead: None when
    not known) are what vLLM measures rather than is told."""
    return CapacityInputs.model_validate({"serving": config, **{k: v for k, v in measured.items() if v is not None}})
