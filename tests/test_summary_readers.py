"""summary.json holds what its readers need, so each reads it rather than the records: the
calibrate fidelity table (ITL p50 and preemptions per stage), the preflight (mean E2E per stage),
a sweep's row and a search's probe. Figures checked against the raw records and server samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload import rundir
from llmload.calibrate.fidelity import preemption_start, stage_figures
from llmload.conclude import conclude
from llmload.errors import InputError
from llmload.preflight.memory import measured_timing
from llmload.records import read_records
from llmload.stats.sketch import RELATIVE_ERROR
from tests.test_report_html import synthetic_run


def _run_with_warmup(tmp_path: Path) -> Path:
    """Four 30 s stages, the first made the warm-up; vLLM's preemptions counter is max(0, s − 100)
    at s seconds into the run, so only the last stage (90–120 s) preempts, 20 times."""
    run_dir = synthetic_run(tmp_path / "run", 600)
    manifest = orjson.loads((run_dir / rundir.MANIFEST_FILE).read_bytes())
    manifest["stages"][0].update(name="warm-up", warmup=True)
    (run_dir / rundir.MANIFEST_FILE).write_bytes(orjson.dumps(manifest))
    records = (run_dir / rundir.RECORDS_FILE).read_bytes().replace(b'"stage":"25%"', b'"stage":"warm-up"')
    (run_dir / rundir.RECORDS_FILE).write_bytes(records)
    conclude(run_dir)
    return run_dir


def test_each_stage_summary_holds_its_itl_median_e2e_mean_and_preemptions(tmp_path: Path) -> None:
    run_dir = _run_with_warmup(tmp_path)
    summary = rundir.read_summary(run_dir)
    assert summary is not None
    ok = read_records(run_dir / rundir.RECORDS_FILE).query("status == 'ok'")
    for stage in summary.stages:
        mine = ok[ok.stage == stage.name]
        gaps = np.concatenate(mine.itl_ms.map(lambda g: np.asarray(g, dtype=np.float32)).tolist())
        assert stage.itl_p50_ms == pytest.approx(np.percentile(gaps, 50), rel=RELATIVE_ERROR)
        assert stage.e2e_mean_ms == pytest.approx(mine.e2e_ms.mean(), rel=1e-12)
    assert [s.preemptions for s in summary.stages] == [0.0, 0.0, 0.0, 20.0]
    assert summary.server is not None and summary.server.preemptions == 24.0  # the whole run, drain included


def test_the_readers_take_the_stage_summary_and_leave_the_warmup_out_of_what_is_judged(tmp_path: Path) -> None:
    run_dir = _run_with_warmup(tmp_path)
    summary = rundir.read_summary(run_dir)
    assert summary is not None
    judged = summary.stages[1:]
    figures = stage_figures(run_dir)
    assert [(f.name, f.ttft_p50_ms, f.itl_p50_ms, f.e2e_p50_ms, f.preemptions) for f in figures] == [
        (s.name, s.ttft_p50_ms, s.itl_p50_ms, s.e2e_p50_ms, s.preemptions) for s in judged
    ]
    assert preemption_start(figures) == "100%"
    by_stage, overall = measured_timing(run_dir)
    assert {name: t.e2e_s * 1000 for name, t in by_stage.items()} == {s.name: s.e2e_mean_ms for s in summary.stages}
    ok = read_records(run_dir / rundir.RECORDS_FILE).query("status == 'ok' and stage != 'warm-up'")
    assert overall.e2e_s == pytest.approx(ok.e2e_ms.mean() / 1000, rel=1e-12)
    assert overall.source == "measured: run, all judged stages"


def test_a_summary_missing_or_from_an_older_llmload_says_how_to_rebuild_it(tmp_path: Path) -> None:
    run_dir = _run_with_warmup(tmp_path)
    summary = orjson.loads((run_dir / rundir.SUMMARY_FILE).read_bytes())
    del summary["stages"][0]["itl_p50_ms"]
    (run_dir / rundir.SUMMARY_FILE).write_bytes(orjson.dumps(summary))
    with pytest.raises(InputError, match=r"stages\.0\.itl_p50_ms: Field required; `llmload report .*` rebuilds it"):
        stage_figures(run_dir)
    (run_dir / rundir.SUMMARY_FILE).unlink()
    assert rundir.read_summary(run_dir) is None
    with pytest.raises(InputError, match=r"has no summary.json: `llmload report .*` writes it"):
        measured_timing(run_dir)
