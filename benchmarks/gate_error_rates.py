"""The soak verdict's error rates against servers of known capacity (llmload/errorrates), written as
the table in docs/gates.md between its `error-rates` markers.

Each cell is a server (FIFO slots or a continuous-batching engine), a hold (a search probe, the search's
confirm, the default soak with its ramp, a 30-minute soak), an arrival process and a load (the hold's rate
over the server's capacity), judged over `--seeds` seeds by the code `llmload verdict` runs. A healthy
cell (load ≤ 0.85) is wrong when it does not PASS; an overloaded one (≥ 1.1) when it PASSes; in between
either is right. Targets: ≤ 1% each way. tests/test_errorrates.py runs a few
cells in seconds.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from benchmarks import write_between_markers
from llmload.errorrates.compare import CompareTally, tally_compare
from llmload.errorrates.grid import ARRIVALS, HOLDS, LOADS, SERVERS, TARGET_RATE, Arrivals, Cell, Tally, tally
from llmload.errorrates.search import HIGH, LOW, SearchTally, tally_search

DOC = Path(__file__).resolve().parent.parent / "docs" / "gates.md"
BEGIN, END = "<!-- error-rates:begin -->", "<!-- error-rates:end -->"
SOAK_ARRIVALS = (Arrivals("poisson"), Arrivals("gamma", 0.5))


def cells() -> Iterable[Cell]:
    """Every server at every load in the default soak, Poisson and bursty; every arrival process on the
    first server; the other holds on two servers, one fast and one slow."""
    for server in SERVERS.values():
        for arrivals in SOAK_ARRIVALS:
            for load in LOADS:
                yield Cell(server, "soak", arrivals, load)
    first = next(iter(SERVERS.values()))
    for arrivals in ARRIVALS:
        if arrivals not in SOAK_ARRIVALS:
            for load in LOADS:
                yield Cell(first, "soak", arrivals, load)
    for hold in HOLDS:
        if hold == "soak":
            continue
        for name in ("fifo-32x3s", "fifo-1x8s"):
            for load in (0.7, 0.85, 1.1, 1.2):
                yield Cell(SERVERS[name], hold, Arrivals("poisson"), load)


def _run(job: tuple[Cell, int]) -> Tally:
    cell, seeds = job
    return tally(cell, range(seeds))


def row(t: Tally) -> str:
    c = t.cell
    wrong = t.wrong
    over = round(wrong * t.runs) > TARGET_RATE * t.runs  # in runs: 1 − 0.99 is not 0.01 in floats
    verdict = "—" if c.side == "between" else ("**over target**" if over else "met")
    side = f"{c.side}, too few requests" if c.side == "healthy" and c.too_few else c.side
    reasons = ", ".join(f"{name} {n}" for name, n in t.reasons.most_common(3)) or "—"
    return (
        f"| {c.server.label} | {c.hold} | {c.arrivals.label} | {c.load:g} | {c.rate:.3g} | {c.held_requests:.0f}"
        f" ({c.requests_needed:.0f}) | {t.runs} | {t.share('pass'):.1%} | {t.share('fail'):.1%} |"
        f" {t.share('inconclusive'):.1%} | {side} | {verdict} | {reasons} |"
    )


def table(tallies: list[Tally], seeds: int, seconds: float, processes: int) -> str:
    head = [
        f"Measured by `python -m benchmarks.gate_error_rates` ({seeds} seeds a cell, {len(tallies)} cells,"
        f" {seconds / 60:.0f} min in {processes} process(es) on a {os.cpu_count()}-core machine). Wrong: a healthy"
        " cell (load ≤ 0.85) that did not PASS, an overloaded one (≥ 1.1) that PASSed; the target is ≤ 1% each way.",
        "",
        "| server | hold | arrivals | load | req/s | requests held (needed) | runs | PASS | FAIL | INCONCLUSIVE | side"
        " | target | checks that failed or could not tell (runs) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    return "\n".join([*head, *(row(t) for t in tallies)])


SEARCH_SERVERS = ("fifo-32x3s", "batch-16x2s", "fifo-8x0.5s-σ0.9")


def _search(job: tuple[str, Arrivals, int]) -> SearchTally:
    name, arrivals, searches = job
    return tally_search(SERVERS[name], arrivals, range(searches))


def search_table(tallies: list[SearchTally], searches: int) -> str:
    """Where `llmload search`'s default answers land against the true capacity."""
    head = [
        f"`llmload search` with its defaults (30 s probes, 10 s warm-up, 5% resolution, 2 repeats) up to twice the"
        f" capacity, {searches} searches a row; the answer as a share of the true capacity (target: within"
        f" [{LOW:g}, {HIGH:g}] in ≥ 95%, above in ≤ 2%).",
        "",
        "| server | arrivals | in [0.85, 1.0] | above 1.0 | no answer | median answer | median probes"
        " | median minutes held |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for t in tallies:
        found = sorted(a for a in t.answers if a is not None)
        median = f"{found[len(found) // 2]:.2f}" if found else "–"
        rows.append(
            f"| {t.server.label} | {t.arrivals.label} | {t.share(LOW, HIGH):.0%} | {t.above:.0%} | {t.none:.0%} |"
            f" {median} | {t.median_probes:g} | {t.median_minutes:.0f} |"
        )
    return "\n".join([*head, *rows])


COMPARE_SERVERS = ("fifo-32x3s", "batch-16x2s")


def _compare(job: tuple[str, float, int]) -> CompareTally:
    name, factor, pairs = job
    with tempfile.TemporaryDirectory() as tmp:
        return tally_compare(Path(tmp), SERVERS[name], factor, range(pairs))


def compare_table(tallies: list[CompareTally]) -> str:
    head = [
        "`llmload compare` with its default thresholds between two default soaks at 0.7 of capacity (Poisson): of"
        " one server twice (target: a regression in ≤ 1% of pairs), and of it against a copy whose every latency is"
        " 1.15× (target: caught in ≥ 90%); each comparison's smallest E2E rise it could call a regression (median).",
        "",
        "| server | current | pairs | called a regression | detectable E2E p50 | p95 | p99 |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    rows = []
    for t in tallies:
        current = "same server" if t.factor == 1 else f"{t.factor:g}× slower"
        detectable = " | ".join(f"+{t.median_detectable(f'E2E {q}'):.1%}" for q in ("p50", "p95", "p99"))
        rows.append(f"| {t.server.label} | {current} | {t.pairs} | {t.regressed / t.pairs:.0%} | {detectable} |")
    return "\n".join([*head, *rows])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=500)
    parser.add_argument("--searches", type=int, default=100, help="simulated searches per row (0: none)")
    parser.add_argument("--pairs", type=int, default=200, help="compared pairs of runs per row (0: none)")
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-doc", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    jobs = [(cell, args.seeds) for cell in cells()]
    search_jobs = [(name, arrivals, args.searches) for name in SEARCH_SERVERS for arrivals in SOAK_ARRIVALS]
    with ProcessPoolExecutor(args.processes) as pool:
        tallies = list(pool.map(_run, jobs))
        searches = list(pool.map(_search, search_jobs)) if args.searches else []
        compare_jobs = [(name, factor, args.pairs) for name in COMPARE_SERVERS for factor in (1.0, 1.15)]
        compares = list(pool.map(_compare, compare_jobs)) if args.pairs else []
    text = table(tallies, args.seeds, time.monotonic() - started, args.processes)
    if searches:
        text += "\n\n" + search_table(searches, args.searches)
    if compares:
        text += "\n\n" + compare_table(compares)
    print(text)
    if not args.no_doc:
        write_between_markers(DOC, BEGIN, END, text)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
