"""`llmload workload synth|build|stats`: workloads synthesized or built from request logs, and their statistics."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import ReusablePrefix, Session, WorkloadSpec
from llmload.plan import PlanFlags
from llmload.workload.build import BuildOptions, build_workload, source_table
from llmload.workload.distributions import parse_distribution
from llmload.workload.files import Workload, load_workload, save_workload
from llmload.workload.formats import FORMAT_NAMES, format_named
from llmload.workload.like import compare, like_prefixes, like_shapes, prefix_template, redraw, render_comparison
from llmload.workload.like_blocks import Conversations, has_blocks
from llmload.workload.prefix import CHAT_TEMPLATES, DEFAULT_BLOCK_SIZE, DEFAULT_CHAT_TEMPLATE, workload_prefix
from llmload.workload.stats import WorkloadStats, plot_stats, render_stats, request_table, workload_stats
from llmload.workload.synth import Popularity, PrefixPool, SynthOptions, synthesize_workload, synthetic_spec

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
    parser.add_argument(
        "--chat-template",
        choices=CHAT_TEMPLATES,
        default=DEFAULT_CHAT_TEMPLATE,
        help="how the reusable-prefix figure renders messages into prompts: chatml (default, the template "
        "tokens a server's prompts hold; a model's own template differs by a few per message) or none "
        "(message content alone)",
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
    build.add_argument(
        "--output-tokens",
        metavar="DISTRIBUTION",
        help="output lengths of the requests whose log gives none (no reply, output_tokens or max_tokens), drawn from"
        " this, as `workload synth` takes it (e.g. lognormal:median=160,sigma=0.7); without it such a log is refused:"
        " replayed, those requests would run to max_model_len",
    )
    build.add_argument("--seed", type=int, default=0, help="seed of synthesized text and drawn output lengths")
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
    """How the logs are read, as the flags say; a value out of range is an InputError naming its flag."""
    try:
        return BuildOptions(
            format=args.format,
            tokenizer=args.tokenizer,
            skip_bad=args.skip_bad,
            block_size=args.block_size,
            chat_template=args.chat_template,
            **extra,
        )
    except ValidationError as exc:
        raise InputError(validation_message(exc, flags={"session_gap_s": "session-gap"})) from None


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
        output_tokens=parse_distribution(args.output_tokens, "--output-tokens") if args.output_tokens else None,
    )
    result = build_workload(args.sources, args.output, options, progress=sys.stderr)
    _report_counts("skipped bad", result.log.skipped)
    _report_counts("ignored", result.log.ignored)
    if result.log.unbounded:
        print(
            f"output lengths of {result.log.unbounded:,} of {result.stats.requests:,} requests drawn from"
            f" --output-tokens {args.output_tokens} (the log gives them no reply, output_tokens or max_tokens);"
            " replay asks for exactly these lengths",
            file=sys.stderr,
        )
    print(
        f"wrote {result.path} ({result.stats.sessions:,} sessions, {result.stats.requests:,} requests, "
        f"{result.log.format}, tokenizer {options.tokenizer}) and {result.path.parent / result.spec.sessions}"
    )
    print(render_stats(result.stats), end="")
    return 0


def _workload_prefix(workload: Workload, args: argparse.Namespace) -> ReusablePrefix:
    """The figure with the block size and chat template the flags give."""
    return workload_prefix(workload, block_size=args.block_size, template=args.chat_template)


@dataclass(frozen=True)
class _Source:
    """A workload YAML or logs, read: the request table, how its think times were found, its reusable
    prefix (or why it has none), and the workload or the logs' format it came from."""

    table: pd.DataFrame
    think_times: str | None
    reuse: ReusablePrefix | str | None
    workload: Workload | None = None
    log_format: str | None = None


def _input_table(inputs: list[str], args: argparse.Namespace) -> _Source:
    """A workload YAML, or logs read as `build` reads them."""
    paths = [Path(p) for p in inputs]
    if len(paths) == 1 and paths[0].suffix in _WORKLOAD_SUFFIXES:
        workload = load_workload(paths[0])
        think_times = (workload.spec.stats or {}).get("think_times")  # as the build found them
        return _Source(
            request_table(workload),
            think_times if isinstance(think_times, str) else None,
            _workload_prefix(workload, args),
            workload=workload,
        )
    log = source_table(paths, _options(args))
    _report_counts("skipped bad", log.skipped)
    _report_counts("ignored", log.ignored)
    return _Source(log.table, log.think_times, log.reusable_prefix, log_format=log.format)


def _stats(args: argparse.Namespace) -> int:
    source = _input_table(args.inputs, args)
    table = source.table
    stats = workload_stats(
        table, max_tokens=args.max_tokens, think_times=source.think_times, reusable_prefix=source.reuse
    )
    print(stats.model_dump_json(indent=2) if args.json else render_stats(stats), end="\n" if args.json else "")
    if args.plot:
        print(f"plot: {plot_stats(table, stats, Path(args.plot))}", file=sys.stderr)
    return 0


