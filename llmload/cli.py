"""`llmload` command line: workloads, the embedded server, reports, the demo."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from llmload.errors import InputError
from llmload.workload import WorkloadError, save_workload


def _workload_synth(args: argparse.Namespace) -> int:
    from llmload.workload.synth import synthesize_chat_workload

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


def _report(args: argparse.Namespace) -> int:
    from llmload.conclude import write_report
    from llmload.rundir import REPORT_FILE

    run_dir = Path(args.run_dir)
    if not (run_dir / "run.json").is_file():
        print(f"llmload: {run_dir} is not a run directory (no run.json)", file=sys.stderr)
        return 2
    summary = write_report(run_dir)
    print(f"{run_dir / REPORT_FILE}: {summary.requests.scheduled} scheduled, {summary.requests.ok} ok")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from llmload.demo import run_demo

    return run_demo(duration_s=args.duration, reports_dir=args.reports_dir)


def build_parser() -> argparse.ArgumentParser:
    import llmload.sim.cli as sim_cli
    from llmload import capacity_cli
    from llmload import compare as compare_cli
    from llmload import search as search_cli
    from llmload import soak as soak_cli
    from llmload.workload import cli as workload_cli

    parser = argparse.ArgumentParser(prog="llmload", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    workload = commands.add_parser("workload", help="build, synthesize and inspect workload files")
    workload_commands = workload.add_subparsers(dest="workload_command", required=True)
    synth = workload_commands.add_parser("synth", help="a synthetic multi-turn chat workload")
    synth.add_argument("-o", "--output", required=True, help="workload YAML to write (sessions JSONL beside it)")
    synth.add_argument("--sessions", type=int, default=200)
    synth.add_argument("--seed", type=int, default=0)
    synth.add_argument("--max-turns", type=int, default=8)
    synth.add_argument("--think-time", type=float, default=4.0, help="median seconds between turns")
    synth.add_argument("--target-qps", type=float, default=None)
    synth.set_defaults(handler=_workload_synth)
    workload_cli.add_arguments(workload_commands)

    sim = commands.add_parser("sim", help="the embedded OpenAI-compatible target (vLLM-like on the wire)")
    sim_cli.add_arguments(sim)
    sim.set_defaults(handler=sim_cli.run)

    capacity = commands.add_parser(
        "capacity", help="KV-cache capacity of a model on a server, or explain a vLLM startup log"
    )
    capacity_cli.add_arguments(capacity)
    capacity.set_defaults(handler=capacity_cli.run)

    compare = commands.add_parser(
        "compare", help="regression gate: p50/p95/p99 of a run against a baseline run; exit 1 on regression"
    )
    compare_cli.add_arguments(compare)
    compare.set_defaults(handler=compare_cli.run)

    report = commands.add_parser("report", help="rebuild summary.json, report.md and report.html from a run's records")
    report.add_argument("run_dir")
    report.set_defaults(handler=_report)

    soak = commands.add_parser(
        "soak",
        help="ramp to 150%% of the target, hold (5 min), PASS/FAIL; unknown flags go to Locust",
    )
    soak_cli.add_arguments(soak)
    soak.set_defaults(handler=soak_cli.run, passthrough=True)

    search = commands.add_parser(
        "search",
        help="the highest request rate whose hold passes the soak verdict: bracket, then bisect; unknown flags go"
        " to Locust",
    )
    search_cli.add_arguments(search)
    search.set_defaults(handler=search_cli.run, passthrough=True)

    demo = commands.add_parser("demo", help="a short real load test against the embedded target")
    demo.add_argument("--duration", type=float, default=40.0, help="seconds of ramp (4 stages)")
    demo.add_argument("--reports-dir", default="reports")
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "passthrough", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return int(args.handler(args, extra) if getattr(args, "passthrough", False) else args.handler(args))
    except (WorkloadError, InputError) as exc:
        print(f"llmload: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
