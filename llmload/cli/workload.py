"""`llmload workload synth|build|stats`: workloads synthesized or built from request logs, and their statistics."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from llmload.models import ReusablePrefix
from llmload.workload.build import BuildOptions, build_workload, source_table
from llmload.workload.files import load_workload, save_workload
from llmload.workload.formats import FORMAT_NAMES
from llmload.workload.prefix import DEFAULT_BLOCK_SIZE, workload_prefix
from llmload.workload.stats import plot_stats, render_stats, request_table, workload_stats
from llmload.workload.synth import synthesize_chat_workload

HELP = "build, synthesize and inspect workload files"
_WORKLOAD_SUFFIXES = (".yaml", ".yml")


def _source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMAT_NAMES, help="the log format (default: detected from the first line)")
    parser.add_argument(
        "--tokenizer",
        default="cl100k_base",
        help="cl100k_base (default), hf:PATH (tokenizer.json or its directory) or server:URL (vLLM /tokenize)",
    )
    parser.add_argument(
        "--skip-bad", action="store_true", help="skip malformed lines (counted by reason) instead of failing"
    )
    parser.add_argument(
        "--block-size",
        type=_positive(int),
        default=DEFAULT_BLOCK_SIZE,
        help="tokens per prefix-cache block of the reusable-prefix figure (vLLM: 16 on GPU, 128 on CPU; "
        "Mooncake hash_ids are 512 whatever this says)",
    )


def _positive(kind: Callable[[str], float]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, not {text}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its error message
    return parse


def _add_build_and_stats(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `build` and `stats` to the `workload` command's subparsers."""
    build = subparsers.add_parser(
        "build",
        help="a workload from request logs",
        description="Build a workload (YAML + sessions JSONL) from request logs: OpenAI JSONL, ShareGPT, vLLM "
        "logs, Azure traces or Mooncake traces. Chat requests that extend an earlier request's messages "
        "become that session's next turn.",
    )
    build.add_argument("sources", nargs="+", metavar="SOURCE", help="log files, read in the order given")
    build.add_argument("-o", "--output", required=True, help="workload YAML to write (sessions JSONL beside it)")
    _source_arguments(build)
    build.add_argument("--redact", action="store_true", help="replace all text by synthesized text of equal length")
    build.add_argument("--model", default=None, help="served model name to record in the workload")
    build.add_argument(
        "--session-gap",
        type=_positive(float),
        default=BuildOptions().session_gap_s,
        help="seconds (log time) after which an idle session can no longer continue",
    )
    build.add_argument(
        "--max-open-sessions",
        type=_positive(int),
        default=BuildOptions().max_open_sessions,
        help="bound on sessions held open (memory); the least recently active closes first",
    )
    build.add_argument("--seed", type=int, default=0, help="seed of synthesized text")
    build.set_defaults(workload_run=_build)

    stats = subparsers.add_parser(
        "stats",
        help="statistics of a workload or a log",
        description="Request lengths, turns, history growth, arrivals and the recommended max_model_len of a "
        "workload file or of logs in any format `workload build` reads.",
    )
    stats.add_argument("inputs", nargs="+", metavar="WORKLOAD|SOURCE", help="a workload YAML, or log files")
    _source_arguments(stats)
    stats.add_argument("--json", action="store_true", help="print the statistics as JSON")
    stats.add_argument("--plot", metavar="FILE.png", help="draw histograms, history growth and arrivals")
    stats.add_argument(
        "--max-tokens", type=_positive(int), default=None, help="max_tokens to assume (default: P99 of the source's)"
    )
    stats.set_defaults(workload_run=_stats)


def _options(args: argparse.Namespace, **extra: Any) -> BuildOptions:
    return BuildOptions(
        format=args.format, tokenizer=args.tokenizer, skip_bad=args.skip_bad, block_size=args.block_size, **extra
    )


def _report_counts(verb: str, counts: Counter[str]) -> None:
    if counts:
        detail = ", ".join(f"{kind}: {n:,}" for kind, n in counts.most_common())
        print(f"{verb} {sum(counts.values()):,} line(s): {detail}", file=sys.stderr)


def _build(args: argparse.Namespace) -> int:
    options = _options(
        args,
        redact=args.redact,
        model=args.model,
        session_gap_s=args.session_gap,
        max_open_sessions=args.max_open_sessions,
        seed=args.seed,
    )
    result = build_workload(args.sources, args.output, options, progress=sys.stderr)
    _report_counts("skipped bad", result.log.skipped)
    _report_counts("ignored", result.log.ignored)
    print(
        f"wrote {result.path} ({result.stats.sessions:,} sessions, {result.stats.requests:,} requests, "
        f"{result.log.format}, tokenizer {options.tokenizer}) and {result.path.parent / result.spec.sessions}"
    )
    print(render_stats(result.stats), end="")
    return 0


def _stats(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.inputs]
    if len(paths) == 1 and paths[0].suffix in _WORKLOAD_SUFFIXES:
        workload = load_workload(paths[0])
        table = request_table(workload)
        think_times = (workload.spec.stats or {}).get("think_times")  # as the build found them
        reuse: ReusablePrefix | str | None = workload_prefix(workload, block_size=args.block_size)
    else:
        log = source_table(paths, _options(args))
        _report_counts("skipped bad", log.skipped)
        _report_counts("ignored", log.ignored)
        table, think_times, reuse = log.table, log.think_times, log.reusable_prefix
    note = think_times if isinstance(think_times, str) else None
    stats = workload_stats(table, max_tokens=args.max_tokens, think_times=note, reusable_prefix=reuse)
    print(stats.model_dump_json(indent=2) if args.json else render_stats(stats), end="\n" if args.json else "")
    if args.plot:
        print(f"plot: {plot_stats(table, stats, Path(args.plot))}", file=sys.stderr)
    return 0


def _synth(args: argparse.Namespace) -> int:
    out = Path(args.output)
    spec, sessions = synthesize_chat_workload(
        out.name.removesuffix(".yaml").removesuffix(".yml"),
        sessions=args.sessions,
        seed=args.seed,
        max_turns=args.max_turns,
        think_time_median_s=args.think_time,
    )
    if args.target_qps:
        spec = spec.model_copy(update={"target_qps": args.target_qps})
    save_workload(spec, sessions, out)
    requests = sum(len(s.turns) for s in sessions)
    print(f"wrote {out} ({len(sessions)} sessions, {requests} requests) and {out.parent / spec.sessions}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="workload_command", required=True)
    synth = commands.add_parser("synth", help="a synthetic multi-turn chat workload")
    synth.add_argument("-o", "--output", required=True, help="workload YAML to write (sessions JSONL beside it)")
    synth.add_argument("--sessions", type=int, default=200)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--max-turns", type=int, default=8)
    synth.add_argument("--think-time", type=float, default=4.0, help="median seconds between turns")
    synth.add_argument("--target-qps", type=float, default=None)
    synth.set_defaults(workload_run=_synth)
    _add_build_and_stats(commands)


def run(args: argparse.Namespace) -> int:
    return int(args.workload_run(args))
