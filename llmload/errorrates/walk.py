"""How calm a saturated queue's random walk can look: the quantiles behind `verdict.WALK_CALM_QUANTILE`.

Keeping up rules out a saturated server when its requests in flight stay far calmer about their line
than a saturated server's would. The calmest such series is a walk held at zero: a queue right at its
capacity that starts empty (one with more load drifts away from zero and wanders freely). This simulates
it as the verdict sees it (per-window means of a reflected Brownian motion, a least-squares line taken
out) and gives the quantile of its residual variance over L/15 × its variance per second (a free walk's
expectation), by the number of windows. A one-slot server at 1.1× its capacity passed 11% of 30-minute
soaks when this was a free walk's quantile: near zero its queue is calmer than a free walk.
"""

from __future__ import annotations

import numpy as np

STEPS_PER_WINDOW = 20


def calm_quantiles(windows: tuple[int, ...], quantile: float, paths: int = 20_000, seed: int = 0) -> list[float]:
    rng = np.random.default_rng(seed)
    out = []
    for n in windows:
        steps = rng.normal(size=(paths, n * STEPS_PER_WINDOW)) / np.sqrt(STEPS_PER_WINDOW)
        means = np.abs(np.cumsum(steps, axis=1)).reshape(paths, n, STEPS_PER_WINDOW).mean(axis=2)
        x = np.column_stack([np.ones(n), np.arange(n) + 0.5])
        fitted = x @ np.linalg.lstsq(x, means.T, rcond=None)[0]
        residuals = means - fitted.T
        calm = (residuals**2).sum(axis=1) / (n - 2) / (n / 15)
        out.append(float(np.quantile(calm, quantile)))
    return out
