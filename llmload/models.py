"""Typed contracts shared by every stage: workload file, per-request record, run summary.

One place for the shapes other parts (and users' CI) rely on; see docs/ARCHITECTURE.md.
Config-like models are strict (`extra="forbid"`): a misspelt key fails loudly.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    computed_field,
    field_validator,
    model_validator,
)

from llmload.errors import InputError, validation_message


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- workload (v1)


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class Turn(Strict):
    """One request of a session: the messages this turn adds to the conversation."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = Field(
        default=None, description="forced output length (min_tokens = max_tokens = this, ignore_eos)"
    )
    think_time_s: NonNegativeFloat = Field(
        default=0.0, description="pause after the previous reply before this turn is sent (a minimum in replay)"
    )
    at_s: NonNegativeFloat | None = Field(
        default=None, description="when the source sent this turn, in seconds after the session's first turn"
    )
    prompt_tokens: PositiveInt | None = Field(
        default=None, description="prompt length in the source (history included), for stats"
    )
    model: str | None = Field(
        default=None, min_length=1, description="the model or LoRA adapter this turn asks for (default: --model's)"
    )

    @model_validator(mode="after")
    def _bounded(self) -> Turn:
        """A request with no length limit would run to the server's max_model_len: never sent."""
        if self.output_tokens is None and self.max_tokens is None:
            raise ValueError(
                "a turn needs output_tokens or max_tokens (without, a server generates up to max_model_len);"
                " `llmload workload build --output-tokens DISTRIBUTION` draws them for a log that has none"
            )
        return self


REPLAY_SEPARATOR = "~"
"""A run longer than its workload replays it again: the n-th replay of session `id` is `id~n` in the records."""


class Session(Strict):
    id: str
    offset_s: NonNegativeFloat | None = Field(default=None, description="arrival offset in the source")
    turns: list[Turn] = Field(min_length=1)


class WorkloadSource(Strict):
    files: list[str] = Field(default_factory=list)
    format: str
    built_at: datetime | None = None
    generator: dict[str, object] | None = None


class WorkloadSpec(Strict):
    """The YAML file a person reads and edits; sessions live in a JSONL file beside it."""

    version: Literal[1]
    name: str
    source: WorkloadSource | None = None
    tokenizer: str = "cl100k_base"
    model: str | None = None
    target_qps: float | None = Field(default=None, gt=0)
    sessions: str = Field(description="JSONL file of sessions, relative to the YAML file")
    history_turns: PositiveInt | None = Field(default=None, description="replay keeps only the last N turns of history")
    stats: dict[str, object] | None = None


# --------------------------------------------------------------------------- the server's configuration

ConfigValue = str | int | float | bool | list[str] | None


AUTO_FIT = -1  # --max-model-len -1 (or auto): vLLM takes the longest sequence its KV cache holds


class ServeConfig(Strict):
    """What a `vllm serve` config file and command line set (llmload/server/serve_config.py): None is vLLM's
    default. Keys vLLM accepts that llmload does not model are kept in `not_modelled`."""

    model: str | None = None
    served_model_name: str | None = Field(default=None, description="the first name when several are given")
    max_model_len: int | None = Field(default=None, description="-1: vLLM fits the longest the KV cache holds")
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_memory_bytes: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_batched_tokens: PositiveInt | None = None
    max_num_queued_reqs: PositiveInt | None = None
    block_size: PositiveInt | None = None
    kv_cache_dtype: str | None = None
    dtype: str | None = None
    quantization: str | None = None
    tensor_parallel_size: PositiveInt | None = None
    pipeline_parallel_size: PositiveInt | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = Field(
        default=None, description="False: a prompt is prefilled whole in one step, never split across steps"
    )
    cpu_offload_gb: NonNegativeFloat | None = None
    not_modelled: dict[str, ConfigValue] = Field(default_factory=dict, description="accepted by vLLM, unused here")
    origins: dict[str, str] = Field(
        default_factory=dict, description="where each key was set: FILE:LINE or the command line"
    )

    @field_validator("max_model_len")
    @classmethod
    def _length_or_auto(cls, value: int | None) -> int | None:
        if value is not None and value < 1 and value != AUTO_FIT:
            raise ValueError(f"must be positive, or {AUTO_FIT} for the longest that fits; got {value}")
        return value

    def with_settings(self, other: ServeConfig) -> ServeConfig:
        """This configuration with every setting `other` sets (and where it set it) replacing ours."""
        given = other.model_dump(exclude={"not_modelled", "origins"}, exclude_none=True)
        return self.model_copy(
            update={
                **given,
                "not_modelled": {**self.not_modelled, **other.not_modelled},
                "origins": {**self.origins, **other.origins},
            }
        )

    def resolved(self) -> ResolvedServeConfig:
        """These settings with vLLM's constant defaults where they leave one unset."""
        return ResolvedServeConfig.model_validate(self.model_dump(exclude_none=True))


