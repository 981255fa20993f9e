"""GPU memory, utilisation, power and energy for each sample: an NVIDIA DCGM exporter's /metrics
(`--gpu-metrics URL`), else NVML (nvidia-ml-py) or `nvidia-smi` when the target runs on this
machine; else none. Energy is each GPU's own total-energy counter where it has one (NVML, DCGM);
nvidia-smi gives power only, which llmload/cost integrates."""

from __future__ import annotations

import ipaddress
import shutil
from collections.abc import Callable
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

from gevent import subprocess
from geventhttpclient import HTTPClient
from geventhttpclient.url import URL
from pydantic import Field

from llmload.models import Strict
from llmload.observe.metrics import fetch, samples

# NVIDIA DCGM exporter fields (default counters), one series per GPU labelled `gpu`: MiB, MiB, %
DCGM_USED, DCGM_FREE, DCGM_UTIL = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"
DCGM_FIELDS = (DCGM_USED, DCGM_FREE, DCGM_UTIL)
# W, and mJ since the driver loaded: read when served, never required (older GPUs have no counter)
DCGM_POWER, DCGM_ENERGY = "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"
NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_QUERY = (
    "--query-gpu=index,memory.used,memory.total,utilization.gpu,power.draw,name",
    "--format=csv,noheader,nounits",
)
NVML = "NVML"
GPU_SOURCES = frozenset({*DCGM_FIELDS, NVIDIA_SMI, NVML})  # what `missing` names when a GPU source gave nothing


class GpuSample(Strict):
    """One GPU in one sample."""

    gpu: str = Field(description="index (DCGM's `gpu` label; a MIG instance as `0/13`)")
    memory_used_mib: float | None = None
    memory_total_mib: float | None = Field(default=None, description="DCGM: used + free")
    utilization_percent: float | None = None
    power_w: float | None = None
    energy_j: float | None = Field(default=None, description="the GPU's total-energy counter (its origin arbitrary)")
    name: str | None = Field(default=None, description="the GPU's kind, e.g. NVIDIA H100 80GB HBM3")


def parse_dcgm(text: str) -> list[GpuSample]:
    """Each GPU of a DCGM exporter's exposition, in its order; total memory is used + free."""
    fields: dict[str, dict[str, float]] = {}
    names: dict[str, str] = {}
    # the exporter types the energy counter `counter`: prometheus_client names its samples `..._total`
    for sample in samples(text, frozenset({*DCGM_FIELDS, DCGM_POWER, DCGM_ENERGY, f"{DCGM_ENERGY}_total"})):
        name = sample.name.removesuffix("_total")
        gpu = sample.labels.get("gpu", "")
        if "GPU_I_ID" in sample.labels:  # a MIG instance: its own memory, not the whole GPU's
            if name in (DCGM_POWER, DCGM_ENERGY):
                continue  # the whole GPU's, not the instance's
            gpu += f"/{sample.labels['GPU_I_ID']}"
        fields.setdefault(gpu, {})[name] = float(sample.value)
        names.setdefault(gpu, sample.labels.get("modelName", ""))
    return [
        GpuSample(
            gpu=gpu,
            memory_used_mib=f.get(DCGM_USED),
            memory_total_mib=f[DCGM_USED] + f[DCGM_FREE] if DCGM_USED in f and DCGM_FREE in f else None,
            utilization_percent=f.get(DCGM_UTIL),
            power_w=f.get(DCGM_POWER),
            energy_j=f[DCGM_ENERGY] / 1000 if DCGM_ENERGY in f else None,
            name=names[gpu] or None,
        )
        for gpu, f in fields.items()
    ]


def _number(text: str) -> float | None:
    """A CSV cell of nvidia-smi: `[N/A]` or `[Not Supported]` is None."""
    try:
        return float(text)
    except ValueError:
        return None


