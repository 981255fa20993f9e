"""The GPUs llmload knows (`--gpu NAME`), one entry each in gpus.yaml with every figure cited to its
vendor's data sheet, product page or whitepaper (the entry's `sources`).

Units: memory in GiB as torch reports it (`memory_gib`) and as marketed (`memory_gb`), bandwidth in
TB/s (10**12 bytes/s), compute in dense TFLOPS / TOPS (10**12 per second, sparsity figures halved),
interconnect in GB/s one way. `peak_flops` and `hbm_bytes_per_s` give them in plain per-second units.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveFloat, RootModel, StringConstraints

from llmload.errors import InputError
from llmload.models import Strict
from llmload.yamlfile import load_yaml_model

GPUS_FILE = Path(__file__).with_name("gpus.yaml")

Dtype = Literal["bf16", "fp16", "fp8", "int8"]
HttpsUrl = Annotated[str, StringConstraints(pattern=r"^https://\S+$")]


class GpuSpec(Strict):
    """One GPU as its data sheet describes it (gpus.yaml's header says how each figure is read)."""

    name: str = Field(default="", description="its --gpu name: the key of its entry in gpus.yaml")
    product: str = Field(min_length=1, description="the vendor's full name of the product")
    aliases: list[str] = Field(default_factory=list, description="other --gpu names for it")
    memory_gib: PositiveFloat = Field(description="total memory of one GPU as torch reports it, GiB")
    memory_gb: PositiveFloat = Field(description="the marketed memory capacity, GB")
    hbm_tb_s: PositiveFloat = Field(description="peak memory bandwidth, TB/s")
    bf16_tflops: PositiveFloat = Field(description="peak dense BF16/FP16 tensor TFLOPS, FP32 accumulate")
    fp8_tflops: PositiveFloat | None = Field(description="peak dense FP8 tensor TFLOPS; null: no FP8 tensor cores")
    int8_tops: PositiveFloat | None = Field(description="peak dense INT8 tensor TOPS; null: no INT8 tensor cores")
    interconnect: Literal["nvlink", "pcie", "infinity-fabric"] = Field(
        description="how the GPUs of one server reach each other for an all-reduce"
    )
    interconnect_gb_s: PositiveFloat = Field(description="per-GPU interconnect bandwidth in one direction, GB/s")
    compute_capability: str | None = Field(
        pattern=r"^\d+\.\d+$", description="CUDA compute capability; null: not an NVIDIA GPU"
    )
    gfx_arch: str | None = Field(default=None, description="the AMD ISA (gfx942), for an AMD GPU")
    released: int = Field(ge=2010, le=2100, description="the year it shipped")
    sources: list[HttpsUrl] = Field(min_length=1, description="https URLs of the pages that print its figures")
    notes: list[str] = Field(default_factory=list, description="what a figure needs said about it")


class _Table(RootModel[dict[str, GpuSpec]]):
    pass


def _load(path: Path = GPUS_FILE) -> dict[str, GpuSpec]:
    """gpus.yaml's entries by name, in its order, each knowing its name."""
    table = load_yaml_model(path, _Table).root
    return {name: spec.model_copy(update={"name": name}) for name, spec in table.items()}


GPUS: dict[str, GpuSpec] = _load()
"""The GPUs by `--gpu` name, in gpus.yaml's order (aliases are not keys: `gpu()` resolves them)."""

_BY_NAME: dict[str, GpuSpec] = {
    **{alias.lower(): spec for spec in GPUS.values() for alias in spec.aliases},
    **{name.lower(): spec for name, spec in GPUS.items()},
}


def gpu(name: str) -> GpuSpec:
    """The GPU called `name` (its key or an alias, any case); InputError naming the known ones if none is."""
    try:
        return _BY_NAME[name.strip().lower()]
    except KeyError:
        raise InputError(f"unknown GPU {name!r}; known: {', '.join(GPUS)}") from None


def peak_flops(spec: GpuSpec, dtype: Dtype) -> float:
    """Peak dense tensor-core operations per second (FLOP/s; OP/s for int8) for GEMMs in `dtype`, from
    the data sheet's figure (gpus.yaml, `sources`): bf16 and fp16 are the same rate (FP32 accumulate).

    fp8 and int8 fall back to the bf16 rate on a card without such tensor cores (fp8 on Ampere: A10,
    A100, RTX 3090): vLLM runs fp8 weights there as W8A16 Marlin kernels, which dequantize to 16 bits
    and multiply at the bf16 rate.
    """
    if dtype in ("bf16", "fp16"):
        tera = spec.bf16_tflops
    elif dtype == "fp8":
        tera = spec.fp8_tflops if spec.fp8_tflops is not None else spec.bf16_tflops
    elif dtype == "int8":
        tera = spec.int8_tops if spec.int8_tops is not None else spec.bf16_tflops
    else:
        raise ValueError(f"unknown dtype {dtype!r}: bf16, fp16, fp8 or int8")
    return tera * 1e12


def hbm_bytes_per_s(spec: GpuSpec) -> float:
    """Peak memory bandwidth in bytes/s (the sheet's TB/s × 10**12; HBM or GDDR alike)."""
    return spec.hbm_tb_s * 1e12


def interconnect_bytes_per_s(spec: GpuSpec) -> float:
    """Per-GPU interconnect bandwidth in one direction, bytes/s (GB/s × 10**9): what a ring all-reduce
    moves each way."""
    return spec.interconnect_gb_s * 1e9