class ResolvedServeConfig(ServeConfig):
    """A ServeConfig with vLLM 0.32's constant defaults in place of None: each default is written once,
    here. Those vLLM derives stay None and are derived where they are used: max_model_len from the
    model's config (capacity.plan_capacity), max_num_seqs and max_num_batched_tokens from the usage
    context and the GPU (a simulator profile must set them), the KV memory from the GPU's, and
    enable_chunked_prefill from the model's kind (None: on, unless turned off)."""

    block_size: PositiveInt = 16  # CacheConfig.DEFAULT_BLOCK_SIZE on GPUs (the CPU backend uses 128, FlashMLA 64)
    gpu_memory_utilization: float = Field(default=0.92, gt=0, le=1)
    tensor_parallel_size: PositiveInt = 1
    pipeline_parallel_size: PositiveInt = 1
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    cpu_offload_gb: NonNegativeFloat = 0.0


VLLM_DEFAULTS = ResolvedServeConfig()
"""vLLM's constant defaults, for what reads one alone (`VLLM_DEFAULTS.block_size`)."""

Device = Literal["gpu", "cpu"]


class DeviceDefaults(Strict):
    """vLLM 0.32's defaults that depend on the device (EngineArgs.get_batch_defaults for the OpenAI
    server: GPUs under 70 GiB, and the CPU backend, whose blocks are 128 tokens)."""

    block_size: PositiveInt
    max_num_seqs: PositiveInt
    max_num_batched_tokens: PositiveInt


DEVICE_DEFAULTS: dict[Device, DeviceDefaults] = {
    "gpu": DeviceDefaults(block_size=VLLM_DEFAULTS.block_size, max_num_seqs=256, max_num_batched_tokens=2048),
    "cpu": DeviceDefaults(block_size=128, max_num_seqs=128, max_num_batched_tokens=2048),
}


# --------------------------------------------------------------------------- goodput SLOs

ItlStatistic = Literal["p50", "p90", "p95", "p99", "max"]
ITL_STATISTICS: tuple[str, ...] = ItlStatistic.__args__  # type: ignore[attr-defined]
# metric in the --goodput-slo syntax -> the GoodputSLO field, which is the records' column too
GOODPUT_METRICS = {"ttft": "ttft_ms", "ttfo": "ttfo_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms"}
GOODPUT_SYNTAX = "METRIC=MS or itl:STAT=MS, e.g. ttft=2000,tpot=50,itl:p99=100,e2e=30000"


