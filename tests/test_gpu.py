"""GPU memory and utilisation: a loopback DCGM exporter serving its documented text format, a
stand-in `nvidia-smi` on the PATH, and real headless Locust runs with `--gpu-metrics`.

No GPU, NVIDIA driver or DCGM exists on the CI machine, so the exporter's page is a fixture
(tests/data/dcgm) and `nvidia-smi` a script printing its `--query-gpu` CSV: what is under test is
llmload's reading of them.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest

from llmload.conclude import judge
from llmload.gates.criteria import SoakCriteria
from llmload.observe.gpu import (
    DCGM_FIELDS,
    NVIDIA_SMI,
    NVIDIA_SMI_QUERY,
    DcgmReader,
    GpuReadError,
    GpuSample,
    NvidiaSmiReader,
    gpu_reader,
    parse_dcgm,
    parse_nvidia_smi,
)
from llmload.observe.metrics import parse_metrics
from llmload.observe.observer import Observer
from llmload.observe.summary import read_server, server_summary
from llmload.sweep.server import free_port
from tests.locust_runs import llmload_cli, run_locust, small_workload
from tests.test_observe import observe_for
from tests.wire_server import serve, text_pages

FIXTURE = Path(__file__).parent / "data" / "dcgm" / "metrics.txt"
TOTAL_MIB = 81559.0  # used + free of each GPU in the fixture
FIXTURE_USED = {"0": 64608.0, "1": 61512.0}
_FB = re.compile(r'^(DCGM_FI_DEV_FB_(USED|FREE)\{gpu="(\d+)"[^}]*\}) \S+$', re.M)
SMI_CSV = "0, 70000, 81559, 91, 412.50, NVIDIA H100 80GB HBM3\n1, 1024, 81559, [N/A], [N/A], Tesla T4, rev, b\n"

UsedMib = Callable[[float], dict[str, float]]  # seconds since the exporter started -> MiB used per GPU


def dcgm_page(used_mib: dict[str, float]) -> str:
    """The fixture with the given GPUs' memory used (and free = total − used)."""

    def value(match: re.Match[str]) -> str:
        used = used_mib.get(match.group(3))
        if used is None:
            return match.group(0)
        return f"{match.group(1)} {used if match.group(2) == 'USED' else TOTAL_MIB - used:.0f}"

    return _FB.sub(value, FIXTURE.read_text(encoding="utf-8"))


@contextmanager
def dcgm_exporter(used_mib: UsedMib = lambda _: FIXTURE_USED) -> Iterator[str]:
    """A loopback DCGM exporter (127.0.0.1, a free port): GET /metrics answers the fixture page with
    memory used as `used_mib(seconds since start)`. Yields the /metrics URL."""
    started = time.monotonic()

    def page(path: str) -> str | None:
        return dcgm_page(used_mib(time.monotonic() - started)) if path == "/metrics" else None

    with serve(text_pages(page)) as url:
        yield f"{url}/metrics"


