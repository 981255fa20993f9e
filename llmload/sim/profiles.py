"""Engine profiles: a model on a server, sized by llmload.capacity and timed by a step-cost model.

A profile names a model config (one of llmload/capacity/models, or a config.json path) and the
serving hardware; its KV pool comes from `plan_capacity` exactly as vLLM sizes it, so the
simulator runs out of blocks where the real server would. Its step timing comes from one of three
places (`EngineProfile.timing_source`):
- derived: a GPU of llmload/hardware and no `timing`: the roofline of llmload/perf, from the model's
  architecture and the GPU's data sheet (docs/prediction.md);
- calibrated: a linear model fitted to a real server (`llmload sim calibrate`, llmload/calibrate:
  `vllm-cpu-tiny` and any profile it writes, which keeps the fit's points in `fit`);
- given in a file: a `timing` written by hand.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from llmload.capacity.max_len import verify_max_model_len
from llmload.capacity.model import load_model
from llmload.capacity.plan import CapacityInputs, CapacityReport, plan_capacity
from llmload.capacity.serving import model_reference, on_gpu
from llmload.errors import InputError, validation_message
from llmload.hardware.gpus import gpu
from llmload.models import ServeConfig, Strict
from llmload.perf.derive import derive_timing
from llmload.perf.roofline import RooflineTiming
from llmload.yamlfile import load_yaml_model

EXTRAPOLATION_MARGIN = 1.25  # a configuration's steps may hold this much more KV than calibrated before a warning
STARTUP_WARNING = "WARNING llmload sim: "  # a line of the simulator's startup log that a sweep carries to its row


class StepTiming(Strict):
    """Cost of one engine step: base + per_seq·seqs + per_kv·KV tokens read + prefill tokens / throughput
    + prefill attention pairs × their cost."""

    frontend_ms: NonNegativeFloat = Field(description="API server work before a request reaches the engine")
    api_server_ms: NonNegativeFloat = Field(
        default=0.0, description="the API server's CPU per request, one request after another (0: not modelled)"
    )
    prefill_tokens_per_s: PositiveFloat
    decode_base_ms: NonNegativeFloat = Field(description="a step's fixed cost: weights read, launch overhead")
    decode_per_seq_ms: NonNegativeFloat = Field(description="each sequence scheduled in the step")
    decode_per_kv_token_us: NonNegativeFloat = Field(description="each KV token the step's attention reads")
    prefill_attention_ns: NonNegativeFloat = Field(
        default=0.0,
        description="each (prompt token, earlier token) pair a prefill computes: a prompt's cost grows with its "
        "square (0: linear prefill)",
    )
    steady_load_factor: PositiveFloat = Field(
        default=1.0,
        description="every step costs this many times the values above: what a calibration's steady-load point "
        "measured beyond the costs fitted on bursts (1: none)",
    )

    def step_s(self, seqs: int, kv_tokens: int, prefill_tokens: int, prefill_pairs: int = 0) -> float:
        ms = self.decode_base_ms + self.decode_per_seq_ms * seqs + self.decode_per_kv_token_us * kv_tokens / 1000
        prefill_s = prefill_tokens / self.prefill_tokens_per_s + self.prefill_attention_ns * prefill_pairs / 1e9
        return (ms / 1000 + prefill_s) * self.steady_load_factor

    def saturation_qps(self, running: int, prompt_tokens: float, output_tokens: int) -> float:
        """Requests/s the engine completes with `running` sequences always scheduled (max_num_seqs, or
        what the KV cache holds): each is prefilled once (with its attention) and decoded one token a
        step over a mean context of prompt + output/2. Past this rate its waiting queue grows without end."""
        decode_s = self.step_s(running, round(running * (prompt_tokens + output_tokens / 2)), 0)
        pairs = prompt_tokens * (prompt_tokens + 1) / 2
        prefill_s = prompt_tokens / self.prefill_tokens_per_s + self.prefill_attention_ns * pairs / 1e9
        return running / (output_tokens * decode_s + running * prefill_s)


Timing = StepTiming | RooflineTiming
"""A step-cost model: fitted or given (StepTiming, linear) or derived from a GPU (RooflineTiming)."""

TimingSource = Literal["derived", "calibrated", "given in a file"]

ProbeKind = Literal["prefill", "decode"]
"""prefill: single requests of one output token, TTFT measured; decode: concurrent streams, ITL."""


class CalibrationPoint(Strict):
    """One measured point of a calibration: a probe's median over its repeats, and what the fit says."""

    kind: ProbeKind = Field(
        description="prefill: single requests of one output token, TTFT measured; decode: concurrent streams, ITL"
    )
    streams: PositiveInt
    prompt_tokens: PositiveInt = Field(description="per request, as the server counted them (usage)")
    output_tokens: PositiveInt
    repeats: PositiveInt
    measured_ms: PositiveFloat = Field(description="median over repeats of the server's mean TTFT or ITL")
    spread_pct: NonNegativeFloat = Field(description="(p75 − p25) / median of the repeats: the noise")
    fitted_ms: float = Field(description="what the fitted timing makes the simulator's engine do here")
    residual_pct: float = Field(description="(fitted − measured) / measured")


