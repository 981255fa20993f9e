"""The end of a run: its records summarised once, and that one summary handed to the verdict, the
Markdown and the HTML. The Locust run calls it when it stops, `llmload report` to rebuild."""

from __future__ import annotations

from pathlib import Path

from llmload import rundir
from llmload.errors import InputError
from llmload.gates.criteria import SoakCriteria
from llmload.gates.verdict import SoakResult, evaluate
from llmload.models import Summary, Verdict
from llmload.report.html import chart_window_s, render_html
from llmload.report.markdown import render_markdown
from llmload.report.summary import summarize_run


def conclude(run_dir: Path, criteria: SoakCriteria | None = None) -> Summary:
    """Write summary.json, report.md and report.html of a run directory (and requests.parquet when it
    is not fresh); with `criteria`, judge the run first and write verdict.json, else keep the verdict
    the run already has. Raises InputError when run_dir is not a run directory."""
    run = rundir.load(run_dir)
    summary, itl = summarize_run(run, chart_window_s(run))
    if criteria is not None:
        summary.verdict = _verdict(run, summary, criteria)
        rundir.write_model(run_dir / rundir.VERDICT_FILE, summary.verdict)
    else:
        summary.verdict = rundir.read_verdict(run_dir)
    rundir.write_model(run_dir / rundir.SUMMARY_FILE, summary, indent=True)
    (run_dir / rundir.REPORT_FILE).write_text(render_markdown(summary))
    render_html(run, summary, itl)
    return summary


def _verdict(run: rundir.Run, summary: Summary, criteria: SoakCriteria) -> Verdict:
    """The verdict of the run; one stopped before its plan ended keeps a FAIL (what failed before the stop
    failed: an engine that died, a worker lost with its requests) and is INCONCLUSIVE otherwise (a pass on a
    hold cut short proves nothing)."""
    try:
        verdict = evaluate(run, summary, criteria).verdict
    except InputError as exc:  # stopped before any request: nothing to judge, and the report still written
        return Verdict(outcome="fail", reasons=[f"FAIL run: {exc}"])
    if not run.manifest.interrupted or verdict.outcome == "fail":
        return verdict
    stopped = "INCONCLUSIVE run: stopped before its plan ended (Ctrl-C, SIGTERM, -t): a hold cut short passes nothing"
    return verdict.model_copy(update={"outcome": "inconclusive", "reasons": [stopped, *verdict.reasons]})


def judge(run_dir: Path, criteria: SoakCriteria) -> SoakResult:
    """The soak verdict's checks of a run directory, its summary computed on the way (nothing written);
    InputError when run_dir is not a readable run."""
    run = rundir.load(run_dir)
    summary, _ = summarize_run(run)
    return evaluate(run, summary, criteria)
