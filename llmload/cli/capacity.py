"""`llmload capacity`: KV-cache capacity of a model on a server, or an explained vLLM startup log.

Exit codes: 0 fine; 1 vLLM would refuse to start with these settings (or the log shows it did);
2 bad input (unreadable config, missing field, unknown model name, negative size).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import get_args

from pydantic import ValidationError

from llmload.capacity.kv import DEFAULT_BLOCK_SIZE, KVCacheDtype, ModelDtype
from llmload.capacity.model import known_models, load_bundled_model, load_config_file
from llmload.capacity.plan import DEFAULT_GPU_MEMORY_UTILIZATION, DEFAULT_OVERHEAD_GIB, CapacityInputs, plan_capacity
from llmload.capacity.render import render_capacity, render_log_explanation
from llmload.capacity.vllm_log import explain_vllm_log
from llmload.errors import InputError, validation_message

HELP = "KV-cache capacity of a model on a server, or explain a vLLM startup log"


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
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--model-config", metavar="NAME", help=f"a bundled model config: {', '.join(known_models())}")
    source.add_argument("--config", metavar="PATH", type=Path, help="a model's HF config.json (or its directory)")
    source.add_argument(
        "--vllm-log", metavar="FILE", help="explain the KV-cache lines of a vLLM startup log (- = stdin)"
    )
    memory = parser.add_argument_group("server (named after vLLM's flags)")
    memory.add_argument(
        "--gpu-memory-gib", metavar="GIB", type=_number(float), help="memory of one GPU, GiB (as torch reports it)"
    )
    memory.add_argument(
        "--tensor-parallel-size", "-tp", metavar="N", type=_number(int), default=1, help="GPUs per replica"
    )
    memory.add_argument(
        "--gpu-memory-utilization",
        metavar="FRACTION",
        type=_number(float, at_most=1.0),
        default=DEFAULT_GPU_MEMORY_UTILIZATION,
        help="share of each GPU vLLM may use (default %(default)s, vLLM 0.32's default)",
    )
    memory.add_argument(
        "--weights-gib", metavar="GIB", type=_number(float, allow_zero=True), help="whole model; default: estimated"
    )
    memory.add_argument(
        "--overhead-gib",
        metavar="GIB",
        type=_number(float, allow_zero=True),
        default=DEFAULT_OVERHEAD_GIB,
        help="per GPU: activation peak, CUDA graphs, NCCL/cuBLAS (default %(default)s)",
    )
    memory.add_argument(
        "--kv-cache-gib",
        metavar="GIB",
        type=_number(float),
        help="KV memory per GPU, instead of the budget (--kv-cache-memory-bytes)",
    )
    memory.add_argument("--dtype", choices=get_args(ModelDtype), default="auto")
    memory.add_argument("--kv-cache-dtype", choices=get_args(KVCacheDtype), default="auto")
    memory.add_argument(
        "--block-size",
        metavar="TOKENS",
        type=_number(int),
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per block (GPU 16, CPU 128)",
    )
    workload = parser.add_argument_group("workload")
    workload.add_argument(
        "--max-model-len", metavar="TOKENS", type=_number(int), help="default: the model's max_position_embeddings"
    )
    workload.add_argument(
        "--request-tokens",
        metavar="TOKENS",
        type=_number(int),
        help="tokens per request (prompt + output), e.g. the workload's P99",
    )
    workload.add_argument(
        "--min-concurrency", metavar="X", type=_number(float), help="full-length requests that must fit at once"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _inputs(args: argparse.Namespace) -> CapacityInputs:
    return CapacityInputs(
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_gib=args.gpu_memory_gib,
        gpu_memory_utilization=args.gpu_memory_utilization,
        weights_gib=args.weights_gib,
        overhead_gib=args.overhead_gib,
        kv_cache_gib=args.kv_cache_gib,
        dtype=args.dtype,
        kv_cache_dtype=args.kv_cache_dtype,
        block_size=args.block_size,
        max_model_len=args.max_model_len,
        request_tokens=args.request_tokens,
        min_concurrency=args.min_concurrency,
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
            if not explanation.findings:
                raise InputError(
                    f"{args.vllm_log}: no vLLM KV-cache lines found (looked for 'KV cache size', "
                    "'Maximum concurrency', 'max seq len', 'No available memory', 'Available memory on node')"
                )
            print(explanation.model_dump_json(indent=2) if args.json else render_log_explanation(explanation))
            return 1 if explanation.failed else 0
        model = load_config_file(args.config) if args.config else load_bundled_model(args.model_config)
        report = plan_capacity(model, _inputs(args))
    except ValidationError as exc:
        raise InputError(validation_message(exc)) from None
    print(report.model_dump_json(indent=2) if args.json else render_capacity(report))
    return 0 if report.starts else 1
