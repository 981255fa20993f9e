"""The server's contract: its `vllm serve` settings, vLLM's defaults (by device), and which server a run met."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveInt, field_validator

from llmload.models.strict import Strict

# --------------------------------------------------------------------------- the server's configuration

ConfigValue = str | int | float | bool | list[str] | None


AUTO_FIT = -1  # --max-model-len -1 (or auto): vLLM takes the longest sequence its KV cache holds


class ServeConfig(Strict):
    """What a `vllm serve` config file and command line set (llmload/server/serve_config.py): None is vLLM's
    default. Keys vLLM accepts that llmload does not model are kept in `not_modelled`."""

    model: str | None = None
    served_model_name: str | None = Field(default=None, description="the first name when several are given")
    max_model_len: int | None = Field(default=None, description="-1: vLLM fits the longest the KV cache holds")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_memory_bytes: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_num_queued_reqs: PositiveInt | None = None
    block_size: PositiveInt | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel_size: PositiveInt | None = None
    pipeline_parallel_size: PositiveInt | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = Field(
        default=None, description="False: a prompt is prefilled whole in one step, never split across steps"
    )
    cpu_offload_gb: NonNegativeFloat | None = None
    not_modelled: dict[str, ConfigValue] = Field(default_factory=dict, description="accepted by vLLM, unused here")
    origins: dict[str, str] = Field(
        default_factory=dict, description="where each key was set: FILE:LINE or the command line"
    )

    @field_validator("max_model_len")
    @classmethod
    def _length_or_auto(cls, value: int | None) -> int | None:
        if value is not None and value < 1 and value != AUTO_FIT:
            raise ValueError(f"must be positive, or {AUTO_FIT} for the longest that fits; got {value}")
        return value

    def with_settings(self, other: ServeConfig) -> ServeConfig:
        """This configuration with every setting `other` sets (and where it set it) replacing ours."""
        given = other.model_dump(exclude={"not_modelled", "origins"}, exclude_none=True)
        return self.model_copy(
            update={
                **given,
                "not_modelled": {**self.not_modelled, **other.not_modelled},
                "origins": {**self.origins, **other.origins},
            }
        )

    def resolved(self) -> ResolvedServeConfig:
        """These settings with vLLM's constant defaults where they leave one unset."""
        return ResolvedServeConfig.model_validate(self.model_dump(exclude_none=True))


class ResolvedServeConfig(ServeConfig):
    """A ServeConfig with vLLM 0.32's constant defaults in place of None: each default is written once,
    here. Those vLLM derives stay None and are derived where they are used: max_model_len from the
    model's config (capacity.plan_capacity), max_num_seqs and max_num_batched_tokens from the usage
    context and the GPU (a simulator profile must set them), the KV memory from the GPU's, and
    enable_chunked_prefill from the model's kind (None: on, unless turned off)."""

    block_size: PositiveInt = 16  # CacheConfig.DEFAULT_BLOCK_SIZE on GPUs (the CPU backend uses 128, FlashMLA 64)
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    cpu_offload_gb: NonNegativeFloat = 0.0


VLLM_DEFAULTS = ResolvedServeConfig()
"""vLLM's constant defaults, for what reads one alone (`VLLM_DEFAULTS.block_size`)."""

Device = Literal["gpu", "cpu"]


class DeviceDefaults(Strict):
    """vLLM 0.32's defaults that depend on the device (EngineArgs.get_batch_defaults for the OpenAI
    server: GPUs under 70 GiB, and the CPU backend, whose blocks are 128 tokens)."""

    block_size: PositiveInt
    max_num_seqs: PositiveInt
    max_num_batched_tokens: PositiveInt


DEVICE_DEFAULTS: dict[Device, DeviceDefaults] = {
    "gpu": DeviceDefaults(block_size=VLLM_DEFAULTS.block_size, max_num_seqs=256, max_num_batched_tokens=2048),
    "cpu": DeviceDefaults(block_size=128, max_num_seqs=128, max_num_batched_tokens=2048),
}


def gpu_batch_defaults(memory_gib: float, product: str) -> DeviceDefaults:
    """vLLM's max_num_seqs and max_num_batched_tokens for the OpenAI server on one GPU of `memory_gib`
    (as torch reports it) called `product` (EngineArgs.get_batch_defaults, vLLM 0.11-0.32): 1024 and
    16384 from 160 GiB (B200 class), 1024 and 8192 from 70 GiB unless an A100 (H100, H200), else 256
    and 2048."""
    if memory_gib >= 160:
        return DeviceDefaults(block_size=VLLM_DEFAULTS.block_size, max_num_seqs=1024, max_num_batched_tokens=16384)
    if memory_gib >= 70 and "a100" not in product.lower():
        return DeviceDefaults(block_size=VLLM_DEFAULTS.block_size, max_num_seqs=1024, max_num_batched_tokens=8192)
    return DEVICE_DEFAULTS["gpu"]


# --------------------------------------------------------------------------- the server a run met


class ServerIdentity(Strict):
    """Which server a run met (llmload/server/detect.py): its kind in llmload/server/kinds.yaml,
    its version where it tells one, and what told them."""

    kind: str
    label: str
    version: str | None = None
    evidence: str = Field(description="the probe that told it, or `--server-kind`")

    @property
    def name(self) -> str:
        """`vLLM 0.32.0`, `transformers serve`: how reports name it."""
        return f"{self.label} {self.version}" if self.version else self.label