class GoodputSLO(Strict):
    """Per-request SLOs in ms (DistServe's goodput rule): a request is good when it succeeded and
    meets every one given; `itl_stat` is the statistic of the request's own gaps judged."""

    ttft_ms: PositiveFloat | None = None
    ttfo_ms: PositiveFloat | None = Field(default=None, description="time to first answer token (reasoning models)")
    tpot_ms: PositiveFloat | None = None
    itl_ms: PositiveFloat | None = None
    itl_stat: ItlStatistic = "max"
    e2e_ms: PositiveFloat | None = None

    @model_validator(mode="after")
    def _some_slo(self) -> GoodputSLO:
        if all(v is None for v in (self.ttft_ms, self.ttfo_ms, self.tpot_ms, self.itl_ms, self.e2e_ms)):
            raise ValueError("a goodput SLO needs at least one of ttft_ms, ttfo_ms, tpot_ms, itl_ms, e2e_ms")
        return self

    @classmethod
    def parse(cls, specs: Iterable[str]) -> GoodputSLO:
        """`--goodput-slo` values (repeatable, comma-separated) as one GoodputSLO; an unknown metric or
        a statistic a metric does not have (AIPerf #1154: an SLO on a missing statistic failed every
        point) is an InputError naming it, before anything runs."""
        fields: dict[str, object] = {}
        for spec in (part.strip() for text in specs for part in text.split(",") if part.strip()):
            key, sep, value = spec.partition("=")
            metric, _, statistic = key.strip().partition(":")
            where = f"--goodput-slo {spec!r}"
            if not sep:
                raise InputError(f"{where}: expected {GOODPUT_SYNTAX}")
            if metric not in GOODPUT_METRICS:
                known = ", ".join(GOODPUT_METRICS)
                raise InputError(f"{where}: no per-request metric {metric!r}; known: {known} ({GOODPUT_SYNTAX})")
            if statistic and metric != "itl":
                raise InputError(
                    f"{where}: {metric} is one value per request, so it has no statistic {statistic!r}; only itl"
                    f" (a request's gaps) takes one: {', '.join(ITL_STATISTICS)}"
                )
            if statistic and statistic not in ITL_STATISTICS:
                raise InputError(f"{where}: itl has no statistic {statistic!r}; known: {', '.join(ITL_STATISTICS)}")
            try:
                fields[GOODPUT_METRICS[metric]] = float(value)
            except ValueError:
                raise InputError(f"{where}: {value!r} is not a number of milliseconds") from None
            if statistic:
                fields["itl_stat"] = statistic
        try:
            return cls.model_validate(fields)
        except ValidationError as exc:
            raise InputError(f"--goodput-slo: {validation_message(exc)}") from None

    def describe(self) -> str:
        """`TTFT ≤ 2000 ms, ITL p99 ≤ 50 ms`: the rule as reports print it."""
        parts = [
            (f"ITL {self.itl_stat} of each request" if name == "ITL" else name, limit)
            for name, limit in (("TTFT", self.ttft_ms), ("TTFO", self.ttfo_ms), ("TPOT", self.tpot_ms),
                                ("ITL", self.itl_ms), ("E2E", self.e2e_ms))
            if limit is not None
        ]  # fmt: skip
        return ", ".join(f"{name} ≤ {limit:g} ms" for name, limit in parts)


# --------------------------------------------------------------------------- run plan


class Stage(Strict):
    """One step of the ramp: `qps` requests/s (percent of the target) from start_s for duration_s."""

    name: str
    percent: float
    qps: float
    start_s: float
    duration_s: float
    warmup: bool = Field(default=False, description="reported but never judged: it fills sessions to every depth")

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


class ServerIdentity(Strict):
    """Which server a run met (llmload/server/detect.py): its kind in llmload/server/kinds.yaml,
    its version where it tells one, and what told them."""

    kind: str
    label: str
    version: str | None = None
    evidence: str = Field(description="the probe that told it, or `--server-kind`")

    @property
    def name(self) -> str:
        """`vLLM 0.32.0`, `transformers serve`: how reports name it."""
        return f"{self.label} {self.version}" if self.version else self.label


class FleetWorker(Strict):
    """One worker of a distributed run as its master saw it (run.json `fleet`, completed at the run's end):
    what it says it sent, its CPU, and, lost, when and what went with it (llmload.fleet)."""

    index: int
    host: str = Field(description="the worker's machine: its Locust node id without the random suffix")
    sent_reported: int = Field(default=0, description="requests the worker counted as sent, in its own messages")
    cpu_max_percent: float = 0.0
    adopted: int = Field(default=0, description="arrivals it took over from lost workers")
    lost_at_s: float | None = Field(default=None, description="run offset of its last message before it was lost")
    noticed_at_s: float | None = Field(default=None, description="when the master found its heartbeat missing")
    lost_in_flight: int = Field(default=0, description="its requests in flight when it was lost (status lost)")
    lost_not_sent: int = Field(default=0, description="its arrivals due after its last message, never sent (lost)")
    taken_over_at_s: float | None = Field(
        default=None, description="from this run offset the other workers sent its arrivals (the default policy)"
    )
    handed_over: int = Field(default=0, description="its arrivals from then on, handed to the other workers")
    refused: str | None = Field(default=None, description="why it sent nothing: the target unreachable from it, ...")


