"""Live figures: the Prometheus endpoint, the LLM tab of Locust's web UI and its headline rate."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmload.live import GAP_BUCKETS, METRIC_NAMES, LiveStats
from llmload.locust.views import console_line, tab_rows, window_label
from llmload.models import RequestRecord
from llmload.observe.observer import ServerSample
from llmload.records import read_records
from llmload.schedule import build_stages
from llmload.sim.process import SimProcess
from llmload.sweep.server import free_port
from tests.browser import CHROMIUM, inspect_page
from tests.locust_runs import REPO, locust_command, metrics_text, small_workload


def _scrape(url: str) -> dict[str, float]:
    """Every sample of the /metrics page at `url`, keyed by name and labels."""
    samples = {}
    for family in text_string_to_metric_families(metrics_text(url, timeout=5)):
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
    # sends are counted when they leave: 5 req/s for 10 s, then 10 req/s, known up to 16 s
    live.add_sends([i * 0.2 for i in range(50)] + [10 + i * 0.1 for i in range(60)], until=16.0)
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
    # the last 10 s (6..16 s) span the boundary: 4 s at 5 req/s and 6 s at 10 req/s
    assert registry["llmload_target_qps{}"] == pytest.approx((4 * 5 + 6 * 10) / 10)
    assert registry["llmload_offered_qps{}"] == pytest.approx(100 / 10)  # the plan: 10 req/s throughout
    assert registry["llmload_achieved_qps{}"] == pytest.approx((20 + 60) / 10)
    p50, p95, p99, n = live.percentiles("ttft") or (0, 0, 0, 0)
    assert (p50, p95, p99) == pytest.approx(tuple(np.percentile(ttfts, (50, 95, 99))))
    assert n == 150
    # what is served is what the dashboard and docs may name
    assert {f.name for f in live.registry.collect()} == {name.removesuffix("_total") for name in METRIC_NAMES}
    rows = tab_rows(live)
    names = [row["what"] for row in rows]
    assert names[:4] == ["TTFT ms", "ITL ms", "TPOT ms", "E2E ms"] and names[4:6] == ["stage 50%", "stage 100%"]
    assert [row["name"] for row in rows] == sorted(row["name"] for row in rows)  # the order Locust sorts by
    assert rows[4]["value"] == "target 5.00 · offered 10.00 · achieved 5.00 req/s (final)"
    assert rows[5]["value"].startswith("last 10 s: target 8.00 · offered 10.00 · achieved 8.00 req/s; stage so far")
    # a lost worker, as the master words it, is a row of the tab
    live.note("worker 1 (10.0.0.3) lost at +12 s (no heartbeat; noticed at +16 s): 2 requests in flight lost")
    assert [row["value"] for row in tab_rows(live) if row["what"] == "workers"] == live.notes
    # once the plan has ended (sends known beyond it), the gauges hold its last window, not a fading one
    live.add_sends([], until=23.5)
    live.refresh(users=7, busy=0, now=1023.5)
    assert live.window_rates().target == 10.0 and live.window_rates().seconds == 10.0


def test_a_console_window_is_labelled_by_the_stages_it_covers() -> None:
    """The line printed just after a boundary holds the seconds before it: it names the stage that
    ended, or both stages when its window straddles the boundary, never only the one just begun."""
    stages = build_stages(10.0, (50, 100), 10.0)  # 50% over 0..10 s, 100% over 10..20 s
    assert window_label(stages, 0.0, 0.0) == "stage 50%"  # nothing sent yet
    assert window_label(stages, 0.0, 10.0) == "stage 50%"  # ends on the boundary: all of it before
    assert window_label(stages, 5.0, 15.0) == "stages 50%→100%"
    assert window_label(stages, 10.0, 20.0) == "stage 100%"
    live = LiveStats(stages, np.arange(0, 20, 0.1), started_at=0.0)
    live.add_sends([i * 0.2 for i in range(50)], until=10.0)
    assert console_line(live).startswith("stage 50%, last 10 s: target 5.00 · offered 10.00 · achieved 5.00")
    live.add_sends([10 + i * 0.1 for i in range(20)], until=12.0)
    assert console_line(live).startswith("stages 50%→100%, last 10 s: target 6.00")


_RATES = re.compile(r"target (?P<target>[\d.]+) · offered (?P<offered>[\d.]+) · achieved (?P<achieved>[\d.]+) req/s")


def _watched_run(tmp_path: Path, run_id: str, host: str | None, *extra: str) -> tuple[str, list[dict[str, float]]]:
    """A headless run at 10 req/s (stages 50/100% × 15 s, constant arrivals) whose Prometheus gauges
    are scraped every 0.5 s while it goes; its console output and the scrapes."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    port = free_port()
    command = locust_command(
        host, small_workload(tmp_path), tmp_path / "reports", run_id, "--target-qps", "10", "--stages", "50,100",
        "--stage-duration", "15", "--warmup", "0", "--arrival", "constant", "--prometheus-port", str(port), *extra,
    )  # fmt: skip
    command.remove("--only-summary")
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    scrapes = []
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            with contextlib.suppress(OSError):
                scrapes.append(_scrape(f"http://127.0.0.1:{port}"))
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    return output, scrapes


