"""sweep.json's contract: a configuration sweep's rows, and which configuration to ship."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmload.models.search import ParetoPoint, SearchOutcome, answer_words
from llmload.models.serving import ConfigValue
from llmload.models.summary import StageFigures

# --------------------------------------------------------------------------- configuration sweep (sweep.json)

SweepMode = Literal["search", "soak"]
ServerStart = Literal["started", "did_not_start", "interrupted"]


class SweepRow(StageFigures):
    """One configuration of a sweep: how its server started and what its search or soak showed (its figures:
    the stage at measured_at_qps)."""

    name: str = Field(description="also its directory under the sweep's")
    varied: dict[str, ConfigValue] = Field(description="the settings that differ between the sweep's configurations")
    server: ServerStart | None = Field(default=None, description="None: not tried yet")
    startup_s: float | None = None
    reason: str | None = Field(default=None, description="why the server did not start, from its log")
    predicted_startup: str | None = Field(
        default=None, description="what llmload capacity said of the config before it started"
    )
    kv_cache_tokens: int | None = Field(default=None, description="vLLM's startup line 'KV cache size: N tokens'")
    max_concurrency: float | None = Field(default=None, description="vLLM's 'Maximum concurrency for N tokens'")
    concurrency_tokens: int | None = None
    kv_cache_gib: float | None = Field(default=None, description="the memory vLLM gave the KV cache, when logged")
    cache_note: str | None = Field(
        default=None, description="search: whether each probe began with an empty prefix cache"
    )
    outcome: SearchOutcome | None = Field(default=None, description="search mode: how its search ended")
    passing_qps: float | None = Field(default=None, description="search: the highest passing rate; soak: the target")
    failing_qps: float | None = None
    failing_reason: str | None = None
    passed: bool | None = Field(default=None, description="search: passes at --require-qps; soak: its verdict")
    inconclusive: bool = Field(
        default=False, description="soak: INCONCLUSIVE (never a pass); search: no probe could tell"
    )
    verdict_reasons: list[str] = Field(default_factory=list, description="the checks that failed")
    measured_at_qps: float | None = Field(default=None, description="the rate the figures below were measured at")
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    gpu_memory_usage_max: float | None = None
    spec_acceptance_rate: float | None = Field(
        default=None, description="a configuration that speculates: accepted / drafted tokens in the run measured"
    )
    spec_acceptance_length: float | None = Field(default=None, description="tokens a drafting step emitted there")
    reports: list[str] = Field(default_factory=list, description="each probe's or the soak's report, relative")
    predicted_qps: float | None = Field(default=None, description="--predict: the simulator's answer for this config")
    predicted_passed: bool | None = None
    predicted_reason: str | None = Field(default=None, description="--predict: why the simulator did not start")
    prediction_warnings: list[str] = Field(
        default_factory=list,
        description="what the simulator said of its prediction for this config (its steps past the KV calibrated)",
    )

    @property
    def answer(self) -> str:
        return answer_words(self.passing_qps, self.outcome)

    @property
    def prediction_ratio(self) -> float | None:
        """Measured / predicted passing rate: 1.0 is a perfect prediction."""
        if self.passing_qps is None or not self.predicted_qps or self.server != "started":
            return None
        return self.passing_qps / self.predicted_qps


class SweepResult(BaseModel):
    """sweep.json: every configuration tried, and which to ship."""

    sweep_id: str
    mode: SweepMode
    serve: str = Field(description="the --serve template; for a prediction, the simulator's")
    predicted: bool = Field(default=False, description="the embedded target stood in for the server")
    workload: str
    target_qps: float | None = None
    required_qps: float | None = None
    latency_slo: bool = Field(default=False, description="the gate holds latency to an SLO (SearchResult's)")
    started_at: float
    finished_at: float | None = None
    interrupted: bool = False
    rows: list[SweepRow] = Field(default_factory=list)
    best: str | None = None
    best_why: str | None = None
    pareto: list[ParetoPoint] = Field(
        default_factory=list, description="every probe (soak: every configuration) with its figures, frontier marked"
    )
