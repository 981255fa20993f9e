"""summary.json's contract: a run's counts, latency, throughput, stages, server figures, cost and verdict."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from llmload.models.run import AccessNote, CancelNote, FleetWorker, GoodputSLO, ServerRelease
from llmload.models.serving import ServerIdentity
from llmload.models.strict import Strict
from llmload.models.verdict import Verdict
from llmload.models.workload import ReusablePrefix, ShareSpread

# --------------------------------------------------------------------------- summary


class Percentiles(BaseModel):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    mean: float | None = None
    max: float | None = None
    count: int = 0


class TokenPercentiles(BaseModel):
    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


class RequestCounts(BaseModel):
    """The judged stages' requests (scheduled = ok + failed + unfinished + cancelled + abandoned + not_sent +
    lost); the warm-up's are counted apart, so scheduled + warmup is every record of the run."""

    scheduled: int
    sent: int
    ok: int
    failed: int
    unfinished: int = Field(default=0, description="still running when the drain ended: the target fell behind")
    cancelled: int = 0
    abandoned: int = Field(default=0, description="cut by the plan (--cancel-share), as a user closing a tab")
    not_sent: int
    lost: int = Field(default=0, description="lost with a distributed run's worker: in flight, or due and never sent")
    warmup: int = 0


class LatencySummary(BaseModel):
    ttft: Percentiles
    itl: Percentiles
    tpot: Percentiles
    e2e: Percentiles
    schedule_delay: Percentiles
    ttft_from_schedule: Percentiles
    e2e_from_schedule: Percentiles
    ttfo: Percentiles | None = Field(
        default=None, description="time to first answer token; only when the run had reasoning (docs/metrics.md)"
    )

    def headline(self) -> list[tuple[str, Percentiles]]:
        """The per-request latencies as every report lists them, TTFO only when the run had reasoning."""
        ttfo = [] if self.ttfo is None else [("TTFO", self.ttfo)]
        return [("TTFT", self.ttft), *ttfo, ("ITL", self.itl), ("TPOT", self.tpot), ("E2E", self.e2e)]


class Goodput(BaseModel):
    """Requests meeting every goodput SLO, per second; cancelled requests are in neither figure."""

    requests_per_s: float
    output_tokens_per_s: float
    slo_attainment: float | None = Field(description="good / answered (ok + failed + unfinished); None: none answered")


class Throughput(BaseModel):
    requests_per_s: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    goodput: Goodput | None = Field(default=None, description="with a goodput SLO (run.goodput_slo)")


class TokenSummary(BaseModel):
    prompt: TokenPercentiles
    output: TokenPercentiles


class ReasoningSummary(BaseModel):
    """What the successful requests thought before answering; in a summary only when some did."""

    requests: int = Field(description="successful requests that streamed any reasoning")
    reasoning_tokens: TokenPercentiles = Field(description="per successful request, those without reasoning as 0")
    reasoning_tokens_mean: float
    answer_tokens: TokenPercentiles
    counted: int = Field(description="requests whose reasoning count came from the chunks, not the server's usage")


class StageSummary(BaseModel):
    name: str
    target_qps: float
    offered_qps: float
    achieved_qps: float
    duration_s: float
    scheduled: int
    ok: int
    failed: int
    unfinished: int = 0
    cancelled: int = 0
    abandoned: int = 0
    not_sent: int
    lost: int = Field(default=0, description="its arrivals lost with a worker (RequestCounts.lost)")
    schedule_delay_p99_ms: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    ttfo_p50_ms: float | None = Field(default=None, description="only when the run had reasoning")
    ttfo_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None
    e2e_mean_ms: float | None = Field(description="of its successful requests: Little's law takes the mean")
    itl_p50_ms: float | None = Field(description="of every gap of its successful requests pooled (as latency_ms.itl)")
    tpot_p50_ms: float | None = Field(
        default=None, description="of its successful requests: 1000 / it is the tokens a second one user sees"
    )
    preemptions: float | None = Field(
        description="vLLM's preemptions counter's increase over the stage's window (server.jsonl); None unread"
    )
    output_tokens_per_s: float = Field(default=0.0, description="output tokens of successful requests / its seconds")
    prompt_tokens_p50: float | None = None
    prompt_tokens_p99: float | None = None
    turn_mix: dict[str, float] = Field(
        default_factory=dict, description="share of the stage's sent requests by turn number (1, 2, ... '8+')"
    )
    warmup: bool = False
    goodput: Goodput | None = Field(
        default=None, description="of the requests sent in the stage's window, per second of the stage"
    )
    shortfall: bool = Field(
        description="fewer requests sent in the stage than 98% of its target (rounded down), or schedule delay"
        " p99 > 100 ms"
    )


