"""`llmload history` and `llmload compare --baseline history:DIR` on run directories: one real run of the
embedded target (with --label), and copies of it whose run.json and summary.json say other times and
figures, as a team's nightly runs would."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
import yaml

from llmload.cli import main
from llmload.errors import InputError
from llmload.history.trend import HISTORY_HTML, HISTORY_JSON, History
from llmload.models import parse_labels
from llmload.rundir import MANIFEST_FILE, SUMMARY_FILE
from llmload.sim.process import SimProcess
from tests.browser import CHROMIUM, inspect_page
from tests.locust_runs import run_locust, small_workload

DAY_S = 86_400.0
SERIES = 12
STEP_AT = 7  # the 8th run (0-based 7) is the first after the step
STEP = 1.15  # TTFT p99 ×1.15 from it on


def copy_run(source: Path, target: Path, *, started_at: float, ttft: float = 1.0, noise: float = 1.0,
             summary: bool = True, **manifest: Any) -> Path:  # fmt: skip
    """`source`'s run.json and summary.json in `target`, started at `started_at`: every latency percentile
    times `noise` (TTFT's times `ttft` too), output tok/s divided by it, and run.json's fields in `manifest`
    replaced (a run_id of the target's name)."""
    target.mkdir(parents=True)
    run = orjson.loads((source / MANIFEST_FILE).read_bytes())
    shift = started_at - run["started_at"]
    run.update(run_id=target.name, started_at=started_at, finished_at=run["finished_at"] + shift, **manifest)
    (target / MANIFEST_FILE).write_bytes(orjson.dumps(run))
    if summary:
        figures = orjson.loads((source / SUMMARY_FILE).read_bytes())
        for name, percentiles in figures["latency_ms"].items():
            for key, value in (percentiles or {}).items():
                if key != "count" and value is not None:
                    percentiles[key] = value * noise * (ttft if name == "ttft" else 1.0)
        figures["throughput"]["output_tokens_per_s"] /= noise
        figures["run"].update(run_id=target.name, started_at=started_at)
        (target / SUMMARY_FILE).write_bytes(orjson.dumps(figures))
    return target


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short run of the embedded target, labelled as a release would be."""
    directory = tmp_path_factory.mktemp("history-real")
    workload = small_workload(directory)
    with SimProcess("--ttft-ms", "20", "--itl-ms", "4") as sim:
        run = run_locust(sim.url, workload, directory / "reports", "real", "--target-qps", "8",
                         "--stage-duration", "2", "--arrival", "constant", "--label", "release=1.4.2",
                         "--label", "commit=abc123")  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    return run.run_dir


@pytest.fixture(scope="module")
def history_dir(real_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SERIES comparable nightly runs, every figure with 2% noise and TTFT ×STEP from the run STEP_AT on (2%
    noise of its own), and four apart:
    another workload, another plan, another model, and one killed before its end."""
    directory = tmp_path_factory.mktemp("history") / "reports"
    rng = np.random.default_rng(3)
    start = orjson.loads((real_run / MANIFEST_FILE).read_bytes())["started_at"]
    for i in range(SERIES):
        ttft, noise = (STEP if i >= STEP_AT else 1.0) * float(rng.normal(1, 0.02)), float(rng.normal(1, 0.02))
        copy_run(real_run, directory / f"nightly-{i + 1:02d}", started_at=start + i * DAY_S, ttft=ttft,
                 noise=noise, labels={"release": f"1.4.{i}"})  # fmt: skip
    later = start + SERIES * DAY_S  # the newest comparable run stays the last nightly
    copy_run(real_run, directory / "ci" / "other-workload", started_at=start - DAY_S, workload="/ci/other.yaml",
             workload_sha256="0" * 64)  # fmt: skip
    copy_run(real_run, directory / "ci" / "other-plan", started_at=start - 2 * DAY_S, target_qps=99.0)
    copy_run(real_run, directory / "other-model", started_at=start - 3 * DAY_S, model="bigger-model")
    copy_run(real_run, directory / "killed", started_at=later - DAY_S / 2, summary=False)
    return directory


def _history(directory: Path, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    code = main(["history", str(directory), *flags])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _compare(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["compare", *(str(a) for a in argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_labels_given_to_a_run_land_in_run_json(real_run: Path) -> None:
    manifest = orjson.loads((real_run / MANIFEST_FILE).read_bytes())
    assert manifest["labels"] == {"release": "1.4.2", "commit": "abc123"}
    assert manifest["flags"]["label"] == ["release=1.4.2", "commit=abc123"]
    # the workload by its content, so a renamed or edited file is told apart (history groups by it)
    workload = Path(manifest["workload"])
    spec = yaml.safe_load(workload.read_text())
    sent = workload.read_bytes() + (workload.parent / spec["sessions"]).read_bytes()
    assert manifest["workload_sha256"] == hashlib.sha256(sent).hexdigest()


def test_a_label_must_be_key_equals_value() -> None:
    assert parse_labels(["release=1.4.2", "note=a=b", "empty="]) == {"release": "1.4.2", "note": "a=b", "empty": ""}
    for bad in (["release"], ["=1.4.2"], ["a=1", "a=2"]):
        with pytest.raises(InputError, match="--label"):
            parse_labels(bad)


def test_history_groups_runs_and_finds_the_step(history_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _history(history_dir, capsys)
    assert code == 0, err
    history = History.model_validate_json((history_dir / HISTORY_JSON).read_bytes())
    assert [run.run_id for run in history.runs] == [f"nightly-{i + 1:02d}" for i in range(SERIES)]
    assert history.runs[0].labels == {"release": "1.4.0"} and history.runs[0].server == "vLLM 0.32.0+llmload-sim"
    apart = {run.run_id: run for run in history.apart}
    assert set(apart) == {"other-workload", "other-plan", "other-model", "killed"}
    assert apart["killed"].kind == "unfinished" and "no summary.json" in apart["killed"].reason
    assert "workload other.yaml" in apart["other-workload"].reason
    assert apart["other-plan"].reason.startswith("plan 99 req/s")
    assert "server configuration" in apart["other-model"].reason and "bigger-model" in apart["other-model"].reason
    trends = {trend.key: trend for trend in history.trends}
    assert "goodput" not in trends  # the run had no goodput SLO: no series, never zeros
    ttft = trends["ttft_p99"]
    assert len(ttft.changes) == 1, ttft.changes
    change = ttft.changes[0]
    assert abs(change.index - STEP_AT) <= 1 and change.run.labels["release"].startswith("1.4.")
    assert change.step_low < STEP - 1 < change.step_high and change.step > 0.08
    assert len(change.runs_before) + len(change.runs_after) == SERIES
    assert not trends["output_tokens_per_s"].changes  # only TTFT moved
    # the console: the trend table, the change named with its run and labels, the runs apart
    assert "TTFT p99" in out and "Change points:" in out and f"run {change.run.run_id} (release=" in out
    assert "worse" in out and "Listed apart (4):" in out and "killed (unfinished)" in out
    assert (history_dir / HISTORY_HTML).is_file()


def test_history_json_and_output_dir(history_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _history(history_dir, capsys, "--json", "-o", str(tmp_path / "out"))
    assert code == 0
    printed = History.model_validate_json(out)
    assert len(printed.runs) == SERIES and printed.trends
    assert (tmp_path / "out" / HISTORY_JSON).is_file() and (tmp_path / "out" / HISTORY_HTML).is_file()


def test_history_of_a_folder_without_runs_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _history(tmp_path, capsys)
    assert code == 2 and "no finished run" in err


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install -y chromium)")
def test_history_html_opens_in_chromium(history_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _history(history_dir, capsys)[0] == 0
    history = History.model_validate_json((history_dir / HISTORY_JSON).read_bytes())
    page = inspect_page(history_dir / HISTORY_HTML, screenshot=tmp_path / "history.png")
    assert page.errors == [], page.errors
    assert page.title == f"llmload history {history_dir}"
    assert len(page.images) == len(history.trends)
    assert all(img["complete"] and img["width"] > 100 and img["height"] > 50 for img in page.images), page.images
    assert "3 change point(s)" in page.text and "TTFT p99" in page.text and "release=1.4.7" in page.text
    assert "other-plan" in page.text and "not comparable" in page.text
    assert page.page_width <= page.viewport_width


def test_compare_against_history(history_dir: Path, real_run: Path, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    start = orjson.loads((history_dir / "nightly-12" / MANIFEST_FILE).read_bytes())["started_at"] + DAY_S
    same = copy_run(real_run, tmp_path / "same", started_at=start, ttft=STEP)
    slower = copy_run(real_run, tmp_path / "slower", started_at=start, ttft=STEP * 1.5)
    code, out, err = _compare(capsys, "--baseline", f"history:{history_dir}", same)
    assert code == 0, out + err
    assert "against the last 10 comparable run(s) (nightly-03 … nightly-12)" in out and "no regression" in out
    code, out, _ = _compare(capsys, f"history:{history_dir}", slower, "--history-runs", "5")
    assert code == 1 and "last 5 comparable run(s) (nightly-08 … nightly-12)" in out
    assert any(line.startswith("TTFT p99") and "REGRESSION" in line for line in out.splitlines()), out
    assert any(line.startswith("E2E p50") and "ok" in line for line in out.splitlines()), out


def test_compare_against_a_history_of_nothing_comparable(history_dir: Path, real_run: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    other = copy_run(real_run, tmp_path / "other", started_at=0.0, target_qps=3.0)
    code, _, err = _compare(capsys, "--baseline", f"history:{history_dir}", other)
    assert code == 2 and "0 run(s) under" in err and "plan 8 req/s" in err
    code, _, err = _compare(capsys, "--baseline", f"history:{history_dir}", other, real_run)
    assert code == 2 and "both BASELINE and --baseline: give BASELINE CURRENT, or --baseline" in err
    code, _, err = _compare(capsys, "--baseline", "history:", other)
    assert code == 2 and "expected history:DIR" in err
