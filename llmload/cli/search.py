"""`llmload search`: the highest request rate whose hold passes the soak verdict (llmload.gates.search)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path

from llmload import drain
from llmload.errors import InputError
from llmload.gates.criteria import SoakCriteria, add_criteria_arguments, criteria_from_args
from llmload.gates.locust_run import add_host_argument
from llmload.gates.passthrough import refuse_closed_loop, refuse_overrides
from llmload.gates.search import (
    CONFIRM_S,
    PAGE_FILE,
    PROBE_DRAIN_S,
    PROBE_S,
    PROBE_WARMUP_S,
    REPEATS,
    RESOLUTION,
    Bounds,
    Interrupted,
    ProbeFlags,
    Searcher,
    bounds_from,
    probe_options,
    search,
    write_criteria,
)
from llmload.models import GOODPUT_SYNTAX, GoodputSLO, SearchResult
from llmload.packaged import LOCUSTFILE, say_if_sample
from llmload.plan import PlanFlags
from llmload.schedule import parse_duration
from llmload.sim.process import EMBEDDED_TARGET_ARGS, SimProcess

HELP = "the highest request rate whose hold passes the soak verdict: bracket, then bisect; unknown flags go to Locust"
PASSTHROUGH = True
STOPS_CLEANLY = True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_host_argument(parser)
    add_search_arguments(parser, max_qps_required=True)
    parser.add_argument("--search-id", default=None, help="directory under --reports-dir (default: search-TIME)")
    parser.add_argument("--reports-dir", default="reports")


def add_search_arguments(parser: argparse.ArgumentParser, *, max_qps_required: bool) -> None:
    """The workload, the search's range and the gate: shared with `llmload sweep`."""
    PlanFlags.add_arguments(parser, ["workload"])
    parser.add_argument(
        "--max-qps", type=float, required=max_qps_required, default=None, help="the highest rate to probe, req/s"
    )
    parser.add_argument(
        "--start-qps", type=float, default=None, help="first rate (default: the workload's, else max/8)"
    )
    parser.add_argument("--min-qps", type=float, default=None, help="lowest rate to probe (default: max/256)")
    parser.add_argument(
        "--resolution", type=float, default=RESOLUTION, help="stop when the interval is this narrow (0.05)"
    )
    parser.add_argument("--repeats", type=int, default=REPEATS, help="probes the answer must pass, all of them (2)")
    parser.add_argument(
        "--seed", type=int, default=0,
        help="arrival seed of a rate's first probe; each later probe at that rate takes the next, so a repeat "
        "meets other arrivals (0)",
    )  # fmt: skip
    parser.add_argument("--probe-duration", type=parse_duration, default=PROBE_S, help="each probe's hold (30s)")
    parser.add_argument(
        "--probe-warmup", type=lambda t: parse_duration(t, allow_zero=True), default=PROBE_WARMUP_S,
        help="unjudged lead-in of each probe at its rate (10s)",
    )  # fmt: skip
    parser.add_argument(
        "--probe-drain", type=float, default=PROBE_DRAIN_S,
        help=f"the longest (s) a probe's requests may run on after its hold; {drain.RULE} (%(default)g)",
    )  # fmt: skip
    parser.add_argument("--confirm", action="store_true", help="then soak at the rate found (--confirm-duration)")
    parser.add_argument("--confirm-duration", type=parse_duration, default=CONFIRM_S, help="the confirming hold (5m)")
    parser.add_argument("--require-qps", type=float, default=None, help="exit 1 unless the answer is at least this")
    parser.add_argument("--goodput-slo", action="append", default=[], metavar="SPEC", help=GOODPUT_SYNTAX)
    parser.add_argument(
        "--keep-prefix-cache", action="store_true",
        help="do not empty the server's prefix cache before each probe (a shared server whose cache others use);"
        " a probe may then ride on prefixes the one before left cached",
    )  # fmt: skip
    add_criteria_arguments(parser)
    parser.add_argument("--locustfile", default=str(LOCUSTFILE), help="(default: the packaged one)")


