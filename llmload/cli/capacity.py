"""`llmload capacity`: KV-cache capacity of a model on a server (or of a `vllm serve` configuration),
a preflight of a workload against it, or an explained vLLM startup log.

Exit codes: 0 fine; 1 vLLM would refuse to start with these settings (or the log shows it did), or
with --workload the preflight fails (the last stage does not fit, or too many requests exceed
max_model_len); 2 bad input (unreadable config, unknown key, missing field, negative size).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from pydantic import ValidationError

from llmload.capacity.kv import GIB
from llmload.capacity.model import ModelSpec, known_models, load_bundled_model, load_config_file
from llmload.capacity.plan import CapacityReport, plan_capacity
from llmload.capacity.render import render_capacity, render_log_explanation, render_serve_config
from llmload.capacity.serving import gpu_memory_gib, on_gpu, serve_inputs, serve_model, with_quantization
from llmload.capacity.vllm_log import explain_vllm_log
from llmload.cli.aliases import DeprecatedAlias
from llmload.errors import InputError, validation_message
from llmload.gates.soak import DEFAULT_HOLD_S
from llmload.hardware.gpus import GPUS
from llmload.models import ServeConfig
from llmload.plan import PlanFlags
from llmload.preflight.compute import compute_fit
from llmload.preflight.memory import (
    DEFAULT_MAX_ERROR_RATE,
    Preflight,
    TimingBasis,
    measured_saturation,
    measured_timing,
    predicted_timing,
    preflight,
)
from llmload.preflight.render import render_preflight
from llmload.schedule import DEFAULT_STAGE_PERCENTS, DEFAULT_STAGES, build_stages, parse_stage_percents
from llmload.server.arguments import add_serving_arguments, serving_config
from llmload.sim.profiles import StartupRefusal, resolve_profile

HELP = "KV-cache capacity of a model or a vLLM config, a workload's preflight, or explain a vLLM startup log"


def _number(
    kind: Callable[[str], float], *, allow_zero: bool = False, at_most: float | None = None
) -> Callable[[str], float]:
    """argparse type: a number > 0 (or >= 0), optionally <= ``at_most``; anything else exits 2."""

    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if value < 0 or (value == 0 and not allow_zero) or (at_most is not None and value > at_most):
            bounds = f"{'>= 0' if allow_zero else '> 0'}" + (f" and <= {at_most:g}" if at_most is not None else "")
            raise argparse.ArgumentTypeError(f"must be {bounds}, got {text}")
        return value

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The server's settings, its model, what vLLM measures, the workload, and the preflight's stages."""
    add_serving_arguments(parser, "the server's vLLM settings")
    _add_model_arguments(parser)
    _add_memory_arguments(parser)
    _add_workload_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the model's shape comes from: a bundled config, a config.json, or vLLM's own startup log."""
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--model-config", metavar="NAME", help=f"a bundled model config: {', '.join(known_models())}")
    source.add_argument(
        "--hf-config",
        "--config",
        dest="hf_config",
        action=DeprecatedAlias,
        metavar="PATH",
        type=Path,
        help="a model's Hugging Face config.json (or its directory); --config is its old spelling",
    )
    source.add_argument(
        "--vllm-log",
        metavar="FILE",
        help="explain a vLLM startup log: its KV-cache lines, and why it did not start (- = stdin)",
    )


def _add_memory_arguments(parser: argparse.ArgumentParser) -> None:
    """What vLLM measures at startup rather than is told: the GPU, the weights, the overhead, the KV budget."""
    memory = parser.add_argument_group("server: what vLLM measures rather than is told")
    gpu = memory.add_mutually_exclusive_group()
    gpu.add_argument(
        "--gpu-memory-gib", metavar="GIB", type=_number(float), help="memory of one GPU, GiB (as torch reports it)"
    )
    gpu.add_argument("--gpu", metavar="NAME", help=f"a GPU by name: {', '.join(GPUS)}")
    memory.add_argument(
        "--weights-gib", metavar="GIB", type=_number(float, allow_zero=True), help="whole model; default: estimated"
    )
    memory.add_argument(
        "--overhead-gib",
        metavar="GIB",
        type=_number(float, allow_zero=True),
        help="per GPU: activation peak, CUDA graphs, NCCL/cuBLAS (default: estimated from the model, "
        "--max-num-batched-tokens, --max-num-seqs, TP and the GPU, as vLLM's profile run measures it)",
    )
    memory.add_argument(
        "--kv-cache-gib",
        metavar="GIB",
        type=_number(float),
        help="KV memory per GPU, instead of the budget: --kv-cache-memory-bytes in GiB",
    )


def _add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """The requests that must fit, and the preflight's: a workload at every stage of the load test."""
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--request-tokens",
        metavar="TOKENS",
        type=_number(int),
        help="tokens per request (prompt + output), e.g. the workload's P99",
    )
    workload.add_argument(
        "--min-concurrency", metavar="X", type=_number(float), help="full-length requests that must fit at once"
    )
    check = parser.add_argument_group("preflight: does a workload fit at every stage? (docs/capacity.md)")
    check.add_argument("--workload", metavar="FILE.yaml", help="a workload file: its requests, turn by turn")
    PlanFlags.add_arguments(check, ["target_qps"])
    check.add_argument(
        "--stages",
        type=parse_stage_percents,
        default=DEFAULT_STAGE_PERCENTS,
        help=f"stage rates as %% of --target-qps, as the load test runs them (default {DEFAULT_STAGES})",
    )
    check.add_argument(
        "--profile",
        metavar="NAME|FILE.yaml",
        help="the server's timing from a calibrated profile (llmload sim calibrate) instead of derived from --gpu",
    )
    check.add_argument(
        "--from-run",
        metavar="RUN_DIR",
        type=Path,
        help="take E2E times and, where a stage fell behind, the throughput measured in this run",
    )
    check.add_argument(
        "--max-error-rate",
        type=_number(float, allow_zero=True, at_most=1.0),
        default=DEFAULT_MAX_ERROR_RATE,
        help="share of requests over max_model_len that still passes (default %(default)s, the soak's)",
    )