TLSVerify = Literal["plain_http", "system", "ca_cert", "insecure"]


class AccessNote(Strict):
    """How a run reached its target (llmload/access.py), as run.json and the report say it: which trust,
    which headers by name, whether a key was sent; never a key or a header's value."""

    tls_verify: TLSVerify = Field(
        description="plain_http: no TLS; system: the system's CAs; ca_cert: those and --ca-cert; insecure: none"
    )
    ca_cert: str | None = None
    client_cert: str | None = Field(default=None, description="the certificate shown to the server (mutual TLS)")
    headers: list[str] = Field(default_factory=list, description="the names of the --header headers sent")
    api_key: bool = Field(default=False, description="whether a bearer token was sent")


class ModelShare(Strict):
    """One model (or LoRA adapter) of a run and its weight among the sessions (llmload/model_mix.py)."""

    name: str = Field(min_length=1)
    weight: float = Field(default=1.0, gt=0)


class CancelNote(Strict):
    """Streams the plan cut on purpose (`--cancel-share`, `--cancel-after`; llmload/cancel.py)."""

    share: float = Field(gt=0, lt=1, description="of the requests, the share cut")
    after: str = Field(description="where each is cut: tokens:DISTRIBUTION or seconds:DISTRIBUTION, as given")


class ServerRelease(Strict):
    """Whether the server let go of what the run's requests held once the last of them had ended: the
    requests it still ran and queued, and its KV-cache usage against before the run (llmload/cancel.py)."""

    released: bool | None = Field(description="None: the server exports no running count")
    waited_s: float = Field(description="from the first look to the last, after the run's last request")
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage_before: float | None = Field(default=None, description="the run's first sample")
    kv_cache_usage_after: float | None = None


class PrefixCacheReset(Strict):
    """Whether the server's prefix cache was emptied before a run (`--reset-prefix-cache`), and how or why not."""

    reset: bool
    how: str = Field(description="the request that did it, or why it was not done")


class Pricing(Strict):
    """What a GPU-hour costs, as the run was told (run.json's `pricing`): --gpu-hour-cost, else the
    entry of the price table whose name is in the GPU's (llmload/cost/gpu_prices.yaml, --gpu-prices FILE)."""

    gpu_hour_usd: float | None = Field(default=None, gt=0, description="--gpu-hour-cost: one GPU-hour (or server-hour)")
    table: dict[str, float] = Field(default_factory=dict, description="USD per GPU-hour by a word of the GPU's name")
    table_source: str = Field(description="the file the table came from")


class RunManifest(Strict):
    """run.json: the plan of a run, written at its start, so reports can be rebuilt from records."""

    run_id: str
    host: str
    model: str | None
    workload: str
    arrival: str
    burstiness: float
    seed: int
    first_session: int = Field(default=0, description="the workload's session the replay began with (rate modes)")
    target_qps: float
    time_scale: float = Field(default=1.0, description="trace replay: recorded gaps divided by this")
    stages: list[Stage]
    drain_s: float
    started_at: float
    workers: int
    limits: dict[str, float]
    finished_at: float | None = None
    interrupted: bool = Field(
        default=False, description="stopped before the plan's end (Ctrl-C, SIGTERM, -t): what was measured until then"
    )
    load_generator_cpu_max_percent: float | None = None
    cpu_steal_percent: float | None = Field(
        default=None, description="hypervisor steal on the load generator's machine (the master's) during the run"
    )
    goodput_slo: GoodputSLO | None = Field(default=None, description="per-request SLOs goodput counts against")
    server: ServerIdentity | None = Field(default=None, description="the kind of server the run met")
    access: AccessNote | None = Field(default=None, description="how the run reached the target (TLS, headers)")
    prefix_cache_reset: PrefixCacheReset | None = Field(default=None, description="None: not asked for")
    model_mix: list[ModelShare] = Field(
        default_factory=list, description="several models' shares of the sessions (weights summing to 1); [] for one"
    )
    replicas: list[str] = Field(
        default_factory=list,
        description="the replicas sessions were spread over (`host` is the first); [] for one",
    )
    session_header: str | None = Field(default=None, description="the header that carried each session's id")
    cancel: CancelNote | None = Field(default=None, description="streams cut on purpose; None: none")
    server_release: ServerRelease | None = Field(
        default=None, description="with `cancel`: whether the server let go of what the requests held"
    )
    fleet: list[FleetWorker] = Field(default_factory=list, description="a distributed run's workers; [] run locally")
    pricing: Pricing | None = Field(default=None, description="what a GPU-hour costs; None: runs before prices")

    @property
    def judged_stages(self) -> list[Stage]:
        """The stages a run is judged on: all but the warm-up, which is reported and never judged."""
        return [stage for stage in self.stages if not stage.warmup]

    @property
    def judged_started_at(self) -> float:
        """When the first judged stage began (unix seconds)."""
        judged = self.judged_stages
        return self.started_at + (judged[0].start_s if judged else 0.0)