def test_a_stalled_load_generator_shows_live_as_the_report_will_say_it() -> None:
    """The observer's timer fired 2.6 s late once: the LLM tab keeps the longest, and the headless
    console line warns from then on, past the report's limit only."""
    live = LiveStats(build_stages(4, (100,), 60), np.zeros(0), 0)
    live.see_server(ServerSample(t=0, health=200))  # the first sample has no timer before it
    assert "timer late by 0 ms now, 0 ms at most" in json.dumps(tab_rows(live))
    live.see_server(ServerSample(t=1, health=200, client_lag_ms=240))
    assert "load generator" not in console_line(live)
    live.see_server(ServerSample(t=2, health=200, client_lag_ms=2600))
    live.see_server(ServerSample(t=3, health=200, client_lag_ms=3))
    assert "timer late by 3 ms now, 2,600 ms at most (> 250 ms: latencies" in json.dumps(tab_rows(live))
    assert console_line(live).endswith("load generator timer late by 3 ms now, 2,600 ms at most "
                                        "(> 250 ms: latencies measured then include the stall)")  # fmt: skip
    assert live.registry.get_sample_value("llmload_load_generator_lag_seconds") == 0.003


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str, list[dict[str, float]]]]:
    """Two watched runs at once, each in a directory of its own (each mostly waits for its 30 s plan):
    `steady` against the embedded target, `short` with one user against 300 ms answers. Each run's
    directory, console output and scrapes."""
    directory = tmp_path_factory.mktemp("watched")
    with SimProcess("--ttft-ms", "300", "--itl-ms", "5") as sim, ThreadPoolExecutor(2) as pool:
        plans = {"steady": (None, ()), "short": (sim.url, ("--max-users", "1"))}
        futures = {
            name: pool.submit(_watched_run, directory / name, name, host, *extra)
            for name, (host, extra) in plans.items()
        }
        return {name: (directory / name, *future.result()) for name, future in futures.items()}