def fake_nvidia_smi(directory: Path, output: str = SMI_CSV, exit_code: int = 0) -> Path:
    """An executable `nvidia-smi` that prints `output` when asked llmload's query, and fails otherwise."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / NVIDIA_SMI
    query = " ".join(NVIDIA_SMI_QUERY)
    script.write_text(
        f'#!/bin/sh\n[ "$*" = "{query}" ] || {{ echo "unexpected arguments: $*" >&2; exit 64; }}\n'
        f"printf '%s' '{output}'\n"
        f"[ {exit_code} -eq 0 ] || echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA"
        f" driver.' >&2\nexit {exit_code}\n"
    )
    script.chmod(0o755)
    return directory


# --------------------------------------------------------------------------- parsing


def test_the_exporters_page_gives_each_gpus_memory_and_utilisation() -> None:
    text = FIXTURE.read_text(encoding="utf-8")
    h100 = "NVIDIA H100 80GB HBM3"
    assert parse_dcgm(text) == [
        GpuSample(
            gpu="0",
            memory_used_mib=64608,
            memory_total_mib=TOTAL_MIB,
            utilization_percent=87,
            power_w=412.734,
            energy_j=8821573.902,
            name=h100,
        ),
        GpuSample(
            gpu="1",
            memory_used_mib=61512,
            memory_total_mib=TOTAL_MIB,
            utilization_percent=81,
            power_w=388.152,
            energy_j=8410229.315,
            name=h100,
        ),
    ]
    assert parse_metrics(text) == {}  # no vLLM metric on a DCGM page: one parser, two readings
    mig = (
        "# TYPE DCGM_FI_DEV_FB_USED gauge\n"
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",GPU_I_PROFILE="1g.10gb",GPU_I_ID="13"} 4096\n'
        'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-a",GPU_I_PROFILE="1g.10gb",GPU_I_ID="14"} 512\n'
    )
    assert [(g.gpu, g.memory_used_mib, g.memory_total_mib) for g in parse_dcgm(mig)] == [
        ("0/13", 4096, None),
        ("0/14", 512, None),
    ]


def test_nvidia_smi_csv_with_unsupported_fields() -> None:
    assert parse_nvidia_smi(SMI_CSV) == [
        GpuSample(
            gpu="0",
            memory_used_mib=70000,
            memory_total_mib=81559,
            utilization_percent=91,
            power_w=412.5,
            name="NVIDIA H100 80GB HBM3",
        ),
        GpuSample(
            gpu="1",
            memory_used_mib=1024,
            memory_total_mib=81559,
            utilization_percent=None,
            power_w=None,
            name="Tesla T4, rev, b",
        ),  # the name, last, keeps its commas
    ]
    with pytest.raises(ValueError, match=r"not index, memory\.used"):
        parse_nvidia_smi("0, 70000 MiB\n")


# --------------------------------------------------------------------------- sources


def test_gpu_source_is_the_url_else_nvidia_smi_beside_a_loopback_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert isinstance(gpu_reader("http://127.0.0.1:9400/metrics", "http://vllm:8000"), DcgmReader)
    assert gpu_reader(None, "http://127.0.0.1:8000") is None  # no URL, no nvidia-smi: nothing GPU
    assert gpu_reader("", "http://127.0.0.1:8000") is None  # LLMLOAD_GPU_METRICS= (compose's default)

    monkeypatch.setenv("PATH", str(fake_nvidia_smi(tmp_path / "bin")))
    for here in ("http://127.0.0.1:8000", "http://localhost:8000/v1", "http://[::1]:8000", "http://127.0.1.1:80"):
        reader = gpu_reader(None, here)
        assert isinstance(reader, NvidiaSmiReader), here
    for elsewhere in ("http://vllm:8000", "http://10.0.0.5:8000", "https://api.example.com/v1"):
        assert gpu_reader(None, elsewhere) is None, elsewhere  # this machine's GPU is not the target's
    assert isinstance(gpu_reader("http://dcgm:9400/metrics", "http://127.0.0.1:8000"), DcgmReader)

    assert isinstance(reader, NvidiaSmiReader)
    assert reader.read(5) == parse_nvidia_smi(SMI_CSV)
    broken = NvidiaSmiReader(str(fake_nvidia_smi(tmp_path / "broken", "", exit_code=9) / NVIDIA_SMI))
    with pytest.raises(GpuReadError, match="exited 9: NVIDIA-SMI has failed"):
        broken.read(5)


def test_observer_samples_gpus_beside_the_server_and_a_dead_exporter_breaks_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    no_server = f"http://127.0.0.1:{free_port()}"
    with dcgm_exporter(lambda s: {"0": min(TOTAL_MIB * 0.97, 64608 + 20000 * s)}) as url:
        samples = observe_for(Observer(no_server, tmp_path / "gpu.jsonl", 0.2, gpu=DcgmReader(url)), 1.5)
    assert len(samples) >= 4
    for sample in samples:  # the GPU is read whether or not the target answers
        assert sample["health"] is None
        gpus = sample["gpus"]
        assert isinstance(gpus, list) and [g["gpu"] for g in gpus] == ["0", "1"]
        assert all(g["memory_total_mib"] == TOTAL_MIB for g in gpus)
        assert [g["utilization_percent"] for g in gpus] == [87, 81]
        assert not set(DCGM_FIELDS) & set(sample["missing"])
    summary = server_summary(read_server(tmp_path / "gpu.jsonl"))
    assert summary is not None and summary.kv_cache_usage_max is None
    assert [g.gpu for g in summary.gpus] == ["0", "1"]
    assert summary.gpus[0].memory_used_max_mib == pytest.approx(TOTAL_MIB * 0.97, abs=1)
    assert summary.gpus[1].memory_used_max_mib == 61512 and summary.gpus[1].utilization_mean_percent == 81
    assert summary.gpu_memory_usage_max == pytest.approx(0.97, abs=1e-4)

    caplog.set_level(logging.WARNING)
    dead = DcgmReader(f"http://127.0.0.1:{free_port()}/metrics")
    samples = observe_for(Observer(no_server, tmp_path / "dead.jsonl", 0.2, gpu=dead), 1.0)
    assert samples and all(s["gpus"] == [] and set(DCGM_FIELDS) <= set(s["missing"]) for s in samples)
    assert sum("no GPU metrics: the DCGM exporter at" in r.message for r in caplog.records) == 1
    summary = server_summary(read_server(tmp_path / "dead.jsonl"))
    assert summary is None  # nothing read at all: no server block, as before


# --------------------------------------------------------------------------- real runs


def climbing_past_90(seconds: float) -> dict[str, float]:
    """GPU 0 from 79% to 97% within ~5 s of the exporter's start, then flat; GPU 1 as the fixture."""
    return {"0": min(TOTAL_MIB * 0.97, FIXTURE_USED["0"] + 3000 * seconds)}


