"""GPU memory and utilisation for each sample: an NVIDIA DCGM exporter's /metrics
(`--gpu-metrics URL`), else `nvidia-smi` when the target runs on this machine; else none."""

from __future__ import annotations

import ipaddress
import shutil
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
NVIDIA_SMI = "nvidia-smi"
NVIDIA_SMI_QUERY = ("--query-gpu=index,memory.used,memory.total,utilization.gpu", "--format=csv,noheader,nounits")
GPU_SOURCES = frozenset({*DCGM_FIELDS, NVIDIA_SMI})  # what `missing` names when a GPU source gave nothing


class GpuSample(Strict):
    """One GPU in one sample."""

    gpu: str = Field(description="index (DCGM's `gpu` label; a MIG instance as `0/13`)")
    memory_used_mib: float | None = None
    memory_total_mib: float | None = Field(default=None, description="DCGM: used + free")
    utilization_percent: float | None = None


def parse_dcgm(text: str) -> list[GpuSample]:
    """Each GPU of a DCGM exporter's exposition, in its order; total memory is used + free."""
    fields: dict[str, dict[str, float]] = {}
    for sample in samples(text, frozenset(DCGM_FIELDS)):
        gpu = sample.labels.get("gpu", "")
        if "GPU_I_ID" in sample.labels:  # a MIG instance: its own memory, not the whole GPU's
            gpu += f"/{sample.labels['GPU_I_ID']}"
        fields.setdefault(gpu, {})[sample.name] = float(sample.value)
    return [
        GpuSample(
            gpu=gpu,
            memory_used_mib=f.get(DCGM_USED),
            memory_total_mib=f[DCGM_USED] + f[DCGM_FREE] if DCGM_USED in f and DCGM_FREE in f else None,
            utilization_percent=f.get(DCGM_UTIL),
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
    """`nvidia-smi NVIDIA_SMI_QUERY` output: one GPU a line, index, MiB used, MiB total, % utilisation."""
    gpus = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != 4:
            raise ValueError(f"not index, memory.used, memory.total, utilization.gpu: {line!r}")
        gpus.append(
            GpuSample(
                gpu=cells[0],
                memory_used_mib=_number(cells[1]),
                memory_total_mib=_number(cells[2]),
                utilization_percent=_number(cells[3]),
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


GpuReader = DcgmReader | NvidiaSmiReader


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
    """The run's GPU source: the DCGM exporter at `gpu_metrics`; else nvidia-smi, when it is on the
    PATH and the target runs on this machine (a GPU here would be another's otherwise); else none."""
    if gpu_metrics:
        return DcgmReader(gpu_metrics)
    executable = shutil.which(NVIDIA_SMI)
    if executable is not None and is_loopback(target):
        return NvidiaSmiReader(executable)
    return None