class StageFigures(BaseModel):
    """One stage's headline figures, which a search's probe and a sweep's row carry beside their own
    (flat in search.json and sweep.json), taken from the stage by `of` alone."""

    goodput_qps: float | None = Field(default=None, description="with a goodput SLO: good requests per second")
    output_tokens_per_s: float | None = Field(default=None, description="of the stage's successful requests")
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    tpot_p50_ms: float | None = Field(default=None, description="of the stage's successful requests")

    @classmethod
    def of(cls, stage: StageSummary) -> StageFigures:
        """Each figure read from the stage's field of its name: one StageSummary renamed fails here
        (AttributeError), where `model_dump(include=...)` would leave it None without a word."""
        same_name = {name: getattr(stage, name) for name in cls.model_fields if name != "goodput_qps"}
        return cls(goodput_qps=stage.goodput.requests_per_s if stage.goodput else None, **same_name)


class TurnSummary(BaseModel):
    turn: int
    requests: int
    prompt_tokens_p50: float | None
    prompt_tokens_p99: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    cached_share: float | None = Field(
        default=None, description="cached / prompt tokens of its successful requests whose usage says cached_tokens"
    )


class FailureSummary(BaseModel):
    by_category: dict[str, int]
    oom_family: int
    examples: dict[str, str] = Field(default_factory=dict)


class GpuSummary(Strict):
    """One GPU over the run (from server.jsonl: a DCGM exporter or nvidia-smi)."""

    gpu: str
    memory_used_max_mib: float | None
    memory_total_mib: float | None
    memory_usage_max: float | None = Field(description="the highest memory used / total, 0..1")
    utilization_mean_percent: float | None
    utilization_max_percent: float | None


class SpecDecodeSummary(BaseModel):
    """Speculative decoding over the judged stages and the drain, from vLLM's spec_decode counters."""

    drafts: float = Field(description="draft proposals (one per decoding step that drafted)")
    draft_tokens: float
    accepted_tokens: float
    acceptance_rate: float | None = Field(description="accepted / drafted tokens; None: nothing drafted")
    mean_acceptance_length: float | None = Field(
        description="1 + accepted / drafts: tokens a drafting step of the model emits (1 without speculation)"
    )
    accepted_tokens_per_s: float | None = Field(description="accepted tokens a second: the output the drafts gave")
    acceptance_by_position: list[float] = Field(
        default_factory=list,
        description="accepted / drafts at each draft position, the first first (vLLM's per-position counters):"
        " where a draft stops being right; empty when the server exports none",
    )


EnergySource = Literal["counter", "power"]
"""Where a run's GPU energy came from: each GPU's total-energy counter (NVML, DCGM), or its power draw
integrated over the samples where a GPU has no counter (nvidia-smi, older GPUs)."""
NO_ENERGY = "no GPU energy counter"


class CostFigures(Strict):
    """What one window's answers cost (a stage, or the judged hold): its GPUs' energy and price per token.
    None where the run read no GPU energy (CPU-only servers: never 0) or was given no price."""

    seconds: float
    output_tokens: float = Field(description="of the requests that succeeded in the window")
    input_tokens: float = Field(description="their prompt tokens")
    energy_j: float | None = Field(description="every GPU's, summed over the window")
    joules_per_output_token: float | None
    output_tokens_per_kj: float | None
    usd: float | None = Field(description="the GPUs' price for the window")
    usd_per_1m_output_tokens: float | None = Field(description="the window's whole price over its output tokens")
    usd_per_1m_input_tokens: float | None = Field(description="the window's whole price over its input tokens")


class StageCost(CostFigures):
    name: str


class CostSummary(Strict):
    """summary.json's `cost`: energy per token from the GPUs' counters, and price per token from
    --gpu-hour-cost or the GPU price table (llmload/cost)."""

    gpu_count: int | None = Field(description="GPUs the run's samples saw; None: none (a CPU server, or no source)")
    gpu_kinds: list[str] = Field(default_factory=list, description="their names, as the GPU source gave them")
    energy_source: EnergySource | None = Field(description="None: no GPU energy was read")
    energy_note: str | None = Field(description=f"why there are no energy figures ('{NO_ENERGY}')")
    gpu_hour_usd: float | None = Field(description="the price of one GPU-hour used (of the server, with no GPU)")
    price_source: str | None = Field(description="where gpu_hour_usd came from; None: no price")
    price_note: str | None = Field(description="why there is no price, when the run was priced by no flag or entry")
    hold: CostFigures = Field(description="over the judged stages")
    stages: list[StageCost]


class ReplicaServerSummary(BaseModel):
    """One replica's server figures, in a run over several (server.jsonl's `replicas`)."""

    host: str
    kv_cache_usage_max: float | None = None
    preemptions: float | None = Field(default=None, description="over the judged stages")
    waiting_max: float | None = None
    unanswered_samples: int = Field(default=0, description="samples where its /health did not answer")


