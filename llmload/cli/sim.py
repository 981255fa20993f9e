"""`llmload sim`: command-line flags, each one a SimConfig field (faults also from `--faults FILE.yaml`);
`llmload sim calibrate` (llmload/cli/sim_calibrate.py) fits a profile to a real server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llmload.cli import sim_calibrate
from llmload.cli.aliases import DeprecatedAlias as _DeprecatedAlias
from llmload.errors import InputError, validation_message
from llmload.hardware.gpus import GPUS
from llmload.server.arguments import add_serving_arguments, serving_config, serving_files_given
from llmload.sim.config import FAULT_KINDS, FaultPlan, FaultSpec, SimConfig, SlowTokens
from llmload.sim.profiles import DERIVED, PROFILES, STARTUP_WARNING, StartupRefusal, resolve_profile
from llmload.workload.distributions import parse_distribution
from llmload.yamlfile import load_yaml_model


def _parsed(parse: Any) -> Any:
    """An argparse type from a `parse(text)` classmethod, its ValueError shown as the usage error."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValidationError as e:
            raise argparse.ArgumentTypeError(validation_message(e)) from None
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _setting(group: Any, field: str) -> None:
    """A flag named, typed, defaulted and explained by its SimConfig field, so the two cannot drift."""
    info = SimConfig.model_fields[field]
    group.add_argument(
        "--" + field.replace("_", "-"),
        type=info.annotation,
        default=info.default,
        help=f"{info.description} (default: %(default)s)",
    )


HELP = "the embedded OpenAI-compatible target (vLLM-like on the wire)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for field in ("host", "port", "tokenizer", "default_max_tokens", "concurrency_limit"):
        _setting(parser, field)
    parser.add_argument(
        "--model",
        "--model-name",
        dest="model_name",
        action=_DeprecatedAlias,
        default=None,
        help="served model name (default: the vLLM config's served-model-name, else "
        f"{SimConfig.model_fields['model_name'].default}); --model-name is its old spelling",
    )
    paced = parser.add_argument_group("fixed pacing (without --profile): exact, configured timing")
    for field in ("ttft_ms", "prefill_tokens_per_s", "itl_ms"):
        _setting(paced, field)
    _add_engine_arguments(parser)
    _add_fault_arguments(parser)
    _add_answer_arguments(parser)
    access = parser.add_argument_group("who may connect: as vLLM's flags of the same names")
    access.add_argument("--api-key", default=None, help=SimConfig.model_fields["api_key"].description)
    for field in ("ssl_certfile", "ssl_keyfile", "ssl_ca_certs"):
        flag = "--" + field.replace("_", "-")
        access.add_argument(
            flag, type=Path, default=None, metavar="FILE", help=SimConfig.model_fields[field].description
        )
    subcommands = parser.add_subparsers(dest="sim_command", title="subcommands", metavar="calibrate")
    calibrate = subcommands.add_parser("calibrate", help=sim_calibrate.HELP, description=sim_calibrate.__doc__)
    sim_calibrate.add_arguments(calibrate)
    calibrate.set_defaults(run=sim_calibrate.run)


