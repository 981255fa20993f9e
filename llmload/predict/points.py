"""Measured points of vLLM on GPUs, predicted and compared: how far `llmload predict` is from the truth.

A points file (tests/data/gputruth/points.yaml is the public one) lists benchmarks someone ran: the
server's `vllm serve --config` file, the GPU, the load (`vllm bench serve`'s lengths, number of
prompts, concurrency or rate; `vllm bench latency`'s batch) and the figures it printed. Each is
predicted with the server described by its config and GPU alone (`resolve_profile`: vLLM's
defaults for what the file leaves out, the timing derived) and the ratio predicted / measured
given per figure. `llmload predict --points FILE` prints them; docs/prediction.md holds the table.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from pathlib import Path

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from llmload.models import Strict
from llmload.predict.bench import BenchLoad, BenchResult, predict_bench
from llmload.server.serve_config import read_serve_config
from llmload.sim.profiles import resolve_profile
from llmload.yamlfile import load_yaml_model

Length = PositiveInt | tuple[PositiveInt, PositiveInt]


class PointLoad(Strict):
    """The benchmark's load: fixed lengths, or [min, max] where the source gave a spread."""

    requests: PositiveInt
    input: Length
    output: Length
    concurrency: PositiveInt | None = None
    request_rate: PositiveFloat | None = Field(default=None, description="requests/s; absent: all at once")


class MeasuredPoint(Strict):
    """One public measurement: what ran, where, and what it printed."""

    id: str
    source: str
    engine: str
    setup: str
    config: Path = Field(description="the server's `vllm serve --config` file, relative to the points file")
    gpu: str
    load: PointLoad
    measured: dict[str, PositiveFloat]
    approximate: str | None = Field(default=None, description="what the load only approximates, and why")


class PointsFile(Strict):
    points: list[MeasuredPoint]


# What a source prints, as the prediction's figure: `vllm bench serve`'s means, and `vllm bench latency`'s
# batch time (e2e_batch_ms: the batch sent at once to the LLM class, until its last token).
FIGURES: dict[str, Callable[[BenchResult], float]] = {
    "req_per_s": lambda r: r.request_throughput,
    "output_tok_per_s": lambda r: r.output_throughput,
    "total_tok_per_s": lambda r: r.total_token_throughput,
    "ttft_mean_ms": lambda r: r.ttft_ms.mean,
    "tpot_mean_ms": lambda r: r.tpot_ms.mean,
    "itl_mean_ms": lambda r: r.itl_ms.mean,
    "e2e_batch_ms": lambda r: r.duration_s * 1000,
}
OFFLINE_FIGURES = frozenset({"e2e_batch_ms"})  # `vllm bench latency`: the LLM class, no API server


class PointPrediction(Strict):
    """One point: its figures measured and predicted, and their ratio predicted / measured."""

    point: MeasuredPoint
    timing: str = Field(description="how the server was timed (the derivation, or the calibration)")
    kv_cache_tokens: PositiveInt
    predicted: dict[str, NonNegativeFloat]
    ratios: dict[str, NonNegativeFloat]


def bench_load(point: MeasuredPoint) -> BenchLoad:
    """The point's load as `vllm bench serve` flags: a [min, max] length as its middle ± the ratio."""

    def middle(length: Length) -> tuple[int, float]:
        if isinstance(length, int):
            return length, 0.0
        low, high = length
        return round((low + high) / 2), (high - low) / (high + low)

    (input_len, input_ratio), (output_len, output_ratio) = middle(point.load.input), middle(point.load.output)
    return BenchLoad(
        input_len=input_len,
        output_len=output_len,
        num_prompts=point.load.requests,
        random_range_ratio=max(input_ratio, output_ratio),
        request_rate=point.load.request_rate or math.inf,
        max_concurrency=point.load.concurrency,
        offline=bool(OFFLINE_FIGURES & point.measured.keys()),
    )


def predict_point(point: MeasuredPoint, base: Path) -> PointPrediction:
    """The point predicted from its config file (relative to `base`) and GPU."""
    serving = read_serve_config(base / point.config)
    profile, plan = resolve_profile(None, serving, gpu_name=point.gpu)
    result = predict_bench(profile, plan.cache.num_blocks, bench_load(point))
    predicted = {name: FIGURES[name](result) for name in point.measured if name in FIGURES}
    return PointPrediction(
        point=point,
        timing=profile.calibration,
        kv_cache_tokens=plan.vllm_log_kv_cache_tokens,
        predicted=predicted,
        ratios={name: predicted[name] / point.measured[name] for name in predicted},
    )


def load_points(path: Path) -> list[MeasuredPoint]:
    """A points file's points (InputError naming the file and line of a bad entry)."""
    return load_yaml_model(path, PointsFile).points


class FigureAccuracy(Strict):
    """One figure over the points that measured it: the ratios' median, the worst, and how many fall in band."""

    figure: str
    points: PositiveInt
    median_ratio: PositiveFloat
    worst_ratio: PositiveFloat = Field(description="the ratio farthest from 1, either way")
    band: tuple[float, float]
    within_band: int


# The bands the issue sets: throughput and TPOT within 0.8-1.25, TTFT within 0.67-1.5.
BANDS: dict[str, tuple[float, float]] = {
    "req_per_s": (0.8, 1.25),
    "output_tok_per_s": (0.8, 1.25),
    "total_tok_per_s": (0.8, 1.25),
    "tpot_mean_ms": (0.8, 1.25),
    "itl_mean_ms": (0.8, 1.25),
    "e2e_batch_ms": (0.8, 1.25),
    "ttft_mean_ms": (0.67, 1.5),
}


def accuracy(predictions: list[PointPrediction]) -> list[FigureAccuracy]:
    """Per figure, in FIGURES' order: how the predictions compare with what was measured."""
    rows = []
    for figure in FIGURES:
        ratios = [p.ratios[figure] for p in predictions if figure in p.ratios]
        if not ratios:
            continue
        low, high = BANDS[figure]
        rows.append(
            FigureAccuracy(
                figure=figure,
                points=len(ratios),
                median_ratio=statistics.median(ratios),
                worst_ratio=max(ratios, key=lambda r: abs(math.log(r))),
                band=(low, high),
                within_band=sum(low <= r <= high for r in ratios),
            )
        )
    return rows
