"""llmload/hardware: the GPU table (gpus.yaml) loads strictly, every figure is plausible and cited,
names resolve as `--gpu` reads them, and `llmload capacity --gpu` uses it end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmload.capacity.serving import gpu_memory_gib
from llmload.errors import InputError
from llmload.hardware.gpus import GPUS, GPUS_FILE, GpuSpec, _load, gpu, hbm_bytes_per_s, peak_flops

REPO = Path(__file__).resolve().parent.parent

# The torch-reported totals measured before the table existed: `--gpu` must keep giving them.
MEASURED_GIB = {
    "a10g": 22.06,
    "l4": 22.03,
    "rtx-4090": 23.53,
    "l40s": 44.53,
    "a100-40gb": 39.39,
    "a100-80gb": 79.15,
    "h100-80gb": 79.19,
    "h200": 139.81,
    "b200": 178.36,
}
REQUIRED = {
    *MEASURED_GIB,
    *("a10", "h100-pcie", "mi300x", "rtx-3090"),
}


def test_every_required_gpu_is_in_the_table_and_the_measured_memory_is_kept() -> None:
    assert set(GPUS) >= REQUIRED
    for name, gib in MEASURED_GIB.items():
        assert GPUS[name].memory_gib == gib
        assert gpu_memory_gib(name) == gib


@pytest.mark.parametrize("name", list(GPUS))
def test_every_figure_is_positive_plausible_and_cited(name: str) -> None:
    spec = GPUS[name]
    assert spec.name == name and spec.product
    assert 0.2 <= spec.hbm_tb_s <= 10, "memory bandwidth, TB/s"
    assert 20 <= spec.bf16_tflops <= 3000, "dense bf16 TFLOPS"
    if spec.fp8_tflops is not None:
        assert spec.fp8_tflops >= spec.bf16_tflops
    if spec.int8_tops is not None:
        assert spec.int8_tops >= spec.bf16_tflops
    # The marketed "GB" of these boards is binary (a 24 GB card has 24 GiB of DRAM): torch reports a
    # little less, and a GDDR6 card with ECC on about 15/16 of it.
    assert 0.9 * spec.memory_gb <= spec.memory_gib <= spec.memory_gb
    assert spec.interconnect_gb_s > 0
    if spec.interconnect == "pcie":
        assert spec.interconnect_gb_s in (32, 64), "PCIe Gen4 or Gen5 x16, one way"
    assert spec.sources and all(url.startswith("https://") for url in spec.sources)
    assert (spec.compute_capability is None) == (spec.gfx_arch is not None), "CUDA capability or AMD ISA"
    assert 2015 <= spec.released <= 2030


def test_ampere_has_no_fp8_and_falls_back_to_bf16() -> None:
    for name in ("a10", "a10g", "a100-40gb", "a100-80gb", "rtx-3090"):
        spec = gpu(name)
        assert spec.fp8_tflops is None
        assert peak_flops(spec, "fp8") == peak_flops(spec, "bf16") == spec.bf16_tflops * 1e12
    h100 = gpu("h100-80gb")
    assert peak_flops(h100, "bf16") == peak_flops(h100, "fp16") == 989.5e12
    assert peak_flops(h100, "fp8") == 1979e12 and peak_flops(h100, "int8") == 1979e12
    assert hbm_bytes_per_s(h100) == 3.35e12
    with pytest.raises(ValueError, match="unknown dtype"):
        peak_flops(h100, "fp4")  # type: ignore[arg-type]


def test_names_are_case_insensitive_and_aliases_resolve() -> None:
    assert gpu("H100-80GB") is GPUS["h100-80gb"]
    assert gpu("h100-sxm") is GPUS["h100-80gb"] and gpu(" H100-SXM ") is GPUS["h100-80gb"]
    assert gpu_memory_gib("H100-SXM") == 79.19
    assert gpu("MI300X").gfx_arch == "gfx942" and gpu("mi300x").compute_capability is None


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(InputError) as raised:
        gpu("tpu-v9")
    message = str(raised.value)
    assert "unknown GPU 'tpu-v9'" in message and all(name in message for name in GPUS)
    with pytest.raises(InputError, match=r"h100-pcie.*\(or give --gpu-memory-gib\)"):
        gpu_memory_gib("tpu-v9")


def test_a_misspelt_key_is_refused_with_its_line(tmp_path: Path) -> None:
    good = GPUS_FILE.read_text(encoding="utf-8")
    bad = tmp_path / "gpus.yaml"
    bad.write_text(good.replace("  hbm_tb_s: 3.35", "  hbm_tbs: 3.35"), encoding="utf-8")
    with pytest.raises(InputError, match=r"gpus\.yaml:\d+: .*h100-80gb\.hbm_tbs: unknown key"):
        _load(bad)
    bad.write_text(good.replace("  interconnect: nvlink", "  interconnect: infiniband", 1), encoding="utf-8")
    with pytest.raises(InputError, match="interconnect"):
        _load(bad)
    bad.write_text(good.replace("    - https://www.nvidia.com/en-us/data-center/h200/", "    - www.nvidia.com/h200"))
    with pytest.raises(InputError, match="sources"):
        _load(bad)
    with pytest.raises(ValueError, match="Extra inputs"):
        GpuSpec.model_validate({**GPUS["l4"].model_dump(), "bf16_tflop": 1})


def test_capacity_with_a_new_gpu_end_to_end() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "llmload.cli", "capacity", "--model-config", "llama-3.1-8b", "--gpu", "h100-pcie",
         "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["capacity"]["memory"]["gpu_memory_gib"] == GPUS["h100-pcie"].memory_gib
    help_text = subprocess.run(
        [sys.executable, "-m", "llmload.cli", "capacity", "--help"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "h100-pcie" in help_text and "mi300x" in help_text
