"""Live figures: the Prometheus endpoint, the LLM tab of Locust's web UI and its headline rate."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmload.live import GAP_BUCKETS, METRIC_NAMES, LiveStats
from llmload.models import RequestRecord
from llmload.records import read_records
from llmload.schedule import build_stages
from tests.browser import CHROMIUM, inspect_page
from tests.locust_runs import REPO, free_port, locust_command, small_workload


def _scrape(url: str) -> dict[str, float]:
    """Every sample of a /metrics page, keyed by name and labels."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def _record(stage: str, status: str, sent: float, ttft: float, gaps: list[float], **kw: Any) -> dict[str, Any]:
    e2e = ttft + sum(gaps)
    return RequestRecord(
        run_id="r", worker=0, stage=stage, session_id="s", turn=0, scheduled_at=sent, sent_at=sent, status=status,
        ttft_ms=ttft, e2e_ms=e2e, tpot_ms=float(np.mean(gaps)) if gaps else None, itl_ms=gaps,
        output_tokens=len(gaps) + 1, schedule_delay_ms=1.0, **kw,
    ).model_dump()  # fmt: skip


def test_live_stats_count_every_record_and_give_numpys_percentiles() -> None:
    rng = np.random.default_rng(1)
    stages = build_stages(10.0, (50, 100), 10.0)
    live = LiveStats(stages, np.arange(0, 20, 0.1), started_at=1000.0)
    ttfts, gaps_all = [], []
    for i in range(150):
        ttft = float(rng.lognormal(4, 0.5))
        gaps = rng.exponential(8, int(rng.integers(1, 40))).round(3).tolist()
        ttfts.append(ttft)
        gaps_all += gaps
        live.add(_record("50%" if i < 50 else "100%", "ok", 1000.0 + i * 0.1, ttft, gaps))
    live.add(_record("100%", "failed", 1015.0, 5.0, [], error_category="engine_dead"))
    live.refresh(users=7, busy=3, now=1016.0)
    registry = {
        f"{s.name}{s.labels}": s.value for family in live.registry.collect() for s in family.samples
    }  # fmt: skip
    assert registry["llmload_requests_total{'status': 'ok', 'category': ''}"] == 150
    assert registry["llmload_requests_total{'status': 'failed', 'category': 'engine_dead'}"] == 1
    assert registry["llmload_ttft_seconds_count{}"] == 150
    assert registry["llmload_itl_seconds_count{}"] == len(gaps_all)
    assert registry["llmload_itl_seconds_sum{}"] == pytest.approx(sum(gaps_all) / 1000)
    # Prometheus buckets count values ≤ their bound
    assert registry["llmload_itl_seconds_bucket{'le': '0.01'}"] == sum(g / 1000 <= GAP_BUCKETS[3] for g in gaps_all)
    assert registry["llmload_users_busy{}"] == 3 and registry["llmload_stage_index{}"] == 1
    assert registry["llmload_target_qps{}"] == 10.0
    # 60 planned in the first 6 s of the 100% stage; 51 sent in it (from 10 s on, the failure included)
    assert registry["llmload_offered_qps{}"] == pytest.approx(60 / 6)
    assert registry["llmload_achieved_qps{}"] == pytest.approx(51 / 6)
    p50, p95, p99, n = live.percentiles("ttft") or (0, 0, 0, 0)
    assert (p50, p95, p99) == pytest.approx(tuple(np.percentile(ttfts, (50, 95, 99))))
    assert n == 150
    # what is served is what the dashboard and docs may name
    assert {f.name for f in live.registry.collect()} == {name.removesuffix("_total") for name in METRIC_NAMES}
    assert {"failed: engine_dead", "stage 50%", "stage 100%"} <= {row["name"] for row in live.tab_rows(now=1016.0)}


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make browser installs it)")
def test_web_ui_llm_tab_and_prometheus_agree_with_the_run(tmp_path: Path) -> None:
    """A real run in Locust's web UI: the LLM tab shows while it runs; afterwards the UI's request
    count and the Prometheus counters and histogram totals equal the run's summary."""
    web_port, metrics_port = free_port(), free_port()
    workload = small_workload(tmp_path)
    command = locust_command(
        None,
        workload,
        tmp_path / "reports",
        "live",
        "--target-qps",
        "8",
        "--stages",
        "100",
        "--stage-duration",
        "12",
        "--warmup",
        "0",
        "--prometheus-port",
        str(metrics_port),
    )
    command = [c for c in command if c not in ("--headless", "--only-summary")]
    command += ["--autostart", "--web-host", "127.0.0.1", "--web-port", str(web_port)]  # fmt: skip
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ui = f"http://127.0.0.1:{web_port}"
    try:
        summary_file = tmp_path / "reports" / "live" / "summary.json"
        time.sleep(7)  # mid-run
        page = inspect_page(f"{ui}/?tab=llm", screenshot=tmp_path / "llm-tab.png", settle_s=4)
        assert not page.errors, page.errors
        for text in ("TTFT ms", "ITL ms", "TPOT ms", "E2E ms", "stage 100%", "target 8.00", "server KV-cache usage"):
            assert text in page.text, page.text[:2000]
        deadline = time.time() + 60
        while not summary_file.exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        summary = orjson.loads(summary_file.read_bytes())
        with urllib.request.urlopen(f"{ui}/stats/requests", timeout=5) as response:
            ui_stats = json.load(response)
        metrics = _scrape(f"http://127.0.0.1:{metrics_port}/metrics")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    req = summary["requests"]
    records = read_records(tmp_path / "reports" / "live" / "requests.jsonl")
    # one Locust entry per request: the UI's headline is the real request count and failure ratio
    names = [s["name"] for s in ui_stats["stats"]]
    assert names == ["chat", "Aggregated"], names
    total = next(s for s in ui_stats["stats"] if s["name"] == "Aggregated")
    assert total["num_requests"] == req["ok"] + req["failed"] > 50 and ui_stats["fail_ratio"] == 0
    assert metrics["llmload_requests_total{category=,status=ok}"] == req["ok"]
    assert metrics["llmload_ttft_seconds_count{}"] == summary["latency_ms"]["ttft"]["count"] == req["ok"]
    assert metrics["llmload_itl_seconds_count{}"] == sum(len(g) for g in records.itl_ms)
    assert metrics["llmload_e2e_seconds_sum{}"] == pytest.approx(records.e2e_ms.sum() / 1000)
    assert metrics["llmload_output_tokens_total{}"] == records.output_tokens.sum()
    assert metrics["llmload_target_qps{}"] == 8.0
    assert "llmload: stage" not in output  # the console line is for headless runs