def _soak(tmp_path: Path, *flags: str) -> tuple[int, str, Path]:
    reports = tmp_path / "reports"
    proc = llmload_cli("soak", "--reports-dir", str(reports), "--run-id", "soak", *flags, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr, reports / "soak"


def test_real_runs_record_chart_and_judge_gpu_memory(tmp_path: Path) -> None:
    """Two real runs against the embedded target at once: one with GPU 0 climbing past 90% (the alert
    warns by default, and fails when asked), one under 90% through `llmload soak --alerts fail`."""
    workload = small_workload(tmp_path)
    flags = ("--target-qps", "4", "--warmup", "0")
    with dcgm_exporter(climbing_past_90) as hot_url, dcgm_exporter() as cool_url, ThreadPoolExecutor(2) as pool:
        hot = pool.submit(
            run_locust, None, workload, tmp_path / "reports", "hot", *flags, "--stages", "50,100",
            "--stage-duration", "3", "--hold-duration", "10", "--verdict", "--gpu-metrics", hot_url,
        )  # fmt: skip
        cool = pool.submit(
            _soak, tmp_path / "cool", "--workload", str(workload), *flags, "--ramp-stage-duration", "1",
            "--duration", "10s", "--alerts", "fail", "--gpu-metrics", cool_url,
        )  # fmt: skip
        run, (cool_code, cool_output, cool_dir) = hot.result(), cool.result()

    # server.jsonl: both GPUs in every sample, beside the target's own metrics; a 10 s hold cannot tell
    # whether the target keeps up, so the verdict is INCONCLUSIVE (exit 3), the GPU alert aside
    assert run.returncode == 3, run.output[-3000:]
    samples = [orjson.loads(line) for line in (run.run_dir / "server.jsonl").read_bytes().splitlines()]
    assert len(samples) >= 10
    assert all([g["gpu"] for g in s["gpus"]] == ["0", "1"] and s["health"] == 200 for s in samples)
    used = [s["gpus"][0]["memory_used_mib"] for s in samples]
    assert used == sorted(used) and used[-1] / TOTAL_MIB == pytest.approx(0.97, abs=1e-3)

    # summary.json, report.md and report.html
    server = run.summary["server"]
    assert server["gpu_memory_usage_max"] == pytest.approx(0.97, abs=1e-3)
    gpu0, gpu1 = server["gpus"]
    assert gpu0["memory_used_max_mib"] == pytest.approx(TOTAL_MIB * 0.97, abs=1)
    assert (gpu1["memory_used_max_mib"], gpu1["memory_total_mib"], gpu1["utilization_max_percent"]) == (
        61512,
        TOTAL_MIB,
        81,
    )
    markdown = (run.run_dir / "report.md").read_text()
    assert "## GPU" in markdown and "| 0 | 97% | 79,112 | 81,559 | 87 | 87 |" in markdown
    html = (run.run_dir / "report.html").read_text()
    assert re.search(r'<h2>Server: GPU memory and utilisation</h2>\s*<figure><img src="data:image/svg', html)
    assert html.index("Server: KV cache and queue") < html.index("Server: GPU memory and utilisation")

    # the soak verdict: warn by default (no check fails), fail when the criteria ask
    reasons = run.summary["verdict"]["reasons"]
    assert run.summary["verdict"]["outcome"] == "inconclusive" and run.summary["verdict"]["inconclusive_kinds"] == [
        "keeping_up"
    ]
    alert = next(r for r in reasons if "GPU memory alert" in r)
    assert alert.startswith("WARN GPU memory alert: worst 10 s window 0.97") and "> level 0.9 (warn)" in alert
    strict = SoakCriteria.model_validate({"alerts": {"actions": {"gpu_memory_used": "fail"}}})
    failed = judge(run.run_dir, strict).verdict
    assert not failed.passed
    assert any(r.startswith("FAIL GPU memory alert") for r in failed.reasons)

    # under 90%, through `llmload soak`: the flag reaches Locust, and the check passes even set to fail
    assert cool_code == 3, cool_output[-3000:]  # too short to tell, and not failed
    cool_summary = orjson.loads((cool_dir / "summary.json").read_bytes())
    assert cool_summary["server"]["gpu_memory_usage_max"] == pytest.approx(64608 / TOTAL_MIB, abs=1e-4)
    assert any(
        r.startswith("PASS GPU memory alert: worst 10 s window 0.79") for r in cool_summary["verdict"]["reasons"]
    )