# --------------------------------------------------------------------------- run records

RequestStatus = Literal["ok", "failed", "unfinished", "cancelled", "abandoned", "not_sent", "lost"]
"""`unfinished`: still running when the drain after the plan ended: the target did not keep up, judged as a
failure. `cancelled`: cut by the operator (Ctrl-C, SIGTERM, -t); like `not_sent`, never judged. `lost`: a
distributed run's worker died with it, in flight (sent, its outcome unknown) or due and never sent (llmload.fleet);
never judged against the target, and the achieved-rate check fails the hold that lost any."""
ANSWERED_STATUSES: tuple[str, ...] = ("ok", "failed", "unfinished")
"""The statuses the target is judged on: every request it was sent and the run waited for."""

FailureCategory = Literal[
    "context_length",
    "model_not_found",
    "oom",
    "engine_dead",
    "server_down",
    "tls",
    "stream_error",
    "incomplete",
    "malformed",
    "timeout",
    "rate_limited",
    "http_4xx",
    "http_5xx",
    "unfinished",
    "cancelled",
    "abandoned",
    "worker_lost",
]
FAILURE_CATEGORIES: tuple[str, ...] = FailureCategory.__args__  # type: ignore[attr-defined]
OOM_FAMILY: frozenset[str] = frozenset({"oom", "engine_dead", "server_down"})


class RequestRecord(BaseModel):
    """One line of requests.jsonl: one scheduled request, whatever became of it."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    worker: int
    stage: str
    session_id: str
    turn: int
    scheduled_at: float
    sent_at: float | None = None
    first_token_at: float | None = None
    finished_at: float | None = None
    schedule_delay_ms: float | None = None
    ttft_ms: float | None = None
    ttfo_ms: float | None = Field(
        default=None, description="time to the first answer chunk after any reasoning: the TTFT without reasoning"
    )
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: list[float] = Field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    usage_from_server: bool = False
    reasoning_tokens: int | None = Field(default=None, description="of output_tokens, those thought before answering")
    answer_tokens: int | None = Field(default=None, description="output_tokens - reasoning_tokens")
    reasoning_tokens_counted: bool = Field(
        default=False, description="reasoning_tokens counted from the reasoning chunks, not told by the server's usage"
    )
    requested_output_tokens: int | None = Field(default=None, description="the workload's exact output length")
    output_tokens_forced: bool = Field(
        default=False, description="the request asked the server for exactly that length in a way it honours"
    )
    status: RequestStatus
    model: str | None = Field(default=None, description="the model or LoRA adapter it asked for")
    host: str | None = Field(default=None, description="the replica it was sent to (a run over several; None: one)")
    error_category: FailureCategory | None = None
    http_status: int | None = None
    error_message: str | None = None
    # the server's state when a request failed: /health right after, last scraped metrics
    server_health: int | None = None
    server_kv_cache_usage: float | None = None
    server_waiting: float | None = None


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


class TurnReuse(BaseModel):
    """The reusable share of prompt tokens at one turn index (1 = first turn)."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    requests: int
    share: float | None