def parse_nvidia_smi(text: str) -> list[GpuSample]:
    """`nvidia-smi NVIDIA_SMI_QUERY` output: one GPU a line, index, MiB used, MiB total, % utilisation,
    W drawn, and its name last (the one cell that could hold a comma)."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",", 5)]
        if len(cells) != 6:
            raise ValueError(f"not index, memory.used, memory.total, utilization.gpu, power.draw, name: {line!r}")
        gpus.append(
            GpuSample(
                gpu=cells[0],
                memory_used_mib=_number(cells[1]),
                memory_total_mib=_number(cells[2]),
                utilization_percent=_number(cells[3]),
                power_w=_number(cells[4]),
                name=cells[5] or None,
            )
        )
    return gpus


class GpuReadError(Exception):
    """A GPU source gave no GPUs this time; the message says why."""


class DcgmReader:
    """GPUs from an NVIDIA DCGM exporter's /metrics."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.names = list(DCGM_FIELDS)
        parsed = URL(url)
        self._path = parsed.request_uri
        self._http = HTTPClient.from_url(parsed, concurrency=1)

    def read(self, timeout_s: float) -> list[GpuSample]:
        status, body = fetch(self._http, self._path, timeout_s)
        if status != 200:
            raise GpuReadError(f"the DCGM exporter at {self.url} answered {status or 'nothing'}")
        try:
            gpus = parse_dcgm(body.decode(errors="replace"))
        except ValueError as exc:
            raise GpuReadError(f"{self.url} is not Prometheus text ({exc})") from None
        if not gpus:
            raise GpuReadError(f"{self.url} serves none of {', '.join(DCGM_FIELDS)}")
        return gpus

    def close(self) -> None:
        self._http.close()


class NvidiaSmiReader:
    """GPUs of this machine from `nvidia-smi --query-gpu` (its CSV)."""

    def __init__(self, executable: str) -> None:
        self.url = executable
        self.names = [NVIDIA_SMI]

    def read(self, timeout_s: float) -> list[GpuSample]:
        try:
            done = subprocess.run(
                [self.url, *NVIDIA_SMI_QUERY], capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuReadError(f"{NVIDIA_SMI} did not run ({exc})") from None
        if done.returncode != 0:
            first = (done.stderr or done.stdout).strip().splitlines()[:1]
            raise GpuReadError(f"{NVIDIA_SMI} exited {done.returncode}: {first[0] if first else 'no message'}")
        try:
            gpus = parse_nvidia_smi(done.stdout)
        except ValueError as exc:
            raise GpuReadError(f"{NVIDIA_SMI}: {exc}") from None
        if not gpus:
            raise GpuReadError(f"{NVIDIA_SMI} lists no GPU")
        return gpus

    def close(self) -> None:
        """Nothing held between reads."""


class NvmlReader:
    """GPUs of this machine through NVML (nvidia-ml-py): the one local source with the energy counter."""

    def __init__(self, nvml: ModuleType) -> None:
        self.url = NVML
        self.names = [NVML]
        self._nvml = nvml
        self._handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def _read(self, index: int, handle: object) -> GpuSample:
        nvml = self._nvml
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        name = nvml.nvmlDeviceGetName(handle)
        return GpuSample(
            gpu=str(index),
            memory_used_mib=memory.used / 2**20,
            memory_total_mib=memory.total / 2**20,
            utilization_percent=self._optional(nvml.nvmlDeviceGetUtilizationRates, handle, lambda u: u.gpu),
            power_w=self._optional(nvml.nvmlDeviceGetPowerUsage, handle, lambda mw: mw / 1000),
            energy_j=self._optional(nvml.nvmlDeviceGetTotalEnergyConsumption, handle, lambda mj: mj / 1000),
            name=name.decode() if isinstance(name, bytes) else name,
        )

    def _optional(self, call: Callable[[object], Any], handle: object, unit: Callable[[Any], float]) -> float | None:
        """A figure the GPU may not support (the energy counter before Volta): None then."""
        try:
            return float(unit(call(handle)))
        except self._nvml.NVMLError:
            return None

    def read(self, timeout_s: float) -> list[GpuSample]:
        try:
            return [self._read(index, handle) for index, handle in enumerate(self._handles)]
        except self._nvml.NVMLError as exc:
            raise GpuReadError(f"{NVML}: {exc}") from None

    def close(self) -> None:
        self._nvml.nvmlShutdown()


def nvml_reader() -> NvmlReader | None:
    """NVML when its library loads and sees a GPU (never on a machine without the NVIDIA driver)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        if pynvml.nvmlDeviceGetCount():
            return NvmlReader(pynvml)
        pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        pass
    return None


GpuReader = DcgmReader | NvmlReader | NvidiaSmiReader


def is_loopback(url: str) -> bool:
    """Whether `url` names this machine (localhost or a loopback address)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def gpu_reader(gpu_metrics: str | None, target: str) -> GpuReader | None:
    """The run's GPU source: the DCGM exporter at `gpu_metrics`; else, when the target runs on this
    machine (a GPU here would be another's otherwise), NVML, or nvidia-smi on the PATH; else none."""
    if gpu_metrics:
        return DcgmReader(gpu_metrics)
    if not is_loopback(target):
        return None
    nvml = nvml_reader()
    if nvml is not None:
        return nvml
    executable = shutil.which(NVIDIA_SMI)
    if executable is not None:
        return NvidiaSmiReader(executable)
    return None