def test_live_rates_are_the_targets_mid_stage_and_at_boundaries(
    watched: dict[str, tuple[Path, str, list[dict[str, float]]]],
) -> None:
    tmp_path, output, scrapes = watched["steady"]
    lines = [line for line in output.splitlines() if "llmload: stage" in line]
    windowed = [_RATES.search(line) for line in lines if ", last 10 s:" in line]
    assert len(windowed) >= 2, output[-3000:]
    for match in windowed:  # a window across the 50% → 100% boundary has the blended target
        target, offered, achieved = (float(match[k]) for k in ("target", "offered", "achieved"))
        assert achieved == pytest.approx(target, rel=0.05) and offered == pytest.approx(target, rel=0.05), lines
    # a stage that ended prints its final rates, the report's
    summary = orjson.loads((tmp_path / "reports" / "steady" / "summary.json").read_bytes())
    report = {s["name"]: s for s in summary["stages"]}
    ended = [line for line in lines if " ended: " in line]
    assert ended and "stage 50% ended" in ended[0], lines
    stage = report["50%"]
    assert f"target {stage['target_qps']:.2f} · offered {stage['offered_qps']:.2f} · achieved " in ended[0]
    assert f"achieved {stage['achieved_qps']:.2f} req/s" in ended[0]
    # the gauges: every scrape once a full window has passed, mid-stage and just after the boundary
    full = [s for s in scrapes if s.get("llmload_stage_index{}") is not None and s["llmload_target_qps{}"] > 0]
    late = [s for s in full if s["llmload_offered_qps{}"] > 0][-len(full) * 3 // 5 :]
    assert len(late) >= 10
    for sample in late:
        target = sample["llmload_target_qps{}"]
        assert sample["llmload_achieved_qps{}"] == pytest.approx(target, rel=0.05), sample
    assert {sample["llmload_stage_index{}"] for sample in late} == {0.0, 1.0}


def test_live_rates_show_a_real_shortfall(watched: dict[str, tuple[Path, str, list[dict[str, float]]]]) -> None:
    """One user and 300 ms answers cannot send 5 or 10 requests a second: every live figure says so."""
    _, output, scrapes = watched["short"]
    windowed = [_RATES.search(line) for line in output.splitlines() if ", last 10 s:" in line]
    assert windowed, output[-3000:]
    for match in windowed:
        assert float(match["achieved"]) < 0.8 * float(match["target"]), match[0]
    late = scrapes[len(scrapes) // 2 :]
    assert all(s["llmload_achieved_qps{}"] < 0.8 * s["llmload_target_qps{}"] for s in late if s)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium (make browser installs it)")
def test_web_ui_llm_tab_and_prometheus_agree_with_the_run(tmp_path: Path) -> None:
    """A real run in Locust's web UI: the LLM tab shows while it runs; afterwards the UI's request
    count and the Prometheus counters and histogram totals equal the run's summary, and the tab shows
    the verdict (a 12 s hold is too short to tell: INCONCLUSIVE, with the hold it needs)."""
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
        "--verdict",
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
        order = ["TTFT ms", "ITL ms", "TPOT ms", "E2E ms", "stage 100%", "requests", "server KV-cache usage"]
        firsts = [line.split("\t", 1)[0] for line in page.text.splitlines()]
        assert [name for name in firsts if name in order] == order, page.text[:2000]  # the flow's order
        assert "target 8.00" in page.text
        deadline = time.time() + 60
        while not summary_file.exists() and time.time() < deadline:
            time.sleep(0.5)
        time.sleep(1)
        summary = orjson.loads(summary_file.read_bytes())
        with urllib.request.urlopen(f"{ui}/stats/requests", timeout=5) as response:
            ui_stats = json.load(response)
        metrics = _scrape(f"http://127.0.0.1:{metrics_port}")
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
    tab = {row["what"]: row["value"] for row in ui_stats["extended_stats"][0]["data"]}
    assert summary["verdict"]["outcome"] == "inconclusive"
    assert "hold at least 60 s" in tab["verdict: INCONCLUSIVE"], tab


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


def test_a_start_refused_in_the_web_ui_leaves_the_ui_up(tmp_path: Path) -> None:
    """A target where nothing answers: the web UI says why and stays up; started again
    with the host fixed, the run goes. Headless, the same refusal ends Locust with exit code 2."""
    reports = tmp_path / "reports"
    web_port = free_port()
    command = locust_command(
        f"http://127.0.0.1:{free_port()}", small_workload(tmp_path), reports, "fixed", "--target-qps", "4",
        "--stages", "100", "--stage-duration", "3", "--warmup", "0",
    )  # fmt: skip
    headless = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert headless.returncode == 2 and "nothing answers at http" in headless.stdout + headless.stderr
    command = [c for c in command if c not in ("--headless", "--only-summary")]
    command += ["--web-host", "127.0.0.1", "--web-port", str(web_port)]
    proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ui = f"http://127.0.0.1:{web_port}"
    try:
        with SimProcess("--ttft-ms", "5", "--itl-ms", "2") as sim:
            deadline = time.time() + 60
            while time.time() < deadline:
                with contextlib.suppress(OSError):
                    _ui_state(ui)
                    break
                time.sleep(0.3)
            _swarm(ui, b"user_count=1&spawn_rate=1")
            deadline = time.time() + 30
            while _ui_state(ui) != "stopped" and time.time() < deadline:
                time.sleep(0.3)
            assert proc.poll() is None and _ui_state(ui) == "stopped"
            with urllib.request.urlopen(f"{ui}/exceptions", timeout=5) as response:
                exceptions = json.dumps(json.load(response))
            assert "the run did not start: nothing answers at http" in exceptions
            assert not (reports / "fixed").exists()
            _swarm(ui, f"user_count=1&spawn_rate=1&host={sim.url}".encode())  # the host fixed in the form
            deadline = time.time() + 60
            while not (reports / "fixed" / "summary.json").exists() and time.time() < deadline:
                time.sleep(0.3)
            assert proc.poll() is None
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=30)
    summary = orjson.loads((reports / "fixed" / "summary.json").read_bytes())
    assert summary["requests"]["ok"] == summary["requests"]["scheduled"] == 12, output[-3000:]


def _swarm(ui: str, form: bytes) -> None:
    with urllib.request.urlopen(urllib.request.Request(f"{ui}/swarm", data=form), timeout=10) as response:
        assert json.load(response)["success"]


def test_the_tab_breaks_requests_down_by_replica_and_model_where_a_run_has_several() -> None:
    live = LiveStats(build_stages(10.0, (100,), 10.0), np.arange(0, 10, 0.1), started_at=1000.0)
    for i in range(40):
        host, model = ("http://a", "base") if i % 4 else ("http://b", "lora")
        ttft = 300.0 + i if host == "http://b" else 100.0 + i
        live.add(_record("100%", "ok", 1000.0 + i * 0.1, ttft, [5.0, 7.0], host=host, model=model))
    live.add(_record("100%", "failed", 1005.0, 1.0, [], host="http://b", model="lora", error_category="http_5xx"))
    rows = {row["what"]: row for row in tab_rows(live)}
    slow = rows["replica http://b: TTFT ms"]
    assert slow["value"] == "ok 10, failed 1; TPOT p50 6.0 ms"
    assert float(slow["p50"]) == np.median([300.0 + i for i in range(0, 40, 4)])
    assert rows["replica http://a: TTFT ms"]["value"].startswith("ok 30, failed 0")
    assert rows["model lora: TTFT ms"]["value"] == slow["value"]
    one_host = LiveStats(build_stages(10.0, (100,), 10.0), np.arange(0, 10, 0.1), started_at=1000.0)
    one_host.add(_record("100%", "ok", 1000.0, 100.0, [5.0], host=None, model="base"))
    assert not any(row["what"].startswith(("replica", "model")) for row in tab_rows(one_host))
