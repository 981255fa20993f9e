"""Fit the roofline's global constants (llmload/perf/efficiency.yaml) on the public points.

`python -m benchmarks.prediction_fit [--write]`: minimises the sum over the points' figures of
log²(predicted / measured), each figure a source printed (throughput as output tokens/s or a batch's
time, mean TTFT, mean TPOT, mean ITL; request and total throughput are left out, being the same
measurement again), over the constants within physical bounds (Powell's method, scipy). One set of
constants for every model and GPU: nothing is fitted per point. Prints the constants and the loss;
--write puts them in efficiency.yaml. Not part of `make bench` (docs/prediction.md regenerates from
the constants in force).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import minimize

from llmload.perf import derive
from llmload.perf.roofline import EFFICIENCY, EFFICIENCY_FILE, Efficiency
from llmload.predict.points import load_points, predict_point

POINTS = Path(__file__).parent.parent / "tests" / "data" / "gputruth" / "points.yaml"
FITTED = ("output_tok_per_s", "e2e_batch_ms", "ttft_mean_ms", "tpot_mean_ms", "itl_mean_ms")
# name: (low, high) — what a kernel or a step can physically be
BOUNDS: dict[str, tuple[float, float]] = {
    "hbm": (0.5, 0.95),
    "compute": (0.25, 0.85),
    "layer_us": (0.0, 150.0),
    "step_ms": (0.0, 5.0),
    "seq_us": (0.0, 200.0),
    "api_server_ms": (0.0, 40.0),
    "frontend_ms": (0.0, 60.0),
}


def loss(values: np.ndarray, points: list, base: Path, trace: list[float]) -> float:
    constants = EFFICIENCY.model_copy(update=dict(zip(BOUNDS, map(float, values), strict=True)))
    derive.EFFICIENCY = constants
    total = 0.0
    for point in points:
        ratios = predict_point(point, base).ratios
        total += sum(math.log(ratios[f]) ** 2 for f in FITTED if f in ratios)
    trace.append(total)
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="write the fitted constants to efficiency.yaml")
    parser.add_argument("--max-evaluations", type=int, default=200)
    args = parser.parse_args(argv)
    points = load_points(POINTS)
    start = np.array([getattr(EFFICIENCY, name) for name in BOUNDS])
    trace: list[float] = []
    began = time.time()
    result = minimize(
        loss, start, args=(points, POINTS.parent, trace), method="Powell",
        bounds=list(BOUNDS.values()), options={"maxfev": args.max_evaluations, "xtol": 1e-3, "ftol": 1e-4},
    )  # fmt: skip
    fitted = dict(zip(BOUNDS, (round(float(v), 4) for v in result.x), strict=True))
    print(f"loss {trace[0]:.3f} -> {result.fun:.3f} in {len(trace)} evaluations, {time.time() - began:.0f} s")
    for name, value in fitted.items():
        print(f"  {name}: {value}")
    if args.write:
        data = yaml.safe_load(EFFICIENCY_FILE.read_text())
        data.update(fitted)
        data["fitted_on"] = (
            f"{len(points)} public points of tests/data/gputruth (python -m benchmarks.prediction_fit): "
            f"sum of log² predicted/measured {result.fun:.3f}"
        )
        Efficiency.model_validate(data)
        header = "".join(line for line in EFFICIENCY_FILE.read_text().splitlines(keepends=True) if line.startswith("#"))
        EFFICIENCY_FILE.write_text(header + yaml.safe_dump(data, sort_keys=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
