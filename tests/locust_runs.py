"""Helpers to run real headless Locust processes against loopback targets and read their reports."""

from __future__ import annotations

import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from llmload.models import Message, Session, Turn, WorkloadSpec
from llmload.records import read_records
from llmload.workload import save_workload
from llmload.workload.synth import TextSynthesizer, synthesize_chat_workload
from llmload.workload.tokens import get_tokenizer

REPO = Path(__file__).resolve().parents[1]
LOCUSTFILE = REPO / "loadtests" / "chat.py"


def small_workload(
    directory: Path, name: str = "small", *, max_turns: int = 3, think_s: float = 0.3, output_median: float = 16
) -> Path:
    spec, sessions = synthesize_chat_workload(
        name,
        sessions=60,
        seed=2,
        max_turns=max_turns,
        system_prompts=(40, 80),
        user_tokens_median=30,
        output_tokens_median=output_median,
        think_time_median_s=think_s,
    )
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
    host: str | None, workload: Path, reports: Path, run_id: str, *extra: str, timeout: float = 90
) -> LocustRun:
    proc = subprocess.run(
        locust_command(host, workload, reports, run_id, *extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return LocustRun(proc.returncode, proc.stdout + proc.stderr, reports / run_id)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