ChatTemplate = Literal["chatml", "none"]
"""How the reusable-prefix figure renders messages into a prompt (llmload/workload/prefix.py)."""


class ReusablePrefix(BaseModel):
    """Prompt tokens an infinite prefix cache could serve (llmload/workload/prefix.py defines it)."""

    model_config = ConfigDict(extra="forbid")

    block_size: PositiveInt = Field(description="tokens per block; 512 for Mooncake hash_ids")
    basis: str = Field(description="what the blocks were cut from: message text, or the log's hash_ids")
    chat_template: ChatTemplate | None = Field(
        default=None, description="how prompts were rendered from messages; None for hash_ids"
    )
    requests: int
    prompt_tokens: int = Field(description="tokens of the prompts counted (as rendered), replies included")
    reusable_tokens: int
    history_tokens: int = Field(description="reusable, first sent by the same session")
    shared_tokens: int = Field(description="reusable, first sent by another session")
    share: float | None = Field(description="reusable / prompt tokens; None without prompt tokens")
    history_share: float | None
    shared_share: float | None
    by_turn: list[TurnReuse]


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


CheckKind = Literal["failures", "rate", "keeping_up", "slo", "goodput", "drift", "alert", "hold_length", "release"]
"""What a verdict's check judges: `hold_length` fails a hold too short for the latencies it saw (a search
lengthens such a probe); `drift` and `keeping_up` fit a slope, and may fail marginally."""


VerdictOutcome = Literal["pass", "fail", "inconclusive"]
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "inconclusive": 3}
"""A gate's exit code by its outcome; 2 is bad input."""
"""`inconclusive`: no check failed, but one that decides whether the server keeps up could not be measured
(a hold too short for its answers or its noise): neither a pass nor the server's fault; exit code 3."""


