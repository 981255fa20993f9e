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
import re
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from llmload.errorrates.grid import ARRIVALS, HOLDS, LOADS, SERVERS, TARGET_RATE, Arrivals, Cell, Tally, tally

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
    verdict = "—" if c.side == "between" else ("**over target**" if wrong > TARGET_RATE else "met")
    side = f"{c.side}, too few requests" if c.side == "healthy" and c.too_few else c.side
    reasons = ", ".join(f"{name} {n}" for name, n in t.reasons.most_common(3)) or "—"
    return (
        f"| {c.server.label} | {c.hold} | {c.arrivals.label} | {c.load:g} | {c.rate:.3g} | {c.held_requests:.0f}"
        f" ({c.requests_needed:.0f}) | {t.runs} | {t.share('pass'):.1%} | {t.share('fail'):.1%} |"
        f" {t.share('inconclusive'):.1%} | {side} | {verdict} | {reasons} |"
    )


def table(tallies: list[Tally], seeds: int, seconds: float) -> str:
    head = [
        f"Measured by `python -m benchmarks.gate_error_rates` ({seeds} seeds a cell, {len(tallies)} cells,"
        f" {seconds / 60:.0f} min on {os.cpu_count()} cores). Wrong: a healthy cell (load ≤ 0.85) that did not"
        " PASS, an overloaded one (≥ 1.1) that PASSed; the target is ≤ 1% each way.",
        "",
        "| server | hold | arrivals | load | req/s | requests held (needed) | runs | PASS | FAIL | INCONCLUSIVE | side"
        " | target | checks that failed or could not tell (runs) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    return "\n".join([*head, *(row(t) for t in tallies)])


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    DOC.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", type=int, default=500)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--no-doc", action="store_true", help="print the table only")
    args = parser.parse_args(argv)
    started = time.monotonic()
    jobs = [(cell, args.seeds) for cell in cells()]
    with ProcessPoolExecutor(args.processes) as pool:
        tallies = list(pool.map(_run, jobs))
    text = table(tallies, args.seeds, time.monotonic() - started)
    print(text)
    if not args.no_doc:
        write_doc(text)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
