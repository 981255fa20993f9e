"""Per-replica /metrics: a run over several replicas scrapes every one each sample, reduces them to the fleet's
figures as over engines (summed, KV usage the fullest's), keeps each one's in server.jsonl's `replicas`, and
breaks them down in the summary and report. The release check after cancelled streams watches the whole fleet,
so a second replica that generates on for clients that left fails it, as one alone does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from llmload.cancel import held_excess
from llmload.observe.scraper import Scrape, fleet
from llmload.sim.process import SimProcess
from tests.locust_runs import LocustRun, fixed_output_workload, run_locust

ENGINE = ("--profile", "vllm-cpu-tiny", "--max-num-seqs", "64")
SMALL_KV = ("--block-size", "16", "--kv-cache-memory-bytes", str(40 * 16 * 1024), "--max-model-len", "608")


def test_replicas_reduce_like_engines_and_a_figure_one_lacks_is_unknown() -> None:
    a = Scrape(200, {"running": 3.0, "kv_cache_usage": 0.2, "waiting": 1.0, "spec_accepted_by_position": [4.0, 1.0]})
    b = Scrape(503, {"running": 2.0, "kv_cache_usage": 0.7, "spec_accepted_by_position": [2.0]}, ["vllm:waiting"])
    both = fleet([a, b])
    assert both.health == 200  # the primary's: failure classification reads it
    assert both.values == {"running": 5.0, "kv_cache_usage": 0.7, "spec_accepted_by_position": [6.0, 1.0]}
    assert both.missing == ["vllm:waiting"]  # a sum over the replicas that gave it would understate the queue
    assert fleet([a, Scrape(None, None, ["vllm:num_requests_running"])]).values is None  # one did not answer
    assert fleet([a]) is a


def _server_lines(run_dir: Path) -> list[dict]:
    return [orjson.loads(line) for line in (run_dir / "server.jsonl").read_bytes().splitlines()]


def test_every_replica_is_scraped_and_the_smaller_kv_cache_shows_apart(tmp_path: Path) -> None:
    with SimProcess(*ENGINE) as big, SimProcess(*ENGINE, *SMALL_KV) as small:
        run = run_locust(
            f"{big.url},{small.url}", fixed_output_workload(tmp_path, 200, sessions=100), tmp_path / "reports", "kv",
            "--target-qps", "6", "--stages", "100", "--stage-duration", "6", "--warmup", "0", "--arrival", "constant",
            "--metrics-interval", "0.5", timeout=90,
        )  # fmt: skip
    assert run.returncode == 0, run.output[-3000:]
    lines = _server_lines(run.run_dir)
    assert len(lines) >= 8 and all([r["host"] for r in line["replicas"]] == [big.url, small.url] for line in lines)
    read = [line for line in lines if all(r["running"] is not None for r in line["replicas"])]
    assert len(read) >= 8
    for line in read:
        one, two = line["replicas"]
        assert line["running"] == one["running"] + two["running"] and line["waiting"] == one["waiting"] + two["waiting"]
        assert line["kv_cache_usage"] == max(one["kv_cache_usage"], two["kv_cache_usage"])
        assert line["preemptions_total"] == one["preemptions_total"] + two["preemptions_total"]
    assert any(min(r["running"] for r in line["replicas"]) > 0 for line in read)  # both served at once
    replicas = {r["host"]: r for r in run.summary["server"]["replicas"]}
    assert list(replicas) == [big.url, small.url]
    small_peak, big_peak = replicas[small.url]["kv_cache_usage_max"], replicas[big.url]["kv_cache_usage_max"]
    assert small_peak > 0.5 and big_peak < 0.1 and small_peak > 10 * big_peak, (small_peak, big_peak)
    assert run.summary["server"]["kv_cache_usage_max"] == small_peak  # the fleet's: its fullest replica's
    assert all(r["unanswered_samples"] == 0 for r in replicas.values())
    report = (run.run_dir / "report.md").read_text()
    assert f"| `{small.url}` | {small_peak:.0%} |" in report, report
    page = (run.run_dir / "report.html").read_text()
    assert f'<tr><td class="l">{small.url}</td><td>{small_peak:.0%}</td>' in page
    if small_peak >= 0.8:
        warnings = run.summary["run"]["warnings"]
        assert any(w.startswith(f"replica {small.url}'s KV cache peaked at") for w in warnings), warnings
    print(f"KV peaks: small {small_peak:.1%}, big {big_peak:.2%}; samples {len(lines)}")


def test_a_second_replica_that_generates_on_for_cut_streams_fails_the_release_check(tmp_path: Path) -> None:
    with SimProcess(*ENGINE) as aborts, SimProcess(*ENGINE, "--no-abort-on-disconnect") as leaks:
        run = run_locust(
            f"{aborts.url},{leaks.url}", fixed_output_workload(tmp_path, 600, sessions=200), tmp_path / "reports",
            "cut", "--target-qps", "6", "--stages", "100", "--stage-duration", "10", "--warmup", "0",
            "--arrival", "constant", "--cancel-share", "0.6", "--cancel-after", "tokens:4", "--verdict", timeout=120,
        )  # fmt: skip
    check = next(line for line in run.summary["verdict"]["reasons"] if " release after cancelled streams: " in line)
    assert check.startswith("FAIL "), check
    assert run.summary["verdict"]["outcome"] == "fail"
    # the primary alone lets go: watching it only, as before, the check would have passed; the second holds more
    held = {host: _held_excess(run, host, i) for i, host in enumerate((aborts.url, leaks.url))}
    assert held[aborts.url] < 1 <= held[leaks.url], held
    print(check, held)


def _held_excess(run: LocustRun, host: str, index: int) -> float:
    """llmload.cancel.held_excess of one replica: its running and waiting against its own in-flight requests."""
    lines, records = _server_lines(run.run_dir), run.records
    mine = records[records.host == host]
    figures = {f: np.array([line["replicas"][index][f] for line in lines], dtype=float) for f in ("running", "waiting")}
    t = np.array([line["t"] for line in lines])
    sent_at, finished_at = mine.sent_at.to_numpy(dtype=float), mine.finished_at.to_numpy(dtype=float)
    excess = held_excess(t, figures["running"], figures["waiting"], sent_at, finished_at)
    assert excess is not None
    return excess
