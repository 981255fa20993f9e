"""`llmload compare BASELINE CURRENT`: the regression gate (llmload.gates.compare)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from llmload.gates.compare import (
    Thresholds,
    common_goodput_slo,
    compare_runs,
    load_run,
    render_markdown,
    render_text,
)
from llmload.rundir import read_manifest
from llmload.yamlfile import load_yaml_model

HELP = "regression gate: p50/p95/p99 of a run against a baseline run; exit 1 on regression"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("baseline", help="baseline run directory (run.json + requests.jsonl)")
    parser.add_argument("current", help="current run directory")
    parser.add_argument("--thresholds", type=Path, default=None, help="YAML overriding the limits (docs/gates.md)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the table as Markdown (CI comments)")


def run(args: argparse.Namespace) -> int:
    """0: no regression; 1: a regression; 2: bad input."""
    thresholds = load_yaml_model(args.thresholds, Thresholds) if args.thresholds else Thresholds()
    runs = (Path(args.baseline), Path(args.current))
    slo, notes = common_goodput_slo(*(read_manifest(run_dir) for run_dir in runs))
    baseline, current = (load_run(run_dir, slo) for run_dir in runs)
    comparison = compare_runs(baseline, current, thresholds)
    comparison.warnings += notes
    sys.stdout.write(render_text(comparison))
    if args.markdown:
        args.markdown.write_text(render_markdown(comparison))
    return 1 if comparison.regressions else 0
