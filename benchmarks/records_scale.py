"""Do `llmload report` and `llmload compare` stay fast and bounded on runs of production length?

Synthetic runs of 1M (and, with LLMLOAD_BENCH_10M=1, 10M) records of a simulator-like shape:
~200 ITL gaps a request, a per-request speed, 1% failures, a long server.jsonl (2 h of 1 s
scrapes). Each command runs as its own subprocess, so its peak RSS is its own (its process tree's,
parsing workers included). Goals on 2 cores: report < 30 s and < 2 GB, compare < 60 s and
< 3 GB at 1M; 10M within 4 GB, time about linear.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from subprocess import PIPE

import numpy as np
import orjson
import psutil

from llmload.models import RunManifest, Stage
from llmload.rundir import MANIFEST_FILE, RECORDS_FILE, SERVER_FILE
from tests.locust_runs import llmload_command

STARTED = 1_800_000_000.0
SAME_DATA_ABOVE = 5_000_000
_CHUNK = 20_000


def synthetic_run(
    run_dir: Path, requests: int, *, seed: int = 0, gaps: int = 200, qps: float = 150.0, server_s: int = 0
) -> Path:
    """A run directory as a Locust run leaves it (manifest, requests.jsonl, optionally server.jsonl),
    streamed to disk in chunks. Latencies: TTFT lognormal (median 120 ms), ITL gaps lognormal around a
    per-request speed (median 20 ms), gap counts uniform in gaps ± 25%; 1% of requests fail."""
    rng = np.random.default_rng(seed)
    duration = requests / qps
    stage = Stage(name="hold", percent=100.0, qps=qps, start_s=0.0, duration_s=duration)
    manifest = RunManifest(
        run_id=run_dir.name, host="http://sim", model="sim", workload="synthetic.yaml", arrival="constant",
        burstiness=1.0, seed=seed, target_qps=qps, stages=[stage], drain_s=10.0, started_at=STARTED, workers=1,
        limits={}, finished_at=STARTED + duration + 5,
    )  # fmt: skip
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json")))
    with (run_dir / RECORDS_FILE).open("wb") as out:
        for start in range(0, requests, _CHUNK):
            out.write(b"".join(_records(rng, run_dir.name, start, min(_CHUNK, requests - start), qps=qps, gaps=gaps)))
    if server_s:
        t = STARTED + np.arange(server_s, dtype=float)
        kv = np.clip(0.5 + 0.1 * rng.standard_normal(server_s), 0, 1)
        waiting = rng.poisson(2, server_s)
        samples = [
            {"t": ti, "health": 200, "kv_cache_usage": k, "waiting": w, "running": 8.0, "preemptions_total": i // 600}
            for i, (ti, k, w) in enumerate(zip(t.tolist(), kv.tolist(), waiting.tolist(), strict=True))
        ]
        (run_dir / SERVER_FILE).write_bytes(
            b"".join(orjson.dumps(x, option=orjson.OPT_APPEND_NEWLINE) for x in samples)
        )
    return run_dir


def _records(rng: np.random.Generator, run_id: str, start: int, n: int, *, qps: float, gaps: int) -> list[bytes]:
    sent = STARTED + (start + np.arange(n)) / qps
    ttft = np.round(rng.lognormal(np.log(120), 0.35, n), 3)
    counts = rng.integers(int(gaps * 0.75), int(gaps * 1.25) + 1, n)
    speed = rng.lognormal(np.log(20), 0.15, n)
    itl = np.round(np.repeat(speed, counts) * rng.lognormal(0, 0.3, int(counts.sum())), 3)
    per_request = np.split(itl, np.cumsum(counts)[:-1])
    failed = rng.random(n) < 0.01
    lines = []
    for i in range(n):
        gaps_i = per_request[i]
        base = {"run_id": run_id, "worker": 0, "stage": "hold", "session_id": f"s{start + i}", "turn": 0,
                "scheduled_at": sent[i] - 0.001, "sent_at": sent[i], "schedule_delay_ms": 1.0,
                "prompt_tokens": 500, "usage_from_server": True}  # fmt: skip
        if failed[i]:
            record = base | {"finished_at": sent[i] + 1, "status": "failed", "error_category": "timeout",
                             "http_status": None, "error_message": "read timed out", "itl_ms": []}  # fmt: skip
        else:
            e2e = round(float(ttft[i] + gaps_i.sum()), 3)
            record = base | {
                "first_token_at": sent[i] + ttft[i] / 1000, "finished_at": sent[i] + e2e / 1000, "ttft_ms": ttft[i],
                "e2e_ms": e2e, "tpot_ms": round(float(gaps_i.mean()), 3), "itl_ms": gaps_i,
                "output_tokens": int(counts[i]) + 1, "cached_tokens": 0, "status": "ok",
            }  # fmt: skip
        lines.append(orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE))
    return lines


def _measure(*argv: str) -> tuple[float, float]:
    """Wall seconds and peak RSS (GB) of `llmload ARGV`: the larger of its process tree's summed RSS
    (sampled every 50 ms: the parsing workers run beside it) and the largest single process's
    (RUSAGE_CHILDREN of a fresh parent, which misses no spike)."""
    code = (
        "import resource, subprocess, sys; r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL); "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)"
    )
    started = time.perf_counter()
    parent = psutil.Popen([sys.executable, "-c", code, *llmload_command(*argv)], stdout=PIPE)
    tree_peak = 0
    while parent.poll() is None:
        with contextlib.suppress(psutil.Error):
            tree = [parent, *parent.children(recursive=True)]
            tree_peak = max(tree_peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        time.sleep(0.05)
    wall = time.perf_counter() - started
    rss_kb, returncode = parent.stdout.read().split() if parent.stdout else (b"0", b"2")
    if returncode not in (b"0", b"1"):
        raise RuntimeError(f"llmload {' '.join(argv)} exited {returncode.decode()}")
    return wall, max(tree_peak, int(rss_kb) * 1024) / 1e9


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="records per run (default 1M, +10M)")
    args = parser.parse_args(argv)
    sizes = args.sizes or [1_000_000] + ([10_000_000] if os.environ.get("LLMLOAD_BENCH_10M") == "1" else [])
    print("\n### Runs of production length: `llmload report` and `compare` (wall s, peak RSS GB)\n")
    print("| records | ITL gaps | generate s | report s | report GB | report again (Parquet) s | GB "
          "| compare s | compare GB |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="llmload-scale-") as tmp:
        for n in sizes:
            started = time.perf_counter()
            first = synthetic_run(Path(tmp) / f"{n}-0", n, server_s=7200)
            generated = time.perf_counter() - started
            report = _measure("report", str(first))
            again = _measure("report", str(first))
            second = _second_run(first, n)
            compared = _measure("compare", str(first), str(second))
            print(
                f"| {n:,} | ~{n * 200:,} | {generated:.0f} | {report[0]:.1f} | {report[1]:.2f} | {again[0]:.1f} "
                f"| {again[1]:.2f} | {compared[0]:.1f} | {compared[1]:.2f} |",
                flush=True,
            )
            shutil.rmtree(first)
            shutil.rmtree(second)
    if max(sizes) >= SAME_DATA_ABOVE:
        print(f"\nRuns of {SAME_DATA_ABOVE:,} records or more are compared with a hard-linked copy of themselves.")


def _second_run(first: Path, n: int) -> Path:
    """The baseline for compare, reported (so compare reads Parquet for both): another seed, or
    above SAME_DATA_ABOVE records (18 GB of JSONL each) the first run's files hard-linked, which
    costs compare just as much."""
    second = first.with_name(f"{n}-1")
    if n < SAME_DATA_ABOVE:
        synthetic_run(second, n, seed=1, server_s=7200)
        _measure("report", str(second))
    else:
        second.mkdir()
        for path in first.iterdir():
            os.link(path, second / path.name)
    return second


if __name__ == "__main__":
    main(sys.argv[1:])
