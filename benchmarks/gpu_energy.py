"""J per output token on a real GPU against NVML's energy counter read directly (issue 38's check:
within 5%). A `llmload soak` against the embedded target runs on a machine with an NVIDIA GPU, so the
run reads this machine's GPUs through NVML; while it runs, a busy loop keeps GPU 0 drawing (torch, when
installed) and this script reads every GPU's total-energy counter itself, ten times a second. Each stage's
energy from the run's summary is set against the counter's growth over the stage's window read here,
and J per output token against that energy over the same tokens. Without a GPU it says so and stops.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tests.locust_runs import llmload_cli

TOLERANCE = 0.05
BURNER = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    t0 = time.time()
    while time.time() - t0 < 0.5:
        a @ a
    torch.cuda.synchronize()
    time.sleep(0.5)
"""


def _read_counters(nvml: Any, stop: threading.Event, out: list[tuple[float, float]]) -> None:
    """Every GPU's counter summed (J), with the time it was read, until `stop`."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    while not stop.is_set():
        total = sum(nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles) / 1000
        out.append((time.time(), total))
        stop.wait(0.1)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--duration", default="60s", help="the soak's hold")
    args = parser.parse_args(argv)
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: nothing to check here
        print(f"\n### GPU energy: skipped (no NVML: {exc})\n")
        return
    counters: list[tuple[float, float]] = []
    stop = threading.Event()
    reader = threading.Thread(target=_read_counters, args=(pynvml, stop, counters), daemon=True)
    burner = subprocess.Popen([sys.executable, "-c", BURNER, "200"], stderr=subprocess.DEVNULL)
    reader.start()
    with tempfile.TemporaryDirectory() as tmp:
        proc = llmload_cli(
            "soak", "--target-qps", "4", "--ramp-stage-duration", "10", "--duration", args.duration, "--warmup", "0",
            "--reports-dir", tmp, "--run-id", "energy", timeout=900,
        )  # fmt: skip
        stop.set()
        burner.terminate()
        run = Path(tmp) / "energy"
        summary = orjson.loads((run / "summary.json").read_bytes())
        manifest = orjson.loads((run / "run.json").read_bytes())
    t, joules = (np.array(column) for column in zip(*counters, strict=True))
    cost = summary["cost"]
    print(f"\n### GPU energy: llmload's figures against NVML read directly ({cost['gpu_kinds']}, soak exit"
          f" {proc.returncode})\n")  # fmt: skip
    print("| stage | s | energy kJ (llmload) | energy kJ (NVML) | J / output token (llmload) | (NVML) | difference |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    worst = 0.0
    for stage, planned in zip(cost["stages"], manifest["stages"], strict=True):
        start = manifest["started_at"] + planned["start_s"]
        direct = float(np.interp(start + planned["duration_s"], t, joules) - np.interp(start, t, joules))
        mine = stage["energy_j"]
        difference = (mine - direct) / direct if mine is not None and direct > 0 else float("inf")
        worst = max(worst, abs(difference))
        tokens = stage["output_tokens"]
        cells = [stage["name"], f"{stage['seconds']:.0f}", _kilo(mine), _kilo(direct), _per(mine, tokens),
                 _per(direct, tokens), f"{100 * difference:+.2f}%"]  # fmt: skip
        print("| " + " | ".join(cells) + " |")
    verdict = "PASS" if worst <= TOLERANCE else "FAIL"
    print(f"\nWorst difference {100 * worst:.2f}% (limit {100 * TOLERANCE:.0f}%): {verdict}")


def _kilo(joules: float | None) -> str:
    return "–" if joules is None else f"{joules / 1000:.3f}"


def _per(joules: float | None, tokens: float) -> str:
    return "–" if joules is None or not tokens else f"{joules / tokens:.4f}"


if __name__ == "__main__":
    main(sys.argv[1:])
