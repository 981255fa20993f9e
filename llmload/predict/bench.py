"""What `vllm bench serve` would print for a server, predicted without one.

`predict_bench` draws the benchmark's requests as vLLM's random dataset does (input and output
lengths uniform in len × [1 − r, 1 + r], prompts that share no prefix, every answer exactly its
output length, as `--ignore-eos` makes it), sends them as its client does (all at once for a rate
of inf, else a Poisson process, or gamma with `burstiness`, at most `max_concurrency` in flight),
and runs them through the simulator's engine on a virtual clock (llmload.sim.engine.replay). The
figures are those `vllm bench serve` prints, under its names (vllm/benchmarks/serve.py): request
and token throughput, and mean/median/p99 TTFT, TPOT, ITL and E2EL in milliseconds.
"""

from __future__ import annotations

import math

import numpy as np
from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from llmload.models import Strict
from llmload.sim.engine import Arrival, replay
from llmload.sim.profiles import EngineProfile

PERCENTILES = (50, 99)  # vllm bench serve's default --metric-percentiles is 99; median is printed beside mean


class BenchLoad(Strict):
    """A `vllm bench serve --dataset-name random` load, under its flags' names."""

    input_len: PositiveInt = Field(description="--random-input-len: prompt tokens per request")
    output_len: PositiveInt = Field(description="--random-output-len: output tokens per request (--ignore-eos)")
    num_prompts: PositiveInt = 1000
    random_range_ratio: float = Field(default=0.0, ge=0, lt=1, description="lengths uniform in len × [1 − r, 1 + r]")
    request_rate: PositiveFloat = Field(default=math.inf, description="requests/s; inf: all at once")
    burstiness: PositiveFloat = Field(default=1.0, description="gamma shape of the gaps; 1: Poisson")
    max_concurrency: PositiveInt | None = Field(default=None, description="requests in flight at most")
    offline: bool = Field(
        default=False,
        description="the LLM class of `vllm bench latency`/`throughput`: no API server in front of the engine",
    )
    seed: int = 0


class Percentiles(Strict):
    """One latency's mean, median and p99 over the benchmark's requests (or tokens, for ITL), ms."""

    mean: NonNegativeFloat
    median: NonNegativeFloat
    p99: NonNegativeFloat


class BenchResult(Strict):
    """The figures `vllm bench serve` prints (its JSON's names), predicted."""

    completed: NonNegativeInt
    duration_s: PositiveFloat = Field(description="from the first request sent to the last token")
    total_input_tokens: NonNegativeInt
    total_output_tokens: NonNegativeInt
    request_throughput: NonNegativeFloat = Field(description="requests/s")
    output_throughput: NonNegativeFloat = Field(description="output tokens/s")
    total_token_throughput: NonNegativeFloat = Field(description="input + output tokens/s")
    ttft_ms: Percentiles
    tpot_ms: Percentiles = Field(description="per request: (E2E − TTFT) / (output − 1)")
    itl_ms: Percentiles = Field(description="every gap between two tokens of a request")
    e2el_ms: Percentiles
    preemptions: NonNegativeInt
    mean_running: NonNegativeFloat = Field(description="requests the engine ran at once, averaged over its busy time")

    def vllm_json(self) -> dict[str, float]:
        """The keys of `vllm bench serve --save-result`'s JSON that this predicts."""
        flat: dict[str, float] = {
            "completed": self.completed,
            "duration": self.duration_s,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            figures: Percentiles = getattr(self, f"{name}_ms")
            flat |= {
                f"mean_{name}_ms": figures.mean,
                f"median_{name}_ms": figures.median,
                f"p99_{name}_ms": figures.p99,
            }
        return flat


def lengths(load: BenchLoad, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Input and output lengths per request, as vLLM's RandomDataset draws them (integers uniform in
    [len × (1 − r), len × (1 + r)], at least 1)."""

    def draw(mean: int) -> np.ndarray:
        low, high = (
            max(1, math.floor(mean * (1 - load.random_range_ratio))),
            math.ceil(mean * (1 + load.random_range_ratio)),
        )
        return rng.integers(low, high + 1, size=load.num_prompts)

    return draw(load.input_len), draw(load.output_len)


def send_times(load: BenchLoad, rng: np.random.Generator) -> np.ndarray:
    """When each request is ready to go (s): 0 for a rate of inf, else the cumulative gamma gaps of
    mean 1 / rate and shape `burstiness` (vLLM's get_request), the first at 0."""
    if math.isinf(load.request_rate):
        return np.zeros(load.num_prompts)
    scale = 1 / (load.request_rate * load.burstiness)
    gaps = rng.gamma(load.burstiness, scale, size=load.num_prompts)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _percentiles(values: np.ndarray) -> Percentiles:
    if values.size == 0:
        return Percentiles(mean=0.0, median=0.0, p99=0.0)
    return Percentiles(mean=float(values.mean()), median=float(np.median(values)), p99=float(np.percentile(values, 99)))


def predict_bench(profile: EngineProfile, num_blocks: int, load: BenchLoad) -> BenchResult:
    """The benchmark `load` against the server `profile` describes (its KV pool `num_blocks`), on a
    virtual clock: seconds of CPU for minutes of load. ValueError when a prompt can never fit."""
    if load.offline:
        timing = profile.step_timing.model_copy(update={"api_server_ms": 0.0, "frontend_ms": 0.0})
        profile = profile.model_copy(update={"timing": timing})
    rng = np.random.default_rng(load.seed)
    inputs, outputs = lengths(load, rng)
    at = send_times(load, rng)
    arrivals = [Arrival(float(at[i]), [i + 1] * int(inputs[i]), int(outputs[i])) for i in range(load.num_prompts)]
    run = replay(profile, num_blocks, arrivals, load.max_concurrency)
    start = float(min(run.sent_s))
    ttft: list[float] = []
    tpot: list[float] = []
    itl: list[float] = []
    e2e: list[float] = []
    for sent, times in zip(run.sent_s, run.token_times, strict=True):
        ttft.append(times[0] - sent)
        e2e.append(times[-1] - sent)
        if len(times) > 1:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))
            itl.extend(np.diff(times))
    duration = max(times[-1] for times in run.token_times) - start
    total_in, total_out = int(inputs.sum()), int(outputs.sum())
    ms = 1000.0
    return BenchResult(
        completed=load.num_prompts,
        duration_s=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=load.num_prompts / duration,
        output_throughput=total_out / duration,
        total_token_throughput=(total_in + total_out) / duration,
        ttft_ms=_percentiles(np.array(ttft) * ms),
        tpot_ms=_percentiles(np.array(tpot) * ms),
        itl_ms=_percentiles(np.array(itl) * ms),
        e2el_ms=_percentiles(np.array(e2e) * ms),
        preemptions=run.preemptions,
        mean_running=run.mean_running,
    )