class ServerSummary(BaseModel):
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    prefix_cache_hit_rate: float | None = Field(
        default=None,
        description="prefix-cache hits / queries over the judged stages (deltas of vLLM's token counters)",
    )
    prefix_cache_queries: float | None = Field(default=None, description="prompt tokens looked up, judged stages")
    workload_prefix: ReusablePrefix | None = Field(
        default=None,
        description="the share an infinite prefix cache could serve of the prompts the judged stages sent"
        " (16-token blocks): the ceiling of prefix_cache_hit_rate; None without the workload file",
    )
    waiting_max: float | None = None
    gpu_memory_usage_max: float | None = Field(default=None, description="the fullest GPU's memory used / total")
    gpus: list[GpuSummary] = Field(default_factory=list, description="empty when the run read no GPU")
    spec_decode: SpecDecodeSummary | None = Field(default=None, description="a server that speculates: its drafts")
    replicas: list[ReplicaServerSummary] = Field(
        default_factory=list, description="a run over several replicas: each one's, in --host order; else empty"
    )


class RunInfo(BaseModel):
    run_id: str
    host: str
    model: str | None
    workload: str
    token_scale: float = Field(
        default=1.0, description="every length of the workload was sent times this (--scale-tokens); 1 unscaled"
    )
    arrival: str
    target_qps: float
    sessions_in_flight: int | None = Field(
        default=None,
        description="--sessions-in-flight: the conversations kept in flight at 100% (a closed loop, target_qps 0);"
        " None: the run's rate was planned",
    )
    started_at: float
    finished_at: float
    workers: int
    load_generator_cpu_max_percent: float | None = None
    cpu_steal_percent: float | None = None
    load_generator_lag_max_ms: float | None = Field(
        default=None,
        description="the longest the recording process's timer fired late (server.jsonl's client_lag_ms): "
        "a stall that delays every timestamp taken meanwhile; None without samples",
    )
    goodput_slo: GoodputSLO | None = None
    server: ServerIdentity | None = Field(default=None, description="the kind of server the run met, and its version")
    access: AccessNote | None = Field(default=None, description="how the run reached the target (TLS, headers)")
    warnings: list[str] = Field(default_factory=list)


class OutputLengths(BaseModel):
    """The workload's exact output lengths against what the server gave (the judged stages' successful
    requests that asked for one): a server that cannot force a length answers as long as it likes."""

    requested: int = Field(description="successful requests whose turn gave an exact output length")
    forced: int = Field(description="of them, asked for it in a way the server honours")
    requested_tokens: TokenPercentiles
    output_tokens: TokenPercentiles = Field(description="what the server gave the same requests")


class WorkerSummary(FleetWorker):
    """One worker's share of a distributed run: its records (whole run, warm-up included) beside what
    the master saw of it. `sent` is counted from the records, `sent_reported` by the worker itself."""

    sent: int
    ok: int
    failed: int = Field(description="failed or unfinished")

    @property
    def lost(self) -> int:
        return self.lost_in_flight + self.lost_not_sent


class GroupFigures(BaseModel):
    """The judged requests of one group (a model of a mix, a replica): counts, failures and latency, so the one
    that is slower or failing shows apart from the others."""

    name: str
    share: float | None = Field(default=None, description="its share of the sessions, as asked")
    sent: int
    ok: int
    failed: int = Field(description="failed or unfinished")
    failures: dict[str, int] = Field(default_factory=dict, description="by category")
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    output_tokens_per_s: float


class CutAftermath(BaseModel):
    """The successful requests sent soon after a cut stream against the rest: a server that generates on
    for a client that left serves the next requests beside it, so they wait longer and stream slower."""

    window_s: float = Field(description="a request follows a cut made at most this long before it was sent: an E2E p50")
    after: int = Field(description="successful requests that followed a cut")
    rest: int
    ttft_p50_after_ms: float | None = None
    ttft_p50_rest_ms: float | None = None
    tpot_p50_after_ms: float | None = None
    tpot_p50_rest_ms: float | None = None


class Summary(BaseModel):
    run: RunInfo
    requests: RequestCounts
    latency_ms: LatencySummary
    throughput: Throughput
    tokens: TokenSummary
    reasoning: ReasoningSummary | None = Field(default=None, description="when the run had reasoning")
    stages: list[StageSummary]
    turns: list[TurnSummary]
    cached_share_by_conversation: ShareSpread | None = Field(
        default=None,
        description="each conversation's cached / prompt tokens (its judged successful requests whose usage says"
        " cached_tokens; a session with its subagents, each replay its own), spread over conversations",
    )
    failures: FailureSummary
    output_lengths: OutputLengths | None = Field(default=None, description="when the workload fixed output lengths")
    server: ServerSummary | None = None
    workers: list[WorkerSummary] = Field(default_factory=list, description="a distributed run's workers")
    by_model: list[GroupFigures] = Field(default_factory=list, description="a run of several models: each one's")
    by_host: list[GroupFigures] = Field(default_factory=list, description="a run over several replicas: each one's")
    cancel: CancelNote | None = Field(default=None, description="streams cut on purpose (run.json's)")
    server_release: ServerRelease | None = Field(default=None, description="with `cancel` (run.json's)")
    cut_aftermath: CutAftermath | None = Field(
        default=None, description="with `cancel`: the requests that followed a cut against the rest"
    )
    cost: CostSummary | None = Field(default=None, description="energy and price per token; None: no server samples")
    verdict: Verdict | None = None
