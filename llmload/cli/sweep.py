"""`llmload sweep`: which server configuration holds the most. Each configuration gets its own
server (`--serve`, in its own process group, stopped afterwards, Ctrl-C included), then a search
for the highest rate that passes the soak verdict (`--mode search`) or the 150% soak at the
target (`--mode soak`); a server that does not start is a row that says why, in vLLM's numbers.
`--predict` first runs the same sweep on the embedded target sized by each configuration.
Exit 0 when a configuration passes (at --require-qps), 1 when none does, 2 on bad input, 3 when none passes
and none could be told (every verdict INCONCLUSIVE: holds too short)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path

from llmload.capacity.serving import gpu_memory_gib
from llmload.cli.search import add_search_arguments, holds_latency, probe_flags, search_bounds
from llmload.errors import InputError
from llmload.gates.passthrough import refuse_closed_loop, refuse_overrides
from llmload.gates.search import probe_options, write_criteria
from llmload.gates.soak import DEFAULT_HOLD_S, SoakRun
from llmload.hardware.gpus import GPUS
from llmload.models import SweepResult, SweepRow
from llmload.plan import PlanFlags
from llmload.schedule import DEFAULT_STAGE_S, parse_duration
from llmload.sweep.configs import expand
from llmload.sweep.run import PREDICTED_DIR, RESULT_FILE, Sweep, load_rows, simulator_serve

HELP = "launch, gate and compare server configurations: the one that holds the most; unknown flags go to Locust"
PASSTHROUGH = True
STOPS_CLEANLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--serve", metavar='"vllm serve --config {config} --port {port}"',
        help="the command that starts a server from a config file on a port (both filled in per configuration)",
    )  # fmt: skip
    parser.add_argument("--vllm-config", type=Path, help="the base `vllm serve --config` file")
    parser.add_argument(
        "--vary", action="append", default=[], metavar="KEY=V1,V2",
        help="a vLLM option and its values; several --vary make their product; values with commas as a YAML list,"
        " null for vLLM's default: 'speculative-config=[{method: ngram, num_speculative_tokens: 3}, null]'",
    )  # fmt: skip
    parser.add_argument("--configs", nargs="+", type=Path, default=[], metavar="FILE", help="one file per config")
    parser.add_argument("--mode", choices=("search", "soak"), default="search", help="(default %(default)s)")
    PlanFlags.add_arguments(parser, ["target_qps"])  # soak mode's 100%
    parser.add_argument(
        "--soak-duration", type=parse_duration, default=DEFAULT_HOLD_S, help="soak mode: 150%% hold (5m)"
    )
    parser.add_argument(
        "--ramp-stage-duration", type=parse_duration, default=DEFAULT_STAGE_S, help="soak mode: 25/50/100%%"
    )
    add_search_arguments(parser, max_qps_required=False)
    parser.add_argument("--startup-timeout", type=parse_duration, default=600.0, help="for /health (10m)")
    parser.add_argument("--predict", action="store_true", help="first sweep the embedded target sized by each")
    parser.add_argument("--predict-only", action="store_true", help="only that: the table without a server")
    gpu = parser.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU, when the configs do not say")
    gpu.add_argument("--gpu", metavar="NAME", help=f"a GPU by name: {', '.join(GPUS)}")
    parser.add_argument(
        "--profile", help="--predict: the simulator's engine profile (a calibrated YAML, or a built-in's name)"
    )
    parser.add_argument("--resume", action="store_true", help="go on with a sweep: skip the configurations done")
    parser.add_argument("--sweep-id", default=None, help="directory under --reports-dir (default: sweep-TIME)")
    parser.add_argument("--reports-dir", default="reports")


def _predictor_serve(args: argparse.Namespace) -> str:
    """The embedded target sized like each configuration: on --gpu its timing is derived (docs/prediction.md)."""
    extra = (
        ["--gpu", args.gpu]
        if args.gpu
        else ["--gpu-memory-gib", f"{args.gpu_memory_gib:g}"]
        if args.gpu_memory_gib
        else []
    )
    if args.profile:
        extra += ["--profile", args.profile]
    return simulator_serve(*extra)


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    if args.serve is None and not args.predict_only:
        raise InputError('give --serve "vllm serve --config {config} --port {port}" (or --predict-only)')
    if (args.predict or args.predict_only) and not (args.gpu or args.profile):
        raise InputError(
            "--predict times each configuration: give --gpu NAME (derived from its data sheet) or --profile "
            "(a calibrated profile)"
        )
    if args.mode == "search" and args.max_qps is None:
        raise InputError("--mode search needs --max-qps, the highest rate to probe")
    criteria, probe = probe_flags(args)
    soak = SoakRun(args.locustfile, args.workload, args.target_qps, args.ramp_stage_duration, args.soak_duration)
    own = probe_options(probe) if args.mode == "search" else soak.options()
    refuse_overrides(own, passthrough, f"the sweep's {args.mode}")
    if args.mode == "search":
        refuse_closed_loop(passthrough, "the sweep's search")
    bounds = search_bounds(args) if args.mode == "search" else None
    memory = args.gpu_memory_gib or (gpu_memory_gib(args.gpu) if args.gpu else None)
    configs = expand(args.vllm_config, args.vary, args.configs)
    sweep_id = args.sweep_id or time.strftime("sweep-%Y%m%d-%H%M%S")
    directory = Path(args.reports_dir) / sweep_id
    if directory.is_dir() and any(directory.iterdir()) and not args.resume:
        raise InputError(f"{directory} already holds a sweep: give --resume to go on with it, or another --sweep-id")
    passes: list[tuple[str, Path]] = []
    if args.predict or args.predict_only:
        passes.append((_predictor_serve(args), directory / PREDICTED_DIR))
    if not args.predict_only:
        passes.append((args.serve, directory))
    for _, where in passes:
        where.mkdir(parents=True, exist_ok=True)
        # the soak mode's hold is judged by the confirm's criteria: windows sized to its own hold
        held = args.soak_duration if args.mode == "soak" else args.confirm_duration
        write_criteria(where, criteria, args.probe_duration, held)
        for config in configs:
            config.write(where / config.name)  # every file checked before any server starts
    predicted: dict[str, SweepRow] = {}
    for serve, where in passes:
        result = SweepResult(
            sweep_id=sweep_id, mode=args.mode, serve=serve, predicted=where != directory, workload=args.workload,
            target_qps=args.target_qps, required_qps=args.require_qps, latency_slo=holds_latency(criteria),
            started_at=time.time(),
            rows=load_rows(where, configs) if args.resume else [],
        )  # fmt: skip
        sweep = Sweep(
            directory=where, configs=configs, result=result, startup_timeout_s=args.startup_timeout,
            passthrough=passthrough, probe=probe, bounds=bounds, soak=soak if args.mode == "soak" else None,
            gpu_memory_gib=memory, predicted=predicted,
        )  # fmt: skip
        label = "prediction (embedded target)" if result.predicted else "sweep"
        print(f"llmload sweep: {label}: {len(configs)} configuration(s) into {where}")
        sweep.run(resume=args.resume)
        _print(result, where)
        if result.interrupted:
            return 1
        if result.predicted:
            predicted.update({row.name: row for row in result.rows})
    if result.best is not None:
        return 0
    judged = [row for row in result.rows if row.passed is not None]
    return 3 if judged and all(row.inconclusive for row in judged) else 1


def _print(result: SweepResult, where: Path) -> None:
    from llmload.report.sweep_page import HTML_FILE  # with matplotlib: imported once the pages are written

    for row in result.rows:
        answer = "did not start" if row.server == "did_not_start" else (
            f"passes at {row.answer}" if row.passing_qps is not None else "no passing rate"
        )  # fmt: skip
        ratio = f", measured/predicted {row.prediction_ratio:.2f}" if row.prediction_ratio is not None else ""
        print(f"  {row.name}: {answer}{ratio}")
    verdict = f"best: {result.best} ({result.best_why})" if result.best else "no configuration passes"
    print(f"llmload sweep: {verdict}\n  {where / RESULT_FILE}\n  {where / HTML_FILE}")
