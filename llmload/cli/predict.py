"""`llmload predict`: what `vllm bench serve` would print for a server, before any GPU is involved.

The server is its vLLM settings (--vllm-config, --vllm-args or single flags; vLLM's defaults for the
rest, by the GPU) on --gpu NAME, its step timing derived from the model's architecture and the GPU's
data sheet (docs/prediction.md), or a calibrated --profile. The load is `vllm bench serve`'s random
dataset under its flags' names; it runs through the simulator's engine on a virtual clock, so it
answers in seconds. `--points FILE` predicts a file of measured points instead and prints how far
each figure is from what was measured.

Exit codes: 0 predicted; 1 vLLM would refuse to start with these settings (its message printed);
2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from llmload.errors import InputError
from llmload.hardware.gpus import GPUS
from llmload.predict.bench import BenchLoad, BenchResult, predict_bench
from llmload.predict.points import accuracy, load_points, predict_point
from llmload.predict.render import render_bench, render_points
from llmload.server.arguments import add_serving_arguments, serving_config
from llmload.sim.profiles import PROFILES, EngineProfile, StartupRefusal, resolve_profile

HELP = "what `vllm bench serve` would print for a vLLM config on a GPU, predicted in seconds without one"


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 (or inf), got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("the server")
    server.add_argument("--gpu", metavar="NAME", help=f"one GPU of each tensor-parallel rank: {', '.join(GPUS)}")
    server.add_argument(
        "--profile",
        metavar="NAME|FILE.yaml",
        help=f"a calibrated profile (llmload sim calibrate) or a built-in ({', '.join(PROFILES)}) instead of the "
        "timing derived from --gpu",
    )
    server.add_argument("--gpu-memory-gib", type=float, help="memory of one GPU, when not the named GPU's")
    add_serving_arguments(parser, "the server's vLLM settings")
    load = parser.add_argument_group("the load, as `vllm bench serve --dataset-name random` names it")
    fields = BenchLoad.model_fields
    load.add_argument("--input-len", "--random-input-len", type=int, default=1024, help="prompt tokens (1024)")
    load.add_argument("--output-len", "--random-output-len", type=int, default=128, help="output tokens (128)")
    load.add_argument("--num-prompts", type=int, default=1000, help="requests (1000)")
    load.add_argument("--random-range-ratio", type=float, default=0.0, help=fields["random_range_ratio"].description)
    load.add_argument("--request-rate", type=_rate, default=math.inf, help="requests/s; inf (default): all at once")
    load.add_argument("--burstiness", type=float, default=1.0, help=fields["burstiness"].description)
    load.add_argument("--max-concurrency", type=int, default=None, help=fields["max_concurrency"].description)
    load.add_argument("--offline", action="store_true", help=fields["offline"].description)
    load.add_argument("--seed", type=int, default=0)
    load.add_argument(
        "--target-qps",
        type=_rate,
        default=None,
        help="also say how many replicas carry this rate at 150%% (the release gate's stage) with this load",
    )
    parser.add_argument(
        "--points",
        type=Path,
        metavar="FILE.yaml",
        help="predict a file of measured points and compare (docs/prediction.md)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON (vllm bench serve's keys)")


def run(args: argparse.Namespace) -> int:
    if args.points is not None:
        return _points(args)
    if args.gpu is None and args.profile is None:
        raise InputError("give --gpu NAME (the timing derived from its data sheet) or --profile (a calibrated one)")
    try:
        load = BenchLoad(
            input_len=args.input_len,
            output_len=args.output_len,
            num_prompts=args.num_prompts,
            random_range_ratio=args.random_range_ratio,
            request_rate=args.request_rate,
            burstiness=args.burstiness,
            max_concurrency=args.max_concurrency,
            offline=args.offline,
            seed=args.seed,
        )
    except ValueError as exc:
        raise InputError(str(exc).splitlines()[-1] if str(exc) else "bad load") from None
    try:
        profile, plan = resolve_profile(args.profile, serving_config(args), args.gpu_memory_gib, args.gpu)
    except StartupRefusal as exc:
        print(f"vLLM would not start: {exc}", file=sys.stderr)
        return 1
    if load.input_len + load.output_len > plan.max_model_len:
        raise InputError(
            f"--input-len {load.input_len} + --output-len {load.output_len} exceeds max_model_len "
            f"{plan.max_model_len:,}: vLLM would answer every request with HTTP 400"
        )
    result = predict_bench(profile, plan.cache.num_blocks, load)
    saturation = _saturation(profile, plan.cache.num_blocks, load, result)
    if args.json:
        answer = {
            **result.vllm_json(),
            "timing": profile.calibration,
            "timing_source": profile.timing_source,
            "kv_cache_tokens": plan.vllm_log_kv_cache_tokens,
            "saturation_request_throughput": saturation,
        }
        if args.target_qps:
            answer["replicas_for_target_at_150pct"] = math.ceil(1.5 * args.target_qps / saturation)
        print(json.dumps(answer, indent=2))
    else:
        print(render_bench(profile, plan, load, result, saturation=saturation, target_qps=args.target_qps))
    return 0


def _saturation(profile: EngineProfile, num_blocks: int, load: BenchLoad, result: BenchResult) -> float:
    """Requests/s this server completes of this load at most: the request throughput of the same
    requests sent all at once (the run itself when it was one)."""
    if math.isinf(load.request_rate) and load.max_concurrency is None:
        return result.request_throughput
    burst = load.model_copy(update={"request_rate": math.inf, "max_concurrency": None})
    return predict_bench(profile, num_blocks, burst).request_throughput


def _points(args: argparse.Namespace) -> int:
    points = load_points(args.points)
    predictions = []
    for point in points:
        try:
            predictions.append(predict_point(point, args.points.parent))
        except StartupRefusal as exc:
            raise InputError(f"{args.points}: point {point.id}: vLLM would not start: {exc}") from None
    rows = accuracy(predictions)
    if args.json:
        print(
            json.dumps(
                {
                    "points": [p.model_dump(mode="json", exclude={"point"}) | {"id": p.point.id} for p in predictions],
                    "accuracy": [r.model_dump(mode="json") for r in rows],
                },
                indent=2,
            )
        )
    else:
        print(render_points(predictions, rows))
    return 0
