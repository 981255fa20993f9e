"""report.html: a real Locust run rendered and opened in headless Chromium, and edge cases."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import orjson
import pytest

from llmload.conclude import conclude
from llmload.models import NO_ENERGY, RequestRecord, RunManifest, Stage, Verdict
from llmload.observe.gpu import DCGM_FIELDS, GpuSample
from llmload.observe.observer import ServerSample
from llmload.recordlog import RecordWriter, with_server_state
from llmload.report.html import CHARTS
from llmload.rundir import HTML_FILE, MANIFEST_FILE, RECORDS_FILE, SERVER_FILE, SUMMARY_FILE, VERDICT_FILE
from llmload.sim.process import SimProcess
from tests.browser import CHROMIUM, inspect_page
from tests.locust_runs import run_locust, small_workload

STARTED = 1_800_000_000.0
HOSTILE = '<script>alert("x")</script><img src=http://example.invalid/x.png>'


def _manifest(run_id: str, stages: int = 4, stage_s: float = 30.0) -> RunManifest:
    return RunManifest(
        run_id=run_id, host="http://127.0.0.1:8000", model="tiny-llama", workload="chat.yaml", arrival="poisson",
        burstiness=1.0, seed=0, target_qps=10.0,
        stages=[Stage(name=f"{25 * (i + 1)}%", percent=25.0 * (i + 1), qps=2.5 * (i + 1), start_s=i * stage_s,
                      duration_s=stage_s) for i in range(stages)],
        drain_s=10.0, started_at=STARTED, workers=1, limits={}, finished_at=STARTED + stages * stage_s + 5,
    )  # fmt: skip


def synthetic_run(run_dir: Path, requests: int, *, failed_every: int = 20, server: bool = True) -> Path:
    """A run dir as a Locust run leaves it: manifest, records (100 ITLs each), summary, server samples
    with two GPUs."""
    manifest = _manifest(run_dir.name)
    run_dir.mkdir(parents=True)
    (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    rng = np.random.default_rng(0)
    span = manifest.stages[-1].end_s
    samples: list[ServerSample] = []
    if server:

        def gpu(index: int, used_mib: float, busy: float) -> GpuSample:
            return GpuSample(
                gpu=str(index), memory_used_mib=used_mib, memory_total_mib=81_559, utilization_percent=busy
            )

        samples = [
            ServerSample(t=STARTED + s, health=503 if s in (70, 71) else 200, kv_cache_usage=min(1.0, s / 100),
                         running=min(8, s // 10), waiting=max(0, s - 90), preemptions_total=max(0, s - 100),
                         gpus=[gpu(0, 40_000 + 300 * s, min(100, s)), gpu(1, 40_000, 20)])
            for s in range(int(span) + 5)
        ]  # fmt: skip
        (run_dir / SERVER_FILE).write_bytes(
            b"".join(orjson.dumps(s.model_dump(), option=orjson.OPT_APPEND_NEWLINE) for s in samples)
        )
    writer = RecordWriter(run_dir / RECORDS_FILE)
    for i in range(requests):
        at = STARTED + span * i / max(1, requests)
        stage = manifest.stages[int((at - STARTED) // 30)].name
        base = {"run_id": run_dir.name, "worker": 0, "stage": stage, "session_id": f"s{i // 3}", "turn": i % 3,
                "scheduled_at": at, "sent_at": at + 0.001, "schedule_delay_ms": 1.0}  # fmt: skip
        if failed_every and i % failed_every == 0:
            category = ("oom", "http_5xx", "rate_limited")[i // failed_every % 3]
            record = RequestRecord(**base, finished_at=at + 0.05, status="failed", error_category=category,
                                   http_status=500, error_message=HOSTILE)  # fmt: skip
            # as the recorder writes a failure: with the last server sample before it
            record = with_server_state(record, samples[int(at + 0.05 - STARTED)] if samples else None)
        else:
            itl = rng.gamma(4, 2.5, 100).tolist()
            ttft = float(rng.gamma(3, 30))
            record = RequestRecord(**base, first_token_at=at + ttft / 1000, finished_at=at + (ttft + sum(itl)) / 1000,
                                   ttft_ms=ttft, e2e_ms=ttft + sum(itl), tpot_ms=float(np.mean(itl)), itl_ms=itl,
                                   prompt_tokens=int(rng.integers(50, 2000)) * (1 + i % 3), output_tokens=101,
                                   usage_from_server=True, status="ok")  # fmt: skip
        writer.write([record])
    writer.close()
    conclude(run_dir)
    return run_dir


def render_html(run_dir: Path) -> Path:
    """report.html as the end of a run writes it (with the summary, from the records)."""
    conclude(run_dir)
    return run_dir / HTML_FILE


def _images(html: str) -> list[str]:
    return re.findall(r'<img src="(data:image/svg\+xml;base64,[A-Za-z0-9+/=]+)"', html)


def test_synthetic_run_has_every_chart_escaped_text_and_no_external_resource(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "synthetic", 600)
    html = render_html(run_dir).read_text()
    assert len(_images(html)) == len(CHARTS)
    assert HOSTILE not in html and "&lt;script&gt;alert(" in html  # server text shown, never run
    assert "<script" not in html and re.search(r'(src|href)="(?!data:)', html) is None
    assert re.search(r"<td class=\"l\">oom</td><td>10</td>\s*<td>\d+%</td>", html)  # server state at failure
    assert 'class="verdict' not in html  # no verdict asked for


def test_verdict_is_on_top(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "verdict", 60, server=False)
    verdict = Verdict(passed=False, reasons=["p99 TTFT 812 ms > 500 ms", "2 OOM failures"])
    (run_dir / VERDICT_FILE).write_bytes(orjson.dumps(verdict.model_dump()))
    html = render_html(run_dir).read_text()
    assert html.index("FAIL") < html.index("<h2>")
    assert "p99 TTFT 812 ms &gt; 500 ms" in html
    assert "No server metrics: the run has no server.jsonl" in html
    assert len(_images(html)) == len(CHARTS) - 2
    # no GPU source: no chart, no table, no note; only the energy line says there is no counter (never 0 J)
    assert html.count("GPU") == html.count(f"Energy: {NO_ENERGY}") == 1


def test_a_gpu_source_that_gave_nothing_gets_a_note_not_a_chart(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "dead-exporter", 60)
    samples = [orjson.loads(line) for line in (run_dir / SERVER_FILE).read_bytes().splitlines()]
    (run_dir / SERVER_FILE).write_bytes(
        b"".join(orjson.dumps({**s, "gpus": [], "missing": list(DCGM_FIELDS)}) + b"\n" for s in samples)
    )
    html = render_html(run_dir).read_text()
    assert "No GPU metrics: the GPU source (--gpu-metrics or nvidia-smi) gave none" in html
    assert len(_images(html)) == len(CHARTS) - 1


def test_empty_run_renders_notes_instead_of_charts(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "empty", 0, server=False)
    html = render_html(run_dir).read_text()
    assert "No successful requests" in html and "No failures." in html and "No server metrics" in html
    assert len(_images(html)) == 1  # only the stage rates: the plan is known even when nothing was sent


def test_all_failed_run_without_summary_json(tmp_path: Path) -> None:
    run_dir = synthetic_run(tmp_path / "failed", 30, failed_every=1)
    (run_dir / SUMMARY_FILE).unlink()  # rebuilt from the records
    html = render_html(run_dir).read_text()
    assert "No successful requests" in html and "Failures over time by category" in html
    assert len(_images(html)) == 4  # stage rates, server, GPU, failures


def test_twenty_thousand_records_render_every_chart(tmp_path: Path) -> None:
    """How fast a report is written is `make bench`'s (benchmarks/records_scale.py, 1M and 10M records)."""
    run_dir = synthetic_run(tmp_path / "big", 20_000)
    assert len(_images(render_html(run_dir).read_text())) == len(CHARTS)


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install -y chromium)")
def test_real_run_report_opens_in_chromium_without_errors(tmp_path: Path) -> None:
    workload = small_workload(tmp_path)
    with SimProcess("--ttft-ms", "20", "--itl-ms", "4", "--fault", "http_500:0.1", "--seed", "1") as sim:
        run = run_locust(sim.url, workload, tmp_path / "reports", "html", "--target-qps", "8",
                         "--stage-duration", "3", "--arrival", "constant")  # fmt: skip
    # Locust exits 1 when any request failed, as here by design
    assert run.returncode in (0, 1) and (run.run_dir / SUMMARY_FILE).exists(), run.output[-3000:]
    summary = run.summary
    assert summary["failures"]["by_category"].get("http_5xx", 0) > 0
    (run.run_dir / VERDICT_FILE).write_bytes(orjson.dumps({"passed": True, "reasons": ["no OOM-family failures"]}))
    path = render_html(run.run_dir)
    server_charted = "Server: KV cache and queue" in path.read_text() and "No server metrics" not in path.read_text()

    page = inspect_page(path, screenshot=tmp_path / "report.png")
    assert page.errors == [], page.errors
    assert page.title == "llmload run html"
    assert len(page.images) == len(CHARTS) - 1 - (0 if server_charted else 1)  # - 1: no GPU here
    assert all(img["complete"] and img["width"] > 100 and img["height"] > 50 for img in page.images), page.images
    assert "PASS" in page.text and "no OOM-family failures" in page.text
    assert f"{summary['requests']['failed']}" in page.text and "http_5xx" in page.text
    assert page.screenshot is not None and page.screenshot.stat().st_size > 10_000
    # at 1,280 px nothing scrolls the page sideways: a wide table scrolls in its own box
    assert page.page_width <= page.viewport_width, (page.page_width, page.viewport_width)