class SteadyLoadPoint(Strict):
    """Open-loop Poisson arrivals of chats sharing system prompts, as production sends them, against
    the server, in windows between rounds of bursts; replayed through the simulator's engine on a
    virtual clock with the burst-fitted timing, then with the factor that makes the mean E2E match.
    Means over the point's requests, as the client saw them."""

    rate_qps: PositiveFloat
    duration_s: PositiveFloat = Field(description="of its windows together")
    windows: PositiveInt = 1
    requests: PositiveInt
    prompt_tokens: PositiveInt = Field(description="mean per request, as the server counted them")
    output_tokens: PositiveInt
    measured_e2e_ms: PositiveFloat
    measured_ttft_ms: PositiveFloat
    measured_itl_ms: PositiveFloat
    burst_fit_e2e_ms: PositiveFloat = Field(description="the replay's mean E2E with the burst-fitted timing alone")
    factor: PositiveFloat = Field(description="steady_load_factor: the burst fit's step costs × this match the E2E")
    fitted_ttft_ms: PositiveFloat = Field(description="the replay's mean TTFT with the factor")
    fitted_itl_ms: PositiveFloat = Field(description="the replay's mean ITL with the factor")


class CalibrationFit(Strict):
    """How a profile's timing was fitted (`llmload sim calibrate`): the points behind it and how well
    it fits them. A poor fit is flagged here and printed, never silent."""

    host: str
    served_model: str
    measured_at: str = Field(description="ISO 8601, UTC")
    duration_s: NonNegativeFloat
    rounds: NonNegativeInt = Field(description="complete passes over the probes; each point is a median over them")
    load_average: float | None = Field(
        default=None, description="the calibrating machine's 1-minute load average at the end (shared CPUs skew it)"
    )
    r2_itl: float | None = Field(description="R² of the decode points' inter-token latency")
    r2_ttft: float | None = Field(description="R² of the prefill points' time to first token")
    max_abs_residual_pct: NonNegativeFloat
    standard_errors: dict[str, float] = Field(description="±1 standard error of each fitted timing value")
    poor: bool = Field(description="the timing does not describe the measurements well: see warnings")
    warnings: list[str] = Field(default_factory=list)
    assumed: list[str] = Field(default_factory=list, description="serving settings the server did not tell")
    points: list[CalibrationPoint]
    steady_load: SteadyLoadPoint | None = Field(
        default=None, description="the steady-arrival point behind `timing.steady_load_factor` (None: not measured)"
    )

    @property
    def decode_kv_tokens_max(self) -> int | None:
        """The most KV tokens a measured decode step held: past it, the per-KV-token cost is extrapolated."""
        return max((p.streams * (p.prompt_tokens + p.output_tokens) for p in self.points if p.kind == "decode"),
                   default=None)  # fmt: skip


