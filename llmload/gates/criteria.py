"""The soak's criteria: what a hold must show to PASS (docs/gates.md), from a YAML file and the flags
on top of it. The verdict (llmload.gates.verdict) judges a run against them; the flags are shared by
`llmload verdict`, `search`, `sweep` and Locust's parser.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import Strict
from llmload.yamlfile import load_yaml_model

AlertAction = Literal["warn", "fail"]


class DriftMinRise(Strict):
    """Projected rise over the hold below which a slope is never drift, per signal: fast targets jitter."""

    ttft_p99_ms: NonNegativeFloat = 5.0
    e2e_p99_ms: NonNegativeFloat = 5.0
    kv_cache_usage: NonNegativeFloat = Field(default=0.02, description="fraction of the KV cache (0..1)")
    waiting: NonNegativeFloat = Field(default=1.0, description="requests")
    preemptions_per_s: NonNegativeFloat = 0.05
    in_flight: NonNegativeFloat = Field(default=2.0, description="requests the client had sent and not seen finish")


class DriftCriteria(Strict):
    """A signal drifts when its least-squares slope over per-window values is positive with
    `confidence` (the interval excludes 0) and its projected rise over the hold exceeds both
    `relative_rise` × its fitted level at the hold's start and the signal's `min_rise`."""

    window_s: PositiveFloat = 10.0
    relative_rise: NonNegativeFloat = 0.20
    confidence: float = Field(default=0.999, gt=0, lt=1)
    min_windows: int = Field(default=6, ge=5, description="fewer windows: the check is skipped")
    min_rise: DriftMinRise = DriftMinRise()
    max_other_cpu: float = Field(
        default=0.25, ge=0, le=1, description="windows where other work took more of this machine's CPU are left out"
    )
    max_steal: float = Field(
        default=0.05, ge=0, le=1, description="windows where the hypervisor took more of the CPU are left out"
    )


class KeepingUpCriteria(Strict):
    """Whether the requests in flight grow, judged three ways (docs/gates.md): FAIL when they grow with
    `fail_confidence`, PASS when an overload of `overload` is ruled out with `pass_confidence`,
    INCONCLUSIVE in between. Set by the error-rate harness (llmload/errorrates) to its targets."""

    fail_confidence: float = Field(default=0.999, gt=0.5, lt=1)
    pass_confidence: float = Field(default=0.99, gt=0.5, lt=1)
    overload: float = Field(default=0.10, gt=0, description="the overload a PASS rules out (0.10: 10% over capacity)")
    answer_spans: float = Field(
        default=8.0, gt=0, description="the judged part of the hold must last this many E2E p90s to tell anything"
    )


class AlertLevels(Strict):
    """The levels production alerts on (vLLM dashboards), checked per window of the hold."""

    kv_cache_usage: float = Field(default=0.90, description="mean KV-cache usage of a window (0..1)")
    waiting: float = Field(default=10, description="mean waiting requests of a window")
    e2e_p99_ms: float = Field(default=2000, description="p99 E2E of the requests sent in a window")
    gpu_memory_used: float = Field(default=0.90, description="mean memory used / total of the fullest GPU (0..1)")
    prefix_cache_hit_rate: float | None = Field(
        default=None, ge=0, le=1, description="fires *below* this prefix-cache hit rate of a window (0..1); off"
    )


class AlertActions(Strict):
    kv_cache_usage: AlertAction = "warn"
    waiting: AlertAction = "warn"
    e2e_p99_ms: AlertAction = "warn"
    gpu_memory_used: AlertAction = "warn"
    prefix_cache_hit_rate: AlertAction = "warn"


class AlertCriteria(Strict):
    window_s: PositiveFloat = Field(default=60.0, description="like an alert rule's range; the hold if shorter")
    levels: AlertLevels = AlertLevels()
    actions: AlertActions = AlertActions()


class SoakCriteria(Strict):
    """What a soak's hold must show to PASS; a YAML file overrides any subset (unknown keys fail)."""

    max_error_rate: float = Field(default=0.01, ge=0, le=1, description="failed / sent in the hold")
    min_achieved_ratio: float = Field(default=0.98, ge=0, le=1, description="achieved / target req/s in the hold")
    slo_ttft_p99_ms: PositiveFloat | None = None
    slo_ttfo_p99_ms: PositiveFloat | None = Field(
        default=None, description="p99 time to first answer token (reasoning models; TTFT where none reasoned)"
    )
    slo_e2e_p99_ms: PositiveFloat | None = None
    min_goodput_ratio: float | None = Field(
        default=None, ge=0, le=1, description="goodput / achieved req/s in the hold; the run needs --goodput-slo"
    )
    max_e2e_share_of_hold: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="E2E p99 / the hold's length above which the hold is too short to judge (a search sets 1/3)",
    )
    max_prefix_cache_gap: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="points (0..1) the server's prefix-cache hit rate may fall below the share the prompts sent could"
        " hit: a cache too small, eviction, routing that breaks session affinity; off",
    )
    drift: DriftCriteria = DriftCriteria()
    keeping_up: KeepingUpCriteria = KeepingUpCriteria()
    alerts: AlertCriteria = AlertCriteria()


