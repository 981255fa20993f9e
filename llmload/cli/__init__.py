"""`llmload` command line: one module per command, each with HELP, `add_arguments(parser)` and
`run(args)` (PASSTHROUGH commands also get the flags they do not know, for Locust). Every user
error is an InputError, and becomes exit code 2 here and nowhere else. A command that declares
STOPS_CLEANLY runs under `stop_signals`: SIGINT or SIGTERM stops it, it writes what was measured,
and exits 128 + the signal (130, 143), decided here too.

Commands: `workload` (build, stats, synth), `capacity`, `predict` (what `vllm bench serve` would
print, without a server), `sim` and `sim_calibrate` (the embedded target and its calibration),
`demo`, `report`, `verdict` (run directories judged again), `compare`,
`history` (every run under some folders: trends and change points), `soak`, `search`, `sweep`, `run`
(the plain Locust run) and `locustfile` (the packaged locustfile's path); `aliases` keeps a retired
flag spelling working, with a warning."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from llmload.errors import InputError
from llmload.process_group import Stopped, stop_signals

COMMANDS = (
    "workload", "sim", "capacity", "predict", "compare", "history", "report", "verdict", "soak", "search", "sweep",
    "demo", "run", "locustfile",
)  # fmt: skip


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser, or only `only`'s: a command imports just what it needs (the simulator
    starts in a fraction of a second, without pandas or matplotlib)."""
    parser = argparse.ArgumentParser(prog="llmload", description="Load tests and release gates for LLM servers.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS if only is None else (only,):
        module = importlib.import_module(f"llmload.cli.{name}")
        command = commands.add_parser(
            name, help=module.HELP, description=module.__doc__, add_help=not getattr(module, "OWN_HELP", False)
        )
        module.add_arguments(command)
        command.set_defaults(
            run=module.run,
            passthrough=getattr(module, "PASSTHROUGH", False),
            stops_cleanly=getattr(module, "STOPS_CLEANLY", False),
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, extra = parser.parse_known_args(argv)
    if extra and not args.passthrough:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if not getattr(args, "stops_cleanly", False):
            return _run(args, extra)
        with stop_signals() as received:
            try:
                code = _run(args, extra)
            except Stopped:
                code = 1
            return 128 + received[0] if received else code
    except InputError as exc:
        for note in getattr(exc, "__notes__", ()):
            print(note, file=sys.stderr)
        print(f"llmload {args.command}: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    return int(args.run(args, extra) if args.passthrough else args.run(args))
