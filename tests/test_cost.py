"""What an answer costs: GPU energy per token from a DCGM exporter's energy counter (or its power
draw, integrated), the price per 1M tokens from --gpu-hour-cost or the price table, in real headless
Locust runs against the embedded target; and a CPU-only run says "no GPU energy counter", never 0.

The exporter is tests/test_gpu.py's loopback one (the CI machine has no GPU), its energy counters
advancing at a known power, so the energy the run should report is known exactly."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from llmload.cost.energy import window_energy
from llmload.cost.prices import pricing, table_entry
from llmload.cost.summary import run_price
from llmload.models import NO_ENERGY
from llmload.observe.gpu import DCGM_POWER, nvml_reader
from tests.locust_runs import LocustRun, llmload_cli, run_locust, small_workload
from tests.test_gpu import FIXTURE_USED, dcgm_page
from tests.wire_server import serve, text_pages

WATTS = {"0": 400.0, "1": 300.0}  # each GPU's draw while the exporter runs
H100 = "NVIDIA H100 80GB HBM3"  # the fixture's modelName
_SERIES = re.compile(
    r'^((DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION|DCGM_FI_DEV_POWER_USAGE)\{gpu="(\d+)"[^}]*\}) \S+$', re.M
)


def _gpu_rows(t: list[float], *, energy: list[float] | None = None, power: list[float] | None = None) -> pd.DataFrame:
    n = len(t)
    return pd.DataFrame(
        {"t": t, "gpu": ["0"] * n, "energy_j": energy or [np.nan] * n, "power_w": power or [np.nan] * n}
    )


def test_a_windows_energy_is_the_counters_growth_or_the_power_integrated() -> None:
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    counter = _gpu_rows(t, energy=[1000 + 250 * s for s in t])  # 250 W
    assert window_energy(counter, 0.5, 3.5).joules == pytest.approx(750)  # ends interpolated
    assert window_energy(counter, 0.5, 3.5).source == "counter"
    assert window_energy(counter, 3.0, 6.0).joules == pytest.approx(750)  # the uncovered end at the mean power
    reset = _gpu_rows(t, energy=[1000, 1250, 10, 260, 510])  # the driver reloaded between 1 and 2 s
    assert window_energy(reset, 0.0, 4.0).joules == pytest.approx(750)
    ramp = _gpu_rows(t, power=[100, 200, 300, 400, 500])
    assert window_energy(ramp, 1.0, 3.0).joules == pytest.approx(600)
    assert window_energy(ramp, 1.0, 3.0).source == "power"
    both = pd.concat([counter, ramp.assign(gpu="1")])
    assert (window_energy(both, 1, 3).joules, window_energy(both, 1, 3).source) == (pytest.approx(1100), "power")
    silent = pd.concat([counter, _gpu_rows(t).assign(gpu="1")])  # one GPU gave neither: no total, not a part
    assert window_energy(silent, 1, 3).joules is None
    assert window_energy(_gpu_rows([]), 1, 3).joules is None


def test_the_price_table_matches_the_most_words_of_a_gpus_name(tmp_path: Path) -> None:
    table = pricing(None, None).table
    assert table_entry("NVIDIA A100-SXM4-80GB", table) == "A100 80GB"
    assert table_entry("NVIDIA A100-SXM4-40GB", table) == "A100"
    assert table_entry("NVIDIA L40S", table) == "L40S" and table_entry("NVIDIA L4", table) == "L4"
    assert table_entry(H100, table) == "H100" and table_entry("NVIDIA GH200 480GB", table) == "GH200"
    assert table_entry("AMD Instinct MI300X", table) is None
    mine = tmp_path / "prices.yaml"
    mine.write_text("H100: 2.25\nMI300X: 2.5\n")
    priced = pricing(None, str(mine))
    assert priced.table["H100"] == 2.25 and priced.table["MI300X"] == 2.5 and priced.table["T4"] == table["T4"]
    price = run_price(priced, [H100, H100])
    assert (price.usd_per_hour, price.gpu_hour_usd) == (4.5, 2.25)
    assert price.source == f"{mine} over llmload's table (llmload/cost/gpu_prices.yaml): H100 $2.25"
    unknown = run_price(pricing(None, None), [H100, "Mystery GPU"])
    assert unknown.usd_per_hour is None and "no price for Mystery GPU" in (unknown.note or "")
    assert run_price(pricing(1.5, None), []).usd_per_hour == 1.5  # no GPU: the flag prices the server's hour
    assert run_price(pricing(None, None), []).usd_per_hour is None


@contextmanager
def energy_exporter(*, counters: bool, times: float = 1.0) -> Iterator[str]:
    """The loopback DCGM exporter, its GPUs drawing WATTS (× `times`): the energy counters (mJ) grow at
    that rate from their fixture values, or (counters=False) the page has no counter, only power."""
    started = time.monotonic()

    def page(path: str) -> str | None:
        if path != "/metrics":
            return None
        elapsed = time.monotonic() - started

        def value(match: re.Match[str]) -> str:
            watts = WATTS[match.group(3)] * times
            if match.group(2) == DCGM_POWER:
                return f"{match.group(1)} {watts:.3f}"
            return f"{match.group(1)} {8.8e9 + watts * elapsed * 1000:.0f}" if counters else ""

        return _SERIES.sub(value, dcgm_page(FIXTURE_USED))

    with serve(text_pages(page)) as url:
        yield f"{url}/metrics"


def _judged_output_tokens(run: LocustRun) -> float:
    records = run.records
    judged = {s["name"] for s in run.manifest["stages"] if not s["warmup"]}
    return float(records.output_tokens[(records.status == "ok") & records.stage.isin(judged)].sum())


def test_real_runs_report_energy_and_price_per_token_and_a_cpu_run_says_it_has_no_counter(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    flags = ("--target-qps", "4", "--warmup", "0", "--stages", "50,100", "--stage-duration", "3",
             "--hold-duration", "6")  # fmt: skip
    reports = tmp_path / "reports"
    bad_prices = tmp_path / "bad-prices.yaml"
    bad_prices.write_text("H100: 2.5\nA100: free\n")
    with (
        energy_exporter(counters=True) as counted,
        energy_exporter(counters=False) as powered,
        energy_exporter(counters=True, times=2) as hot,
        ThreadPoolExecutor(4) as pool,
    ):
        runs = [
            pool.submit(run_locust, None, workload, reports, "counter", *flags, "--gpu-metrics", counted),
            pool.submit(
                run_locust, None, workload, reports, "power", *flags, "--gpu-metrics", powered, "--gpu-hour-cost", "2"
            ),
            pool.submit(run_locust, None, workload, reports, "cpu", *flags, "--gpu-hour-cost", "0.5"),
            pool.submit(run_locust, None, workload, reports, "hot", *flags, "--gpu-metrics", hot),
        ]
        counter_run, power_run, cpu_run, hot_run = (run.result() for run in runs)
        refused = run_locust(None, workload, reports, "refused", *flags, "--gpu-prices", str(bad_prices))

    # the counters: 700 W over each stage and the hold, priced by the table's H100 entry
    assert counter_run.returncode == 0, counter_run.output[-3000:]
    cost = counter_run.summary["cost"]
    assert (cost["gpu_count"], cost["gpu_kinds"], cost["energy_source"]) == (2, [H100], "counter")
    hold = cost["hold"]
    assert hold["seconds"] == pytest.approx(9.0, abs=0.05)
    assert hold["energy_j"] == pytest.approx(700 * hold["seconds"], rel=0.02)
    for stage in cost["stages"]:
        assert stage["energy_j"] == pytest.approx(700 * stage["seconds"], rel=0.03), stage
    tokens = _judged_output_tokens(counter_run)
    assert tokens > 0 and hold["output_tokens"] == tokens
    assert hold["joules_per_output_token"] == pytest.approx(hold["energy_j"] / tokens)
    assert hold["output_tokens_per_kj"] == pytest.approx(1000 * tokens / hold["energy_j"])
    assert (
        cost["gpu_hour_usd"] == 3.0
        and cost["price_source"] == "llmload's table (llmload/cost/gpu_prices.yaml): H100 $3"
    )
    assert hold["usd"] == pytest.approx(2 * 3.0 * hold["seconds"] / 3600)
    assert hold["usd_per_1m_output_tokens"] == pytest.approx(hold["usd"] / tokens * 1e6)
    assert hold["usd_per_1m_input_tokens"] == pytest.approx(hold["usd"] / hold["input_tokens"] * 1e6)
    assert counter_run.manifest["pricing"]["table"]["H100"] == 3.0  # the table in force, for a later rebuild
    markdown = (counter_run.run_dir / "report.md").read_text()
    assert f"from the energy counters of 2 GPUs ({H100})" in markdown and "J per output token" in markdown
    assert "## Cost by stage" in markdown and "| judged stages | 9 |" in markdown
    assert "J per output token" in (counter_run.run_dir / "report.html").read_text()

    # power only: the same energy, integrated; the flag's price per GPU
    assert power_run.returncode == 0, power_run.output[-3000:]
    cost = power_run.summary["cost"]
    assert cost["energy_source"] == "power"
    assert cost["hold"]["energy_j"] == pytest.approx(700 * cost["hold"]["seconds"], rel=0.02)
    assert (cost["gpu_hour_usd"], cost["price_source"]) == (2.0, "--gpu-hour-cost")
    assert cost["hold"]["usd"] == pytest.approx(2 * 2.0 * cost["hold"]["seconds"] / 3600)

    # no GPU: no energy figure at all, never 0 J, and the flag prices the server's hour
    assert cpu_run.returncode == 0, cpu_run.output[-3000:]
    if nvml_reader() is None and shutil.which("nvidia-smi") is None:  # a machine with a GPU would read it
        cost = cpu_run.summary["cost"]
        assert (cost["gpu_count"], cost["energy_source"], cost["energy_note"]) == (None, None, NO_ENERGY)
        assert all(s["energy_j"] is None and s["joules_per_output_token"] is None for s in cost["stages"])
        assert cost["hold"]["usd"] == pytest.approx(0.5 * cost["hold"]["seconds"] / 3600)
        assert cost["price_source"] == "--gpu-hour-cost, as the server's hour (no GPU was seen)"
        markdown = (cpu_run.run_dir / "report.md").read_text()
        assert f"Energy: {NO_ENERGY}; no J per token." in markdown and " 0 J" not in markdown

    # compare: twice the power for the same tokens is a J-per-token regression, and the price is the same;
    # the same energy priced lower is none
    assert hot_run.returncode == 0, hot_run.output[-3000:]
    worse = llmload_cli("compare", str(counter_run.run_dir), str(hot_run.run_dir), timeout=120)
    assert worse.returncode == 1, worse.stdout + worse.stderr
    assert re.search(r"J per output token \(J\) .* REGRESSION", worse.stdout), worse.stdout
    assert re.search(r"\$ per 1M output tokens \(\$\) .* ok", worse.stdout), worse.stdout
    assert "REGRESSION in J per output token:" in worse.stdout
    same = llmload_cli("compare", str(counter_run.run_dir), str(power_run.run_dir), timeout=120)
    assert same.returncode == 0, same.stdout + same.stderr
    assert re.search(r"J per output token \(J\) .* ok", same.stdout), same.stdout
    no_gpu = llmload_cli("compare", str(counter_run.run_dir), str(cpu_run.run_dir), timeout=120)
    assert "J per output token" not in no_gpu.stdout  # a figure one run lacks is not compared

    # a bad price file: refused before any request, by file and line
    assert refused.returncode == 2, refused.output[-3000:]
    assert f"{bad_prices}:2: 'A100': the price must be a positive number of USD per GPU-hour" in refused.output
    assert not (reports / "refused" / "requests.jsonl").exists()