class EngineProfile(Strict):
    """One model served by vLLM on one kind of server: what the simulator's engine needs, the vLLM
    settings (`serving`) and the step timing."""

    name: str
    description: str
    calibration: str = Field(description="where the timing numbers come from")
    serving: ServeConfig = Field(
        description="the server's vLLM settings; `model` is a bundled llmload/capacity/models name or a config.json "
        "path, and max_model_len (-1: the longest the KV cache holds), max_num_seqs and max_num_batched_tokens "
        "are required"
    )
    gpu: str | None = Field(
        default=None, description="a GPU of llmload/hardware: its memory, and the timing derived when `timing` is unset"
    )
    gpu_memory_gib: PositiveFloat | None = Field(default=None, description="one GPU's memory (default: the GPU's)")
    weights_gib: NonNegativeFloat | None = None
    overhead_gib: NonNegativeFloat | None = Field(
        default=None, description="per GPU besides weights and KV; None: estimated as capacity estimates it"
    )
    timing: Timing | None = Field(default=None, description="None: derived from `gpu` (llmload/perf)")
    fit: CalibrationFit | None = Field(default=None, description="the calibration behind `timing`, when fitted")

    @model_validator(mode="after")
    def _scheduler_is_sized(self) -> EngineProfile:
        missing = [k for k in _REQUIRED if getattr(self.serving, k) is None]
        if missing:
            raise ValueError(f"serving must set {', '.join(missing)}")
        if self.timing is None and self.gpu is None:
            raise ValueError("give `timing`, or a `gpu` to derive it from")
        return self

    @property
    def timing_source(self) -> TimingSource:
        """Where the step timing comes from: derived from the GPU, calibrated on a server, or given in a file."""
        if self.timing is None or isinstance(self.timing, RooflineTiming):
            return "derived"
        return "calibrated" if self.fit is not None else "given in a file"

    @property
    def step_timing(self) -> Timing:
        """The timing the engine runs (a derived one once `resolve_profile` sized the profile)."""
        if self.timing is None:
            raise ValueError(f"profile {self.name}: timing not derived yet (resolve_profile derives it)")
        return self.timing

    # The settings every profile sets (_REQUIRED); the rest, vLLM's defaults filled, are `serving.resolved()`.
    @property
    def model(self) -> str:
        return str(self.serving.model)

    @property
    def max_model_len(self) -> int:
        return int(self.serving.max_model_len or 0)

    @property
    def max_num_seqs(self) -> int:
        return int(self.serving.max_num_seqs or 0)

    @property
    def max_num_batched_tokens(self) -> int:
        return int(self.serving.max_num_batched_tokens or 0)

    def capacity_inputs(self) -> CapacityInputs:
        memory = self.gpu_memory_gib or (gpu(self.gpu).memory_gib if self.gpu else None)
        return CapacityInputs(
            serving=self.serving,
            gpu_memory_gib=memory,
            weights_gib=self.weights_gib,
            overhead_gib=self.overhead_gib,
        )

    def extrapolation(self, plan: CapacityReport) -> str | None:
        """What this configuration's steps reach beyond the KV its calibration measured (None: nothing
        past EXTRAPOLATION_MARGIN of it, or no calibration): a profile calibrated against a small
        cache and asked about a large one predicts those steps from a straight line."""
        measured = self.fit.decode_kv_tokens_max if self.fit is not None else None
        reachable = min(plan.cache.tokens, self.max_num_seqs * plan.max_model_len)
        if measured is None or reachable <= EXTRAPOLATION_MARGIN * measured:
            return None
        return (
            f"the profile's decode steps were measured holding up to {measured:,} KV tokens; this "
            f"configuration's steps can hold {reachable:,} ({reachable / measured:.1f}x), and their times are "
            "extrapolated: calibrate against the configuration with the largest KV cache you will try"
        )

    def with_serving(
        self, config: ServeConfig, gpu_memory_gib: float | None = None, gpu_name: str | None = None
    ) -> EngineProfile:
        """This profile for the server `config` describes: every setting it sets replaces the profile's
        (its model found as llmload finds a `vllm serve` model); a GPU named replaces the profile's, and
        its timing is derived anew unless the profile was calibrated or given its timing."""
        if config.model is not None:
            config = config.model_copy(update={"model": model_reference(config)})
        changes: dict[str, object] = {"serving": self.serving.with_settings(config)}
        if gpu_name is not None:
            changes["gpu"] = gpu(gpu_name).name
            changes["gpu_memory_gib"] = None
        if gpu_memory_gib is not None:
            changes["gpu_memory_gib"] = gpu_memory_gib
        if self.timing_source == "derived":
            changes["timing"] = None
        return self.model_validate({**self.model_dump(), **changes})

    def derived(self, plan: CapacityReport) -> EngineProfile:
        """This profile with its timing derived from its GPU and `plan`'s KV layout, when it is a derived one."""
        if self.timing_source != "derived" or self.gpu is None:
            return self
        vllm = self.serving.resolved()
        eager = bool(self.serving.not_modelled.get("enforce-eager"))
        timing = derive_timing(plan.model, vllm, plan.layout, gpu(self.gpu), enforce_eager=eager)
        return self.model_copy(update={"timing": timing, "calibration": timing.derivation})

    def plan(self) -> CapacityReport:
        """The KV pool vLLM would allocate, via llmload.capacity."""
        return plan_capacity(load_model(self.model), self.capacity_inputs())