def _add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """Engine mode: a profile's timing, the GPU it sizes, and vLLM's own serving settings."""
    engine = parser.add_argument_group("engine mode: vLLM's scheduler and paged KV cache, timed by a profile")
    engine.add_argument(
        "--profile",
        default=None,
        metavar="NAME|FILE.yaml",
        help=f"engine profile: {', '.join(PROFILES)}, or a YAML file (default with --gpu: the server its vLLM "
        "settings describe, its timing derived from the GPU's data sheet)",
    )
    gpu = engine.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU (default: the profile's)")
    gpu.add_argument("--gpu", metavar="NAME", help=f"a GPU by name: {', '.join(GPUS)}")
    add_serving_arguments(
        parser,
        "the server's vLLM settings: with --profile they size the engine, each replacing the profile's; "
        "--max-model-len also sets fixed pacing's context length",
    )


def _add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    faults = parser.add_argument_group("fault injection (docs/simulator.md)")
    faults.add_argument("--faults", type=Path, metavar="FILE.yaml", help="a fault file; flags below add to it")
    faults.add_argument(
        "--fault",
        dest="fault_specs",
        metavar="KIND:PROB",
        type=_parsed(FaultSpec.parse),
        action="append",
        default=[],
        help=f"inject a fault into this fraction of requests; repeatable. Kinds: {', '.join(FAULT_KINDS)}",
    )
    faults.add_argument("--stall-s", type=float, help="how long a `stall` fault stays silent, s (default: 3600)")
    faults.add_argument("--seed", type=int, help="seed of the fault draws (default: 0)")
    faults.add_argument(
        "--die-at-kv-usage", type=float, metavar="FRACTION", help="engine death when KV usage reaches this"
    )
    faults.add_argument("--die-after-requests", type=int, metavar="N", help="engine death once N requests are admitted")
    faults.add_argument(
        "--slow-tokens",
        type=_parsed(SlowTokens.parse),
        action="append",
        default=[],
        metavar="T1:T2:MS",
        help="from T1 to T2 s after startup every token takes MS longer; repeatable",
    )


def _add_answer_arguments(parser: argparse.ArgumentParser) -> None:
    """What the answers carry and refuse, and whether a client that goes away frees what it held."""
    parser.add_argument(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage carries prompt_tokens_details.cached_tokens, like vLLM's flag of that name",
    )
    parser.add_argument(
        "--reasoning-tokens",
        type=_parsed(lambda text: parse_distribution(text, "--reasoning-tokens")),
        default=None,
        metavar="DISTRIBUTION",
        help="reasoning mode: the first N output tokens of each chat response stream as `reasoning`, as vLLM with"
        " --reasoning-parser; N is drawn per request (200, uniform:low=100,high=400, lognormal:median=..., as"
        " `workload synth` takes lengths); max_tokens counts them",
    )
    parser.add_argument(
        "--refuse-fields",
        type=lambda text: tuple(name for name in text.split(",") if name),
        default=None,
        metavar="NAME,...",
        help="answer a request carrying one of these fields with OpenAI's HTTP 400 'Unrecognized request argument'",
    )
    parser.add_argument(
        "--no-abort-on-disconnect", dest="abort_on_disconnect", action="store_false",
        help=SimConfig.model_fields["abort_on_disconnect"].description,
    )  # fmt: skip


# Fault settings whose flag is not named after the field.
_FLAG_OF = {"at_kv_usage": "die-at-kv-usage", "after_requests": "die-after-requests", "faults": "fault"}


def _fault_plan(args: argparse.Namespace) -> FaultPlan:
    """The fault file, with the flags' faults added and their settings overriding it."""
    data: dict[str, Any] = {}
    if args.faults is not None:
        data = load_yaml_model(
            args.faults, FaultPlan
        ).model_dump()  # the file alone must be valid: errors name its keys
    data["faults"] = [*data.get("faults", []), *(s.model_dump() for s in args.fault_specs)]
    data["slow_tokens"] = [*data.get("slow_tokens", []), *(s.model_dump() for s in args.slow_tokens)]
    for key in ("stall_s", "seed"):
        if getattr(args, key) is not None:
            data[key] = getattr(args, key)
    death = {"at_kv_usage": args.die_at_kv_usage, "after_requests": args.die_after_requests}
    if any(v is not None for v in death.values()):
        data["engine_death"] = {**(data.get("engine_death") or {}), **{k: v for k, v in death.items() if v is not None}}
    return FaultPlan.model_validate(data)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (0) or an injected engine death (1); 1 for a KV cache that cannot
    hold one max_model_len sequence (vLLM's ValueError); InputError for an invalid configuration."""
    try:
        faults = _fault_plan(args)
    except InputError as e:  # the file alone was refused: it names the file and its keys
        raise InputError(f"--faults {e}") from None
    except ValidationError as e:
        raise InputError(validation_message(e, flags=_FLAG_OF)) from None
    serving = serving_config(args)
    values = {k: v for k, v in vars(args).items() if k in SimConfig.model_fields and v is not None and k != "faults"}
    if "profile" not in values and (serving_files_given(args) or args.gpu):
        if args.gpu is None:
            raise InputError(
                "a vLLM configuration is timed by --gpu NAME (derived from its data sheet: llmload predict, "
                "docs/prediction.md) or --profile (a calibrated profile, e.g. vllm-cpu-tiny for the tests' CPU server)"
            )
        values["profile"] = DERIVED
    if "model_name" not in values and (serving.served_model_name or serving.model):
        values["model_name"] = serving.served_model_name or serving.model
    try:
        config = SimConfig(**values, serving=serving, faults=faults)
    except ValidationError as e:
        raise InputError(validation_message(e, flags=_FLAG_OF)) from None
    engine_plan = None
    if config.profile is not None:
        try:
            engine_plan = resolve_profile(config.profile, config.serving, args.gpu_memory_gib, args.gpu)
        except StartupRefusal as e:
            print(str(e), file=sys.stderr)
            return 1
        plan = engine_plan[1]
        print(  # vLLM's startup line, so what reads a server's log reads the simulator's
            f"INFO llmload sim: GPU KV cache size: {plan.vllm_log_kv_cache_tokens:,} tokens, Maximum concurrency for "
            f"{plan.max_model_len:,} tokens per request: {plan.at_max_model_len.max_concurrency:.2f}x",
            file=sys.stderr,
            flush=True,
        )
        print(
            f"INFO llmload sim: timing: {engine_plan[0].calibration} ({engine_plan[0].timing_source})",
            file=sys.stderr,
            flush=True,
        )
        if (extrapolated := engine_plan[0].extrapolation(plan)) is not None:
            print(f"{STARTUP_WARNING}{extrapolated}", file=sys.stderr, flush=True)
    from llmload.sim.server import serve

    return serve(config, engine_plan)