# --------------------------------------------------------------------------- command-line flags


def add_criteria_arguments(parser: Any) -> None:
    """The soak flags, for `llmload soak` and Locust's parser alike (only `add_argument` is used)."""
    parser.add_argument("--criteria", dest="soak_criteria", default=None, help="soak criteria YAML (docs/gates.md)")
    parser.add_argument("--slo-ttft-p99-ms", type=float, default=None, help="p99 TTFT SLO of the hold, ms")
    parser.add_argument(
        "--slo-ttfo-p99-ms",
        type=float,
        default=None,
        help="p99 SLO of the hold's time to first answer token (after a reasoning model's thinking), ms",
    )
    parser.add_argument("--slo-e2e-p99-ms", type=float, default=None, help="p99 E2E SLO of the hold, ms")
    parser.add_argument(
        "--max-error-rate", type=float, default=None, help="failed/sent allowed in the hold, a fraction (0.01)"
    )
    parser.add_argument(
        "--min-achieved-ratio", type=float, default=None, help="achieved/target req/s the hold needs (0.98)"
    )
    parser.add_argument(
        "--min-goodput-ratio", type=float, default=None, help="goodput/achieved req/s the hold needs (--goodput-slo)"
    )
    parser.add_argument(
        "--max-prefix-cache-gap",
        type=float,
        default=None,
        help="points (0..1) the server's prefix-cache hit rate may fall below what the prompts sent could hit (off)",
    )
    parser.add_argument(
        "--alerts",
        dest="soak_alerts",
        choices=["warn", "fail"],
        default=None,
        help="what KV usage > 90%%, waiting > 10, p99 E2E > 2 s or GPU memory used > 90%% in the hold does"
        " (default: warn)",
    )


_FLAG_FIELDS = (
    "slo_ttft_p99_ms", "slo_ttfo_p99_ms", "slo_e2e_p99_ms", "max_error_rate", "min_achieved_ratio",
    "min_goodput_ratio", "max_prefix_cache_gap",
)  # fmt: skip


def criteria_from_args(args: argparse.Namespace) -> SoakCriteria:
    """The criteria file (if any), then the flags given on top; InputError names what is wrong."""
    path = args.soak_criteria
    criteria = load_yaml_model(Path(path), SoakCriteria) if path else SoakCriteria()
    data = criteria.model_dump()
    data.update({f: getattr(args, f) for f in _FLAG_FIELDS if getattr(args, f) is not None})
    if args.soak_alerts is not None:
        data["alerts"]["actions"] = dict.fromkeys(AlertActions.model_fields, args.soak_alerts)
    try:
        return SoakCriteria.model_validate(data)
    except ValidationError as exc:  # the file was valid: a flag is not
        raise InputError(validation_message(exc, flags={})) from None