_REQUIRED = ("model", "max_model_len", "max_num_seqs", "max_num_batched_tokens")


PROFILES_FILE = Path(__file__).with_name("profiles.yaml")  # package data (pyproject)


class _BuiltIn(Strict):
    profiles: list[EngineProfile]


PROFILES: dict[str, EngineProfile] = {p.name: p for p in load_yaml_model(PROFILES_FILE, _BuiltIn).profiles}
"""The built-in profiles by name, in profiles.yaml's order."""


class StartupRefusal(Exception):
    """The settings are valid but vLLM would refuse to start with them (exit code 1, its ValueError text)."""


def load_profile(name: str) -> EngineProfile:
    """A built-in profile by name, or a YAML file of EngineProfile fields."""
    if name in PROFILES:
        return PROFILES[name]
    path = Path(name)
    if not path.is_file():
        raise InputError(f"--profile {name!r}: not a file, nor one of {', '.join(PROFILES)}")
    try:
        return load_yaml_model(path, EngineProfile)
    except InputError as exc:
        raise InputError(f"--profile {exc}") from None


DERIVED = "derived"
"""The profile name of a server described by its vLLM settings and a GPU alone (`derived_profile`)."""


def derived_profile(serving: ServeConfig, gpu_name: str) -> EngineProfile:
    """The server `serving` describes on `gpu_name`s, as vLLM would run it: every key it leaves out is
    vLLM's default (max_num_seqs and max_num_batched_tokens by the GPU, as EngineArgs picks them for the
    OpenAI server; max_model_len the model's own), the timing derived (llmload/perf)."""
    card = gpu(gpu_name)
    if serving.model is None:
        raise InputError("the vLLM config names no model: add `model:` to derive its timing")
    model = load_model(model_reference(serving))
    length = serving.max_model_len or int(verify_max_model_len(model.context_limit, None).max_model_len)
    defaults = on_gpu(ServeConfig(model=serving.model, max_model_len=length), card.name)
    return EngineProfile(
        name=DERIVED,
        description=f"{serving.model} on {card.product}, as its vLLM settings describe it",
        calibration="derived",
        serving=defaults,
        gpu=card.name,
    )


def resolve_profile(
    name: str | None, serving: ServeConfig, gpu_memory_gib: float | None = None, gpu_name: str | None = None
) -> tuple[EngineProfile, CapacityReport]:
    """The profile sized by the server's settings (a `vllm serve` config and flags), and its KV pool.

    `name` None (or `derived`): the server as its settings and `gpu_name` describe it, vLLM's defaults
    for the rest, its timing derived (`derived_profile`). Refuses like vLLM (StartupRefusal, its
    ValueError text) when the pool cannot hold one sequence of max_model_len, or a step's token
    budget one whole prompt without chunked prefill; InputError when the profile or model config is
    unusable.
    """
    try:
        if name in (None, DERIVED):
            if gpu_name is None:
                raise InputError(
                    "give --gpu NAME (the timing derived from its data sheet) or --profile (a calibrated profile)"
                )
            base, gpu_name = derived_profile(serving, gpu_name), None
        else:
            base = load_profile(name)
        profile = base.with_serving(serving, gpu_memory_gib, gpu_name)
        plan = profile.plan()
        resolved = profile.serving.model_copy(update={"max_model_len": plan.max_model_len})  # -1 as vLLM resolves it
        profile = profile.model_copy(update={"serving": resolved}).derived(plan)
    except InputError as exc:
        raise InputError(f"--profile {name}: {exc}") from None
    except ValidationError as exc:
        raise InputError(f"--profile {name}: {validation_message(exc)}") from None
    if plan.startup_error is not None:
        raise StartupRefusal(f"ValueError: {plan.startup_error}")
    return profile, plan