class Verdict(BaseModel):
    outcome: VerdictOutcome
    reasons: list[str]
    failed_kinds: list[CheckKind] = Field(default_factory=list, description="the kind of each check that failed")
    inconclusive_kinds: list[CheckKind] = Field(
        default_factory=list, description="the kind of each check that could not tell (a longer hold would)"
    )
    hold_needed_s: float | None = Field(default=None, description="INCONCLUSIVE: about the hold that would tell")
    marginal: bool = Field(
        default=False,
        description="failed only on checks a second hold may reverse: a drift past its limit at the slope's "
        "estimate but not at its confidence interval's low end",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_passed(cls, data: Any) -> Any:
        """A verdict.json of an earlier llmload has only `passed`."""
        if isinstance(data, dict) and "outcome" not in data and "passed" in data:
            data = {**data, "outcome": "pass" if data["passed"] else "fail"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """True only on PASS: INCONCLUSIVE never counts as passing."""
        return self.outcome == "pass"

    @property
    def label(self) -> str:
        return self.outcome.upper()


class RunInfo(BaseModel):
    run_id: str
    host: str
    model: str | None
    workload: str
    arrival: str
    target_qps: float
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


class Summary(BaseModel):
    run: RunInfo
    requests: RequestCounts
    latency_ms: LatencySummary
    throughput: Throughput
    tokens: TokenSummary
    reasoning: ReasoningSummary | None = Field(default=None, description="when the run had reasoning")
    stages: list[StageSummary]
    turns: list[TurnSummary]
    failures: FailureSummary
    output_lengths: OutputLengths | None = Field(default=None, description="when the workload fixed output lengths")
    server: ServerSummary | None = None
    workers: list[WorkerSummary] = Field(default_factory=list, description="a distributed run's workers")
    by_model: list[GroupFigures] = Field(default_factory=list, description="a run of several models: each one's")
    by_host: list[GroupFigures] = Field(default_factory=list, description="a run over several replicas: each one's")
    cancel: CancelNote | None = Field(default=None, description="streams cut on purpose (run.json's)")
    server_release: ServerRelease | None = Field(default=None, description="with `cancel` (run.json's)")
    cost: CostSummary | None = Field(default=None, description="energy and price per token; None: no server samples")
    verdict: Verdict | None = None


# --------------------------------------------------------------------------- capacity search (search.json)

SearchOutcome = Literal["found", "capped", "none", "interrupted", "aborted"]


def answer_words(passing_qps: float | None, outcome: SearchOutcome | None) -> str:
    """A search's answer as a figure that says what it is: `9.5 req/s`, or at --max-qps a lower bound,
    `≥ 32 req/s (the cap, --max-qps)`."""
    if passing_qps is None:
        return "no passing rate"
    if outcome == "capped":
        return f"≥ {passing_qps:g} req/s (the cap, --max-qps)"
    return f"{passing_qps:g} req/s"


class Probe(BaseModel):
    """One probe: an ordinary run directory under the search's, and what its hold showed."""

    run_id: str
    qps: float
    hold_s: float | None = Field(default=None, description="its hold; None: the search's --probe-duration")
    passed: bool | None = Field(description="None: interrupted or unfinished, never judged")
    failed_checks: list[str] = Field(default_factory=list, description="verdict lines of the checks that failed")
    failed_kinds: list[CheckKind] = Field(default_factory=list, description="the kind of each check that failed")
    marginal: bool = Field(default=False, description="failed only on checks a second hold may reverse")
    hold_needed_s: float | None = Field(default=None, description="INCONCLUSIVE: about the hold that would tell")
    inconclusive: bool = Field(default=False, description="its verdict was INCONCLUSIVE: never a pass")
    too_short: bool = Field(
        default=False,
        description="failed only because its hold was short for its latencies: the next probe at its rate holds longer",
    )
    sent: int | None = Field(default=None, description="requests sent in the hold the target is judged on")
    unfinished: int | None = Field(default=None, description="of those, still running when the drain ended")
    achieved_qps: float | None = None
    goodput_qps: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    output_tokens_per_s: float | None = Field(default=None, description="of the hold's successful requests")
    tpot_p50_ms: float | None = Field(default=None, description="of the hold's successful requests")
    gpu_count: int | None = Field(default=None, description="GPUs its run saw (summary.json's cost); None: none")
    confirm: bool = Field(default=False, description="the --confirm soak at the rate found")
    cache_reset: PrefixCacheReset | None = Field(default=None, description="the prefix cache emptied before it")

    def figures(self) -> str:
        """The latency it measured, as a sentence's end: `TTFT p50 40 / p99 120 ms, E2E p50 ...`."""

        def ms(value: float | None) -> str:
            return "–" if value is None else f"{value:,.0f}"

        return (
            f"TTFT p50 {ms(self.ttft_p50_ms)} / p99 {ms(self.ttft_p99_ms)} ms, "
            f"E2E p50 {ms(self.e2e_p50_ms)} / p99 {ms(self.e2e_p99_ms)} ms"
        )


class SearchResult(BaseModel):
    """search.json: every probe and the answer."""

    search_id: str
    host: str
    workload: str
    max_qps: float
    probe_s: float
    repeats: int
    started_at: float
    finished_at: float | None = None
    goodput_slo: GoodputSLO | None = None
    probes: list[Probe] = Field(default_factory=list)
    outcome: SearchOutcome = "interrupted"
    passing_qps: float | None = Field(default=None, description="the answer: every probe at it passed")
    failing_qps: float | None = Field(default=None, description="the lowest failing rate above the answer")
    failing_reason: str | None = None
    confirmed: bool | None = Field(default=None, description="the --confirm soak passed; None: not run")
    required_qps: float | None = None
    prefix_cache_kept: bool = Field(default=False, description="--keep-prefix-cache: no probe emptied it")
    latency_slo: bool = Field(
        default=False,
        description="the gate holds latency to an SLO (--slo-ttft-p99-ms, --slo-ttfo-p99-ms, --slo-e2e-p99-ms,"
        " --min-goodput-ratio);"
        " without one, the answer is the highest rate the server keeps up with, however slow",
    )

    def judged(self) -> list[Probe]:
        return [p for p in self.probes if p.passed is not None and not p.confirm]

    @property
    def cache_note(self) -> str | None:
        """Whether each probe began with an empty prefix cache, in a sentence; None before any probe said."""
        if self.prefix_cache_kept:
            return (
                "The prefix cache was kept between probes (--keep-prefix-cache): a probe may have been served prefixes"
                " the one before it left cached."
            )
        told = [p.cache_reset for p in self.probes if p.cache_reset is not None]
        if not told:
            return None
        emptied = sum(reset.reset for reset in told)
        if emptied == len(told):
            return f"The prefix cache was emptied before each probe ({told[0].how})."
        why = next(reset.how for reset in told if not reset.reset)
        before = "any probe" if not emptied else f"{len(told) - emptied} of {len(told)} probes"
        return (
            f"The prefix cache was not emptied before {before}: {why}. A probe may have been served prefixes the"
            " one before it left cached."
        )

    @property
    def answer_probe(self) -> Probe | None:
        """The last probe that passed at the answer: the figures it is reported with."""
        return next((p for p in reversed(self.judged()) if p.qps == self.passing_qps and p.passed), None)

    @property
    def answer(self) -> str:
        return answer_words(self.passing_qps, self.outcome)

    @property
    def conclusion(self) -> str:
        """One sentence: the answer and the boundary, or why there is none."""
        lo, hi = self.passing_qps, self.failing_qps
        boundary = f" It fails at {hi:g} req/s: {self.failing_reason}." if hi is not None else ""
        if self.outcome == "capped":
            return f"Keeps up with {self.answer}: its limit lies above the highest rate probed."
        if lo is None:
            what = {"none": "No probed rate passed", "interrupted": "Interrupted before any rate passed"}
            return f"{what.get(self.outcome, 'The search stopped before any rate passed')}.{boundary}"
        found = f"The highest passing rate is {lo:g} req/s"
        if hi is not None:
            found += f" (boundary between {lo:g} and {hi:g} req/s)"
        suffix = {"interrupted": " (interrupted: what was learned so far)", "aborted": " (the search was aborted)"}
        return f"{found}{suffix.get(self.outcome, '')}.{boundary}"

    @property
    def latency_note(self) -> str | None:
        """Without a latency SLO the answer only says the server keeps up: its latency there, and how to
        ask for a usable rate."""
        probe = self.answer_probe
        if probe is None:
            return None
        at = f"At {probe.qps:g} req/s: {probe.figures()}."
        if self.latency_slo:
            return at
        return (
            f"{at} No latency SLO was given, so this is the highest rate the server keeps up with, however slow:"
            " give --slo-ttft-p99-ms / --slo-e2e-p99-ms for the highest rate users can live with."
        )


# --------------------------------------------------------------------------- the Pareto frontier


class ParetoPoint(BaseModel):
    """One configuration held at one rate (a search's probe, a soak's 100% stage): what the server gives
    in all against what each of its users sees, the two a configuration trades against each other."""

    configuration: str | None = Field(description="the sweep's configuration; None: a search's own probe")
    qps: float = Field(description="the rate it was held at")
    run: str = Field(description="its run directory, relative to the page")
    output_tokens_per_s_per_gpu: float = Field(
        description="the hold's output tok/s of successful requests over the GPUs its run saw (all, when none)"
    )
    gpu_count: int | None = Field(description="GPUs its run saw; None: none, the tok/s are the server's")
    tokens_per_s_per_user: float = Field(description="1000 / the hold's TPOT p50: one user's stream")
    passed: bool | None = Field(description="the verdict of its probe or soak; None: not judged")
    on_frontier: bool = Field(
        default=False, description="it passed, and no other that passed gives as much on both axes and more on one"
    )

    @property
    def label(self) -> str:
        rate = f"{self.qps:g} req/s"
        return rate if self.configuration is None else f"{self.configuration} @ {rate}"


# --------------------------------------------------------------------------- configuration sweep (sweep.json)

SweepMode = Literal["search", "soak"]
ServerStart = Literal["started", "did_not_start", "interrupted"]


class SweepRow(BaseModel):
    """One configuration of a sweep: how its server started and what its search or soak showed."""

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
    output_tokens_per_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput_qps: float | None = None
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
