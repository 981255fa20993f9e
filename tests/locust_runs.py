"""Helpers to run real headless Locust processes and the llmload CLI against loopback targets, read
their reports, scrape a server's /metrics, stop a child process mid-run and write `vllm serve`
configs of the tiny model."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from llmload.models import Message, Session, Turn, WorkloadSpec
from llmload.records import read_records
from llmload.sim.profiles import CalibrationFit, CalibrationPoint, EngineProfile
from llmload.workload import save_workload
from llmload.workload.distributions import LogNormal
from llmload.workload.synth import PrefixPool, SynthOptions, TextSynthesizer, synthesize_workload
from llmload.workload.tokens import get_tokenizer

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "loadtests" / "chat.py"


def small_workload(
    directory: Path, name: str = "small", *, max_turns: int = 3, think_s: float = 0.3, output_median: float = 16
) -> Path:
    options = SynthOptions(
        sessions=60,
        seed=2,
        max_turns=max_turns,
        shared_prefixes=[PrefixPool(count=2, tokens=60)],
        prompt_tokens=LogNormal(kind="lognormal", median=30, sigma=0.9),
        output_tokens=LogNormal(kind="lognormal", median=output_median, sigma=0.7),
        think_time_s=LogNormal(kind="lognormal", median=think_s, sigma=0.8),
    )
    spec, sessions = synthesize_workload(name, options)
    return save_workload(spec, sessions, directory / f"{name}.yaml")


def fixed_output_workload(directory: Path, output_tokens: int, sessions: int = 300) -> Path:
    """Single-turn requests of ~50 prompt tokens and exactly `output_tokens` output tokens: a load
    whose engine cost is known, for checks against the simulator's saturation rate."""
    synth = TextSynthesizer(get_tokenizer("cl100k_base"), seed=1)
    turn = lambda: Turn(messages=[Message(role="user", content=synth.text(40))], output_tokens=output_tokens)  # noqa: E731
    return write_workload(directory, "single", [Session(id=f"s{i}", turns=[turn()]) for i in range(sessions)])


def write_workload(directory: Path, name: str, sessions: list[Session], **spec: Any) -> Path:
    workload = WorkloadSpec(version=1, name=name, sessions=f"{name}.sessions.jsonl", **spec)
    return save_workload(workload, sessions, directory / f"{name}.yaml")


@dataclass
class LocustRun:
    returncode: int
    output: str
    run_dir: Path

    @property
    def summary(self) -> dict[str, Any]:
        return orjson.loads((self.run_dir / "summary.json").read_bytes())

    @property
    def manifest(self) -> dict[str, Any]:
        return orjson.loads((self.run_dir / "run.json").read_bytes())

    @property
    def records(self) -> pd.DataFrame:
        return read_records(self.run_dir / "requests.jsonl")


def locust_command(host: str | None, workload: Path, reports: Path, run_id: str, *extra: str) -> list[str]:
    """A headless Locust run of loadtests/chat.py; no host means the embedded target."""
    target = ["--host", host] if host else []
    return [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary", *target,
        "--workload", str(workload), "--reports-dir", str(reports), "--run-id", run_id, *extra,
    ]  # fmt: skip


