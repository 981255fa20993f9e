"""`llmload sim`: command-line flags, each one a SimConfig field."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pydantic import ValidationError

from llmload.sim.config import FAULT_KINDS, FaultSpec, SimConfig


def _fault(text: str) -> FaultSpec:
    try:
        return FaultSpec.parse(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _default(field: str) -> object:
    return SimConfig.model_fields[field].default


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--host", default=_default("host"), help="address to bind (default: %(default)s)")
    add("--port", type=int, default=_default("port"), help="port; 0 picks a free one (default: %(default)s)")
    add("--model-name", default=_default("model_name"), help="served model name (default: %(default)s)")
    add(
        "--max-model-len",
        type=int,
        default=_default("max_model_len"),
        help="context length: prompt + output tokens (default: %(default)s)",
    )
    add(
        "--ttft-ms", type=float, default=_default("ttft_ms"), help="base time to first token, ms (default: %(default)s)"
    )
    add(
        "--prefill-tokens-per-s",
        type=float,
        default=_default("prefill_tokens_per_s"),
        help="adds prompt_tokens / this to the TTFT; 0 = off (default: %(default)s)",
    )
    add("--itl-ms", type=float, default=_default("itl_ms"), help="time between tokens, ms (default: %(default)s)")
    add(
        "--default-max-tokens",
        type=int,
        default=_default("default_max_tokens"),
        help="output length when the request sets none (default: %(default)s)",
    )
    add(
        "--fault",
        dest="faults",
        metavar="KIND:PROB",
        type=_fault,
        action="append",
        default=[],
        help=f"inject a fault into this fraction of requests; repeatable. Kinds: {', '.join(FAULT_KINDS)}",
    )
    add(
        "--stall-s",
        type=float,
        default=_default("stall_s"),
        help="how long a `stall` fault stays silent, s (default: %(default)s)",
    )
    add("--seed", type=int, default=_default("seed"), help="seed of the fault draws (default: %(default)s)")
    add(
        "--concurrency-limit",
        type=int,
        default=_default("concurrency_limit"),
        help="requests in flight above this get vLLM's 503 busy error; 0 = unlimited (default: %(default)s)",
    )
    add(
        "--enable-prompt-tokens-details",
        action="store_true",
        help="usage carries prompt_tokens_details.cached_tokens, like vLLM's flag of that name",
    )


def _describe(error: Any) -> str:
    """A SimConfig validation error in the command line's terms."""
    message = str(error["msg"]).removeprefix("Value error, ")
    loc = error["loc"]
    return f"--{str(loc[0]).replace('_', '-')}: {message}" if loc else message


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM; 2 for an invalid configuration."""
    values = {k: v for k, v in vars(args).items() if k in SimConfig.model_fields}
    try:
        config = SimConfig(**values)
    except ValidationError as e:
        print(f"llmload sim: error: {'; '.join(map(_describe, e.errors()))}", file=sys.stderr)
        return 2
    from llmload.sim.server import serve

    serve(config)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="llmload sim", description="An OpenAI-compatible server that looks like vLLM on the wire."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))