_DISTRIBUTION_FLAGS = {
    "prompt_tokens": "--prompt-tokens",
    "output_tokens": "--output-tokens",
    "turns": "--turns",
    "think_time_s": "--think-time",
}


def _synth_options(args: argparse.Namespace, **extra: object) -> SynthOptions:
    """The options the flags give; a flag left out keeps the model's default."""
    values: dict[str, object] = {
        field: parse_distribution(getattr(args, field), flag)
        for field, flag in _DISTRIBUTION_FLAGS.items()
        if getattr(args, field) is not None
    }
    if args.shared_prefix is not None:
        values["shared_prefixes"] = [PrefixPool.parse(text) for text in args.shared_prefix]
    if args.prefix_popularity is not None:
        values["prefix_popularity"] = Popularity.parse(args.prefix_popularity)
    for field in ("sessions", "seed", "max_turns", "output_length", "prefix_sessions", "tokenizer"):
        if getattr(args, field) is not None:
            values[field] = getattr(args, field)
    return SynthOptions.from_flags(**{**extra, **values})


def _synth(args: argparse.Namespace) -> int:
    out = Path(args.output)
    name = out.name.removesuffix(".yaml").removesuffix(".yml")
    target_qps = PlanFlags.checked(target_qps=args.target_qps).target_qps
    real: WorkloadStats | None = None
    if args.like is None:
        spec, sessions = synthesize_workload(name, _synth_options(args))
    else:
        real, spec, sessions = _like(args, name)
    if target_qps is not None:
        spec = spec.model_copy(update={"target_qps": target_qps})
    save_workload(spec, sessions, out)
    requests = sum(len(s.turns) for s in sessions)
    made = (
        f"prompts as ids of {spec.block_size}-token blocks, their text made at send time"
        if has_blocks(sessions)
        else f"text of {spec.tokenizer} tokens, every length exact under it"
    )
    print(f"wrote {out} ({len(sessions)} sessions, {requests} requests) and {out.parent / spec.sessions}; {made}")
    if real is None:
        return 0
    written = load_workload(out)  # figures as written, not as intended
    synthetic = workload_stats(request_table(written), reusable_prefix=_workload_prefix(written, args))
    rows = compare(real, synthetic)
    print(render_comparison(rows), end="")
    return 1 if any(row.within is False for row in rows) else 0


def _like(args: argparse.Namespace, name: str) -> tuple[WorkloadStats, WorkloadSpec, list[Session]]:
    """The real source's figures, and a synthetic workload like it: conversations taken whole where its
    prompts are block ids, else session shapes given synthetic text."""
    if args.turns is not None:
        raise InputError("--turns cannot be given with --like: the turns come with the real sessions' shapes")
    source = _input_table(args.like, args)
    blocks = _block_workload(source, args)
    if blocks is not None:
        whole = Conversations(blocks)
        count = args.sessions or len(whole)
        if whole.keep_shared_blocks(count):
            return _like_blocks(args, name, whole, count)
        print(
            f"{count:,} conversations are fewer than {', '.join(args.like)} holds, and taken whole they would lose"
            " the blocks they share with those left out: their lengths are resampled instead, the shared share"
            " given by a pool of prefixes (the source's count or more keeps its blocks)",
            file=sys.stderr,
        )
    table = source.table
    unknown = int(table["output_tokens"].isna().sum())
    if unknown and args.output_tokens is None:  # a reply of no known length cannot be copied
        raise InputError(
            f"{unknown:,} of {len(table):,} requests in {', '.join(args.like)} have no known output length (no"
            " reply or output_tokens): give --output-tokens DISTRIBUTION to draw the replies' lengths"
        )
    real = workload_stats(table, reusable_prefix=source.reuse)
    options = _synth_options(args, sessions=real.sessions, shared_prefixes=[])
    rng = np.random.default_rng([options.seed, 1])
    given = {field for field in _DISTRIBUTION_FLAGS if getattr(args, field) is not None}
    shapes = redraw(like_shapes(table, options.sessions, rng), options, given, rng)
    if args.shared_prefix is None and real.reusable_prefix and real.reusable_prefix.shared_share:
        pools, share = like_prefixes(
            shapes,
            real.reusable_prefix,
            real_prompt_tokens=float(table["prompt_tokens"].sum()),
            prefix_sessions=options.prefix_sessions,
            block_size=args.block_size,
            template=prefix_template(options.tokenizer, args.chat_template),
        )
        options = options.model_copy(update={"shared_prefixes": pools, "prefix_sessions": share})
    generator = {"like": list(args.like), "redrawn": sorted(given), **options.model_dump(mode="json")}
    spec, sessions = synthesize_workload(name, options, shapes=shapes, prefix_in_first_turn=True, generator=generator)
    return real, spec.model_copy(update={"target_qps": real.requests_per_s}), sessions