def _ui_state(ui: str) -> str:
    with urllib.request.urlopen(f"{ui}/stats/requests", timeout=5) as response:
        return str(json.load(response)["state"])


def test_each_start_from_the_web_ui_is_a_run_of_its_own(tmp_path: Path) -> None:
    """Start, let the plan finish, start again (the UI's "new test"): two complete run directories,
    not a second start that stops at once or appends to the first run's records."""
    web_port = free_port()
    reports = tmp_path / "reports"
    plan = ("--target-qps", "4", "--stages", "100", "--stage-duration", "3", "--warmup", "0")
    command = locust_command(None, small_workload(tmp_path, max_turns=1), reports, "unused", *plan)
    at = command.index("--run-id")
    command = [c for c in command[:at] + command[at + 2 :] if c not in ("--headless", "--only-summary")]
    command += ["--web-host", "127.0.0.1", "--web-port", str(web_port)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ui = f"http://127.0.0.1:{web_port}"
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                _ui_state(ui)
                break
            except OSError:
                time.sleep(0.3)
        for start in (1, 2):
            request = urllib.request.Request(f"{ui}/swarm", data=b"user_count=1&spawn_rate=1")
            with urllib.request.urlopen(request, timeout=10) as response:
                assert json.load(response)["success"]
            deadline = time.time() + 60
            while len(list(reports.glob("*/summary.json"))) < start and time.time() < deadline:
                time.sleep(0.3)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    runs = sorted(reports.iterdir())
    assert len(runs) == 2, output[-3000:]
    for run_dir in runs:
        summary = orjson.loads((run_dir / "summary.json").read_bytes())
        records = read_records(run_dir / "requests.jsonl")
        assert summary["requests"]["ok"] == summary["requests"]["scheduled"] == len(records) == 12
        assert (records.run_id == run_dir.name).all()
