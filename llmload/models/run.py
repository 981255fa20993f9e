"""run.json's contract: a run's plan (stages, goodput SLOs, access, models, fleet, pricing), written at its start."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field, PositiveFloat, PositiveInt, ValidationError, model_validator

from llmload.errors import InputError, validation_message
from llmload.models.serving import ServerIdentity
from llmload.models.strict import Strict

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


# --------------------------------------------------------------------------- labels

LABEL_SYNTAX = "KEY=VALUE, e.g. --label release=1.4.2 --label commit=abc123"


def parse_labels(specs: Iterable[str]) -> dict[str, str]:
    """`--label` values (repeatable) as run.json's `labels`, the team's own names for a run (a release, a
    commit) that `llmload history` shows beside what run.json records. A value without `=`, an empty key
    or a key given twice is an InputError naming it, before anything runs."""
    labels: dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--label {spec!r}: expected {LABEL_SYNTAX}")
        if key in labels:
            raise InputError(f"--label {spec!r}: {key!r} is already labelled {labels[key]!r}; give each key once")
        labels[key] = value.strip()
    return labels


# --------------------------------------------------------------------------- run plan


class Stage(Strict):
    """One step of the ramp: `qps` requests/s (percent of the target) from start_s for duration_s."""

    name: str
    percent: float
    qps: float
    start_s: float
    duration_s: float
    warmup: bool = Field(default=False, description="reported but never judged: it fills sessions to every depth")
    sessions: PositiveInt | None = Field(
        default=None,
        description="--sessions-in-flight: the conversations kept in flight (a closed loop: qps is 0, the rate is"
        " the server's answer)",
    )

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


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
    handed_over_slots: bool = Field(
        default=False, description="a closed loop: from then on the other workers kept its conversations in flight"
    )
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
    workload_sha256: str | None = Field(
        default=None, description="the workload file and its sessions file, as read at the start; None before it"
    )
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
    labels: dict[str, str] = Field(
        default_factory=dict, description="the team's own names for the run (--label KEY=VALUE): a release, a commit"
    )
    flags: dict[str, Any] = Field(
        default_factory=dict,
        description="every plan flag as the run had it (llmload.plan.PlanFlags, by field): a flag added there is"
        " recorded here with no edit; {} in runs before it",
    )

    @property
    def judged_stages(self) -> list[Stage]:
        """The stages a run is judged on: all but the warm-up, which is reported and never judged."""
        return [stage for stage in self.stages if not stage.warmup]

    @property
    def judged_started_at(self) -> float:
        """When the first judged stage began (unix seconds)."""
        judged = self.judged_stages
        return self.started_at + (judged[0].start_s if judged else 0.0)