def _block_workload(source: _Source, args: argparse.Namespace) -> Workload | None:
    """The source as a workload when its prompts are block ids: the YAML given, or a trace with hash ids
    built to a scratch directory (read a second time, as `workload build` reads it)."""
    if source.workload is not None:
        return source.workload if has_blocks(source.workload.sessions) else None
    hashed = source.log_format is not None and format_named(source.log_format).hash_block_tokens is not None
    if not hashed or not isinstance(source.reuse, ReusablePrefix):  # a trace of lengths alone has no ids
        return None
    with tempfile.TemporaryDirectory(prefix="llmload-like-") as scratch:
        workload = load_workload(build_workload(args.like, Path(scratch) / "source.yaml", _options(args)).path)
    return workload if has_blocks(workload.sessions) else None


_BLOCK_LIKE_REFUSED = {
    **_DISTRIBUTION_FLAGS,
    "max_turns": "--max-turns",
    "shared_prefix": "--shared-prefix",
    "prefix_popularity": "--prefix-popularity",
    "prefix_sessions": "--prefix-sessions",
}


def _like_blocks(
    args: argparse.Namespace, name: str, whole: Conversations, count: int
) -> tuple[WorkloadStats, WorkloadSpec, list[Session]]:
    """`Conversations.like` of a block workload; --sessions counts conversations (an agent with its subagents).
    The real figures are the workload's, as built: the synthetic one is made of its sessions."""
    refused = [flag for field, flag in _BLOCK_LIKE_REFUSED.items() if getattr(args, field) is not None]
    if refused:
        raise InputError(
            f"{', '.join(refused)} cannot be given with --like on a trace of block ids ({', '.join(args.like)}): its"
            " lengths, turns and shared prefixes come with its conversations, which are taken whole"
        )
    workload = whole.workload
    real = workload_stats(request_table(workload), reusable_prefix=_workload_prefix(workload, args))
    seed = args.seed or 0
    output_length: Literal["fixed", "free"] = args.output_length or "fixed"
    sessions = whole.like(count, np.random.default_rng([seed, 1]), name, output_length)
    generator = {"like": list(args.like), "conversations": count, "seed": seed, "output_length": output_length}
    spec = synthetic_spec(
        name, "synthetic-blocks", generator, workload.spec.tokenizer, block_size=workload.spec.block_size
    )
    spec = spec.model_copy(update={"target_qps": real.requests_per_s})
    return real, spec, sessions


def add_arguments(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="workload_command", required=True)
    synth = commands.add_parser(
        "synth",
        help="a synthetic multi-turn chat workload, or one like a real workload",
        description="Synthesize multi-turn chat sessions from distributions (KIND:KEY=VALUE,...: fixed:512, "
        "normal:mean=300,sd=50, lognormal:median=400,sigma=0.8, geometric:p=0.3, "
        "percentiles:p50=300,p90=900,p99=2000), or with --like the shapes of a real workload or log with none "
        "of its text; --like prints the real and synthetic figures side by side and exits 1 if one is off.",
    )
    synth.add_argument("-o", "--output", required=True, help="workload YAML to write (sessions JSONL beside it)")
    synth.add_argument("--like", nargs="+", metavar="WORKLOAD|SOURCE", help="a workload YAML, or logs, to match")
    _source_arguments(synth)
    synth.add_argument("--sessions", type=_positive(int), help="default: 200, or as many as the --like source; "
                       "of a trace of block ids, conversations (an agent with its subagents)")  # fmt: skip
    synth.add_argument("--seed", type=int)
    synth.add_argument("--prompt-tokens", help="new tokens of each turn (default lognormal:median=90,sigma=0.9)")
    synth.add_argument("--output-tokens", help="tokens of each reply (default lognormal:median=160,sigma=0.7)")
    synth.add_argument("--output-length", choices=("fixed", "free"), help="fixed (default): replies forced to their "
                       "length; free: the length is max_tokens and the model stops where it likes")  # fmt: skip
    synth.add_argument("--turns", help="turns per session (default geometric:p=0.3)")
    synth.add_argument("--max-turns", type=_positive(int), help="cap on turns per session (default 8)")
    synth.add_argument(
        "--think-time", dest="think_time_s", help="seconds between turns (default lognormal:median=4,sigma=0.8)"
    )
    synth.add_argument(
        "--shared-prefix",
        action="append",
        metavar="COUNT:TOKENS",
        help="COUNT prefixes of TOKENS tokens (system prompts, documents); repeat for several pools, a session "
        "takes one of each (default 3:400; with --like, one pool sized to the real shared share)",
    )
    synth.add_argument("--prefix-popularity", help="zipf:S (default zipf:1.1) or uniform")
    synth.add_argument("--prefix-sessions", type=float, help="share of sessions that start with prefixes (default 1)")
    PlanFlags.add_arguments(synth, ["target_qps"])
    synth.set_defaults(workload_run=_synth)
    _add_build_and_stats(commands)


def run(args: argparse.Namespace) -> int:
    return int(args.workload_run(args))