def probe_flags(args: argparse.Namespace) -> tuple[SoakCriteria, ProbeFlags]:
    """The gate and how each probe runs, from the flags; InputError for nonsense."""
    if not Path(args.locustfile).is_file():
        raise InputError(f"no locustfile at {args.locustfile} (`llmload locustfile` prints the packaged one)")
    criteria = criteria_from_args(args)
    goodput_slo = GoodputSLO.parse(args.goodput_slo) if args.goodput_slo else None
    if criteria.min_goodput_ratio is not None and goodput_slo is None:
        raise InputError("--min-goodput-ratio needs the SLOs goodput counts against: give --goodput-slo")
    say_if_sample(args.command, args.workload)
    flags = ProbeFlags(
        locustfile=args.locustfile, workload=args.workload, hold_s=args.probe_duration,
        warmup_s=args.probe_warmup, drain_s=args.probe_drain, confirm_s=args.confirm_duration,
        confirm=args.confirm, goodput_slo=tuple(args.goodput_slo), seed=args.seed,
        reset_prefix_cache=not args.keep_prefix_cache,
    )  # fmt: skip
    return criteria, flags


def holds_latency(criteria: SoakCriteria) -> bool:
    """Whether the gate holds latency to an SLO: without one a search finds where the server keeps up."""
    slos = (criteria.slo_ttft_p99_ms, criteria.slo_ttfo_p99_ms, criteria.slo_e2e_p99_ms, criteria.min_goodput_ratio)
    return any(v is not None for v in slos)


def search_bounds(args: argparse.Namespace) -> Bounds:
    return bounds_from(
        args.workload, max_qps=args.max_qps, start_qps=args.start_qps, min_qps=args.min_qps,
        resolution=args.resolution, repeats=args.repeats,
    )  # fmt: skip


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    """0: a passing rate was found (at least --require-qps; confirmed with --confirm); 1: none, or
    interrupted before one; 2: bad input; 3: no rate passed and no probe could tell (INCONCLUSIVE)."""
    criteria, flags = probe_flags(args)
    refuse_overrides(probe_options(flags), passthrough, "the search")
    refuse_closed_loop(passthrough, "the search")
    goodput_slo = GoodputSLO.parse(args.goodput_slo) if args.goodput_slo else None
    bounds = search_bounds(args)
    search_id = args.search_id or time.strftime("search-%Y%m%d-%H%M%S")
    directory = Path(args.reports_dir) / search_id
    if directory.is_dir() and any(directory.iterdir()):
        raise InputError(f"{directory} already holds a search: give another --search-id or move it away")
    directory.mkdir(parents=True, exist_ok=True)
    write_criteria(directory, criteria, args.probe_duration, args.confirm_duration)
    with contextlib.ExitStack() as stack:
        host = args.host
        if host is None:
            host = stack.enter_context(SimProcess(*EMBEDDED_TARGET_ARGS)).url
            print(f"llmload search: no --host given: started the embedded target at {host}")
        result = SearchResult(
            search_id=search_id, host=host, workload=args.workload, max_qps=bounds.max_qps,
            probe_s=args.probe_duration, repeats=bounds.repeats, started_at=time.time(), goodput_slo=goodput_slo,
            required_qps=args.require_qps, latency_slo=holds_latency(criteria),
            prefix_cache_kept=args.keep_prefix_cache,
        )  # fmt: skip
        searcher = Searcher(flags, passthrough, directory, result)
        try:
            result.outcome = search(searcher, bounds)
        except Interrupted:
            result.outcome = "interrupted"
        except KeyboardInterrupt:  # between probes
            result.outcome = "interrupted"
        except InputError:
            result.outcome = "aborted"
            searcher.save()
            raise
        result.finished_at = time.time()
        searcher.save()
    print(f"\nllmload search: {result.conclusion}")
    if result.latency_note:
        print(f"  {result.latency_note}")
    if result.confirmed is not None:
        print(f"  confirming soak at {result.passing_qps:g} req/s: {'PASS' if result.confirmed else 'FAIL'}")
    if result.cache_note:
        print(f"  {result.cache_note}")
    print(f"page: {directory / PAGE_FILE}")
    answer = result.answer_qps if result.outcome in ("found", "capped", "interrupted") else None
    judged = [p for p in result.probes if p.passed is not None]
    if answer is None and judged and all(p.inconclusive for p in judged if not p.passed):
        print("llmload search: INCONCLUSIVE: no probe could tell, even held the longest (raise --probe-duration)")
        return 3
    if answer is None or result.confirmed is False:
        return 1
    if args.require_qps is not None and answer < args.require_qps:
        print(f"llmload search: {answer:g} req/s is below --require-qps {args.require_qps:g}")
        return 1
    return 0
