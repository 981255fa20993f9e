"""`llmload verdict RUN_DIR [RUN_DIR ...]`: judge run directories again, from their records.

The last stage of each run is its hold, as in the soak. The criteria are the soak's (`--criteria FILE`
and the flags on top), so an old run can be judged by new criteria; each run's verdict.json is
rewritten. A run directory of any tool that follows docs/metrics.md's contract can be judged, with or
without server.jsonl. One line per run: `DIR: PASS|FAIL|INCONCLUSIVE — the first reason`.
Exit code: the worst of the runs (0 PASS, 1 FAIL, 3 INCONCLUSIVE: 1 is worse than 3), 2 on bad input.
"""

from __future__ import annotations

import argparse
from pathlib import Path

SEVERITY = (0, 3, 1)  # PASS, then INCONCLUSIVE, then FAIL: a failing run decides the exit code
HELP = "judge run directories again from their records: PASS, FAIL or INCONCLUSIVE each"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from llmload.gates.criteria import add_criteria_arguments

    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    add_criteria_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from llmload import rundir
    from llmload.conclude import judge
    from llmload.gates.criteria import criteria_from_args
    from llmload.models import EXIT_CODES

    criteria = criteria_from_args(args)
    results = [(Path(d), judge(Path(d), criteria)) for d in args.run_dirs]  # every directory read before any is written
    codes = []
    for run_dir, result in results:
        verdict = result.verdict
        rundir.write_model(run_dir / rundir.VERDICT_FILE, verdict)
        decisive = [c for c in result.checks if c.status == verdict.outcome] or result.checks
        print(f"{run_dir}: {verdict.label} — {decisive[0].line}")
        codes.append(EXIT_CODES[verdict.outcome])
    return max(codes, key=SEVERITY.index)