def _serve_config(args: argparse.Namespace) -> ServeConfig:
    config = serving_config(args)
    if args.gpu:
        config = on_gpu(config, args.gpu)
    if args.kv_cache_gib is None:
        return config
    kv_bytes = math.floor(args.kv_cache_gib * GIB)
    return config.model_copy(
        update={
            "kv_cache_memory_bytes": kv_bytes,
            "origins": {**config.origins, "kv_cache_memory_bytes": "--kv-cache-gib"},
        }
    )


def _model(args: argparse.Namespace, config: ServeConfig) -> ModelSpec:
    if args.hf_config:
        return with_quantization(load_config_file(args.hf_config), config)
    if args.model_config:
        return with_quantization(load_bundled_model(args.model_config), config)
    if config.model is not None:
        return serve_model(config)
    raise InputError("give the model: --model-config NAME, --hf-config PATH, or a --vllm-config that names it")


def _plan(args: argparse.Namespace, config: ServeConfig, model: ModelSpec) -> CapacityReport:
    measured = {
        "gpu_memory_gib": args.gpu_memory_gib or (gpu_memory_gib(args.gpu) if args.gpu else None),
        "weights_gib": args.weights_gib,
        "overhead_gib": args.overhead_gib,
        "request_tokens": args.request_tokens,
        "min_concurrency": args.min_concurrency,
    }
    return plan_capacity(model, serve_inputs(config, **measured))


def _preflight(args: argparse.Namespace, config: ServeConfig, model: ModelSpec, plan: CapacityReport) -> Preflight:
    from llmload.workload.files import load_workload
    from llmload.workload.stats import request_table, workload_stats

    workload = load_workload(args.workload)
    target_qps = PlanFlags.checked(target_qps=args.target_qps).target_qps or workload.spec.target_qps
    if target_qps is None:
        raise InputError("--workload needs --target-qps (the 100% rate the stages are percents of): its file has none")
    table = request_table(workload)
    wanted = workload_stats(table).recommended_max_model_len
    limit = plan.max_model_len_limit
    recommended_len = min(wanted, limit) if wanted and limit else wanted
    recommended = (
        _plan(args, config.model_copy(update={"max_model_len": recommended_len}), model) if recommended_len else None
    )
    try:
        stages = build_stages(target_qps, args.stages, hold_duration_s=DEFAULT_HOLD_S)
    except ValueError as exc:
        raise InputError(str(exc)) from None
    if args.gpu is None and args.profile is None:
        raise InputError(
            "the preflight judges the server's compute as well as its memory: give --gpu NAME (the timing derived "
            "from its data sheet) or --profile (a calibrated one)"
        )
    served = config if config.model is not None else config.model_copy(update={"model": model.source})
    try:
        profile, profile_plan = resolve_profile(args.profile, served, args.gpu_memory_gib, args.gpu)
    except StartupRefusal as exc:
        raise InputError(f"the server timed for the preflight would not start: {exc}") from None
    measured: dict[str, TimingBasis] = {}
    saturation = None
    if args.from_run is not None:
        measured, _ = measured_timing(args.from_run)
        saturation = measured_saturation(args.from_run)
    try:
        compute = compute_fit(
            table,
            profile,
            profile_plan.cache.num_blocks,
            [(stage.name, stage.qps, stage.duration_s) for stage in stages],
            saturation,
        )
    except ValueError as exc:
        raise InputError(f"--workload {args.workload}: {exc}") from None
    timings = [
        measured.get(stage.name) or predicted_timing(fit, compute)
        for stage, fit in zip(stages, compute.stages, strict=True)
    ]
    return preflight(
        table,
        plan,
        recommended,
        [(stage.name, stage.qps, timing) for stage, timing in zip(stages, timings, strict=True)],
        compute,
        wanted_beyond_limit=wanted if wanted != recommended_len else None,
        max_num_seqs=config.max_num_seqs,
        target_qps=target_qps,
        max_error_rate=args.max_error_rate,
    )


def _read_log(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(f"{name}: cannot read ({exc.strerror or exc})") from exc


def run(args: argparse.Namespace) -> int:
    try:
        if args.vllm_log is not None:
            explanation = explain_vllm_log(_read_log(args.vllm_log), source=args.vllm_log)
            if not explanation.findings and not explanation.vllm_lines:
                raise InputError(
                    f"{args.vllm_log}: no vLLM KV-cache lines or startup errors found, nor any line in vLLM's "
                    "logger format (LEVEL MM-DD HH:MM:SS [file.py:N]): is it a vLLM server's log?"
                )
            print(explanation.model_dump_json(indent=2) if args.json else render_log_explanation(explanation))
            return 1 if explanation.failed else 0
        config = _serve_config(args)
        model = _model(args, config)
        report = _plan(args, config, model)
        fit = _preflight(args, config, model, report) if args.workload and report.starts else None
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None
    if args.json:
        answer = {"vllm_config": config, "capacity": report, "preflight": fit}
        print(json.dumps({k: v.model_dump(mode="json") for k, v in answer.items() if v is not None}, indent=2))
    else:
        if config.origins:
            print(render_serve_config(config))
        print(render_capacity(report))
        if fit is not None:
            print(render_preflight(fit))
    if fit is not None:
        return 0 if fit.passes else 1
    return 0 if report.startup_error is None else 1
