"""`llmload compare BASELINE CURRENT`: the regression gate (llmload.gates.compare), one run against one
other. `llmload compare --baseline history:DIR CURRENT` (or `history:DIR` as BASELINE) judges the current
run against the last --history-runs comparable runs under DIR instead (llmload.history.gate)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmload.errors import InputError
from llmload.gates.compare import (
    Thresholds,
    common_goodput_slo,
    compare_runs,
    load_run,
    render_markdown,
    render_text,
)
from llmload.history import gate
from llmload.rundir import read_manifest
from llmload.yamlfile import load_yaml_model

HELP = "regression gate: a run against a baseline run, or the last runs of a history; exit 1 on regression"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "positional_baseline", nargs="?", default=None, metavar="BASELINE",
        help="the baseline run directory (run.json + requests.jsonl), or history:DIR; or give --baseline",
    )  # fmt: skip
    parser.add_argument("current", metavar="CURRENT", help="the current run directory")
    parser.add_argument(
        "--baseline", default=None, metavar="RUN_DIR|history:DIR",
        help="the baseline: a run directory, or history:DIR, the last --history-runs runs under DIR comparable"
        " with CURRENT (same workload, server configuration and plan)",
    )  # fmt: skip
    parser.add_argument(
        "--history-runs", type=int, default=gate.DEFAULT_RUNS, metavar="N",
        help="with history:DIR, how many of its latest comparable runs (%(default)s)",
    )  # fmt: skip
    parser.add_argument("--thresholds", type=Path, default=None, help="YAML overriding the limits (docs/gates.md)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown (CI comments)")


def _baseline(args: argparse.Namespace) -> str:
    if (args.baseline is None) == (args.positional_baseline is None):
        given = "both BASELINE and --baseline" if args.baseline is not None else "no baseline"
        raise InputError(f"{given}: give BASELINE CURRENT, or --baseline BASELINE CURRENT")
    return str(args.baseline if args.baseline is not None else args.positional_baseline)


def run(args: argparse.Namespace) -> int:
    """0: no regression; 1: a regression; 2: bad input."""
    baseline_arg, current_dir = _baseline(args), Path(args.current)
    history_dir = gate.history_dir(baseline_arg)
    if history_dir is not None:
        if args.thresholds or args.markdown:
            raise InputError("--thresholds and --markdown apply to a baseline run, not history:DIR")
        judgement = gate.judge(history_dir, current_dir, args.history_runs)
        sys.stdout.write(gate.render_text(judgement))
        return 1 if judgement.regressed else 0
    thresholds = load_yaml_model(args.thresholds, Thresholds) if args.thresholds else Thresholds()
    runs = (Path(baseline_arg), current_dir)
    slo, notes = common_goodput_slo(*(read_manifest(run_dir) for run_dir in runs))
    baseline, current = (load_run(run_dir, slo) for run_dir in runs)
    comparison = compare_runs(baseline, current, thresholds)
    comparison.warnings += notes
    sys.stdout.write(render_text(comparison))
    if args.markdown:
        args.markdown.write_text(render_markdown(comparison))
    return 1 if comparison.regressions else 0