def run_locust(
    host: str | None,
    workload: Path,
    reports: Path,
    run_id: str,
    *extra: str,
    timeout: float = 90,
    env: dict[str, str] | None = None,
) -> LocustRun:
    """`env` is added to this process's environment (a secret given as a variable)."""
    proc = subprocess.run(
        locust_command(host, workload, reports, run_id, *extra),
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return LocustRun(proc.returncode, proc.stdout + proc.stderr, reports / run_id)


@dataclass(frozen=True)
class KeepsUp:
    """Ground truth for a search's answer: a longer constant-rate run at it, judged by what finished
    (not by llmload's verdict): the share of its requests that finished ok, and its E2E p50 in the
    first and the last quarter of its hold.

    The gate's promise is that an overload of 10% or more never passes (docs/gates.md); at a rate
    right at capacity the queue wanders and its E2E may well double in a minute. A server offered
    10% more than it serves queues 0.1 s more wait each second, so the answer holds when the E2E
    p50 rose less than that between the quarters' middles (¾ of the hold apart)."""

    sent: int
    finished_ok: int
    e2e_p50_first_ms: float
    e2e_p50_last_ms: float
    hold_s: float

    @classmethod
    def of(cls, run_dir: Path) -> KeepsUp:
        """From a run's records: the requests of its last stage (the hold)."""
        records = read_records(run_dir / "requests.jsonl")
        hold = records[(records.stage == records.stage.iloc[-1]) & (records.status != "not_sent")]
        offset = hold.sent_at - hold.sent_at.min()
        seconds = float(offset.max())
        ok = hold[hold.status == "ok"]
        first = ok.e2e_ms[offset[ok.index] < seconds / 4]
        last = ok.e2e_ms[offset[ok.index] >= seconds * 3 / 4]
        return cls(len(hold), len(ok), float(first.median()), float(last.median()), seconds)

    @property
    def finished_share(self) -> float:
        return self.finished_ok / self.sent if self.sent else 0.0

    @property
    def wait_added_ms(self) -> float:
        return self.e2e_p50_last_ms - self.e2e_p50_first_ms

    @property
    def overload_wait_ms(self) -> float:
        """The E2E p50 rise a 10% overload gives between the first and the last quarter."""
        return 0.10 * 0.75 * self.hold_s * 1000

    def holds(self) -> bool:
        """≥ 97% of the requests finished ok, and E2E p50 rose less than a 10% overload makes it."""
        return self.finished_share >= 0.97 and self.wait_added_ms < self.overload_wait_ms


def llmload_command(*args: str) -> list[str]:
    """`llmload ARGS` run by this interpreter, so that it is this checkout's llmload, not the PATH's."""
    return [sys.executable, "-m", "llmload.cli", *args]


def llmload_cli(
    *args: str, timeout: float | None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`llmload ARGS` in a child process from the repository root, its output captured: what a user
    sees, exit code included. The timeout is required so that a hung command fails its test (None: no
    limit, for benchmarks that measure how long the command takes)."""
    return subprocess.run(
        llmload_command(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False, env=env
    )


def metrics_text(url: str, timeout: float = 10) -> str:
    """The Prometheus page a server at `url` serves on /metrics, for checks of its names and labels."""
    with urllib.request.urlopen(url + "/metrics", timeout=timeout) as response:
        text: str = response.read().decode()
    return text


@contextlib.contextmanager
def running(command: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A child process the test signals mid-run (output merged, as text); killed if still running.
    SIGINT is restored for it: a test runner started as a background job of a non-interactive shell
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt (a CI rehearsal's
    Ctrl-C tests ran to the end)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # exec resets a handler, not SIG_IGN
    try:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def wait_until(condition: Callable[[], bool], timeout_s: float, never: str) -> None:
    """Poll until `condition` holds; fail with `never` if it does not within the timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not condition():
        time.sleep(0.2)
    assert condition(), never


TINY_LLAMA_CONFIG = """\
model: org/tiny-llama
served-model-name: tiny-llama
dtype: float32
max-model-len: {length}
kv-cache-memory-bytes: {kv}
block-size: 128
max-num-seqs: {seqs}
"""


def tiny_llama_config(path: Path, *, length: int, kv: str, seqs: int, extra: str = "") -> Path:
    """A `vllm serve --config` file of the bundled tiny-llama (max-model-len on line 4, KV on line 5)."""
    path.write_text(TINY_LLAMA_CONFIG.format(length=length, kv=kv, seqs=seqs) + extra)
    return path


def calibrated_as(profile: EngineProfile, decode: list[tuple[int, int, int]]) -> EngineProfile:
    """`profile` as if calibrated on decode points of (streams, prompt tokens, output tokens)."""
    points = [
        CalibrationPoint(kind="decode", streams=n, prompt_tokens=p, output_tokens=o, repeats=3, measured_ms=4.0,
                         spread_pct=5.0, fitted_ms=4.0, residual_pct=0.0)
        for n, p, o in decode
    ]  # fmt: skip
    fit = CalibrationFit(host="http://127.0.0.1:1", served_model="tiny-llama", measured_at="2026-11-25T20:44:52Z",
                         duration_s=120, rounds=18, r2_itl=0.99, r2_ttft=0.99, max_abs_residual_pct=4,
                         standard_errors={}, poor=False, points=points)  # fmt: skip
    return profile.model_copy(update={"fit": fit})
