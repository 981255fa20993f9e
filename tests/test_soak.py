"""`llmload soak`: ramp, hold at 150%, verdict and exit code."""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import orjson
import pytest

from llmload.cli.soak import add_arguments
from llmload.gates.passthrough import long_options
from llmload.gates.soak import SoakRun
from llmload.sim.process import SimProcess
from tests.locust_runs import llmload_cli, small_workload


def _soak(tmp_path: Path, *flags: str, timeout: float) -> tuple[int, str, dict]:
    reports = tmp_path / "reports"
    proc = llmload_cli("soak", "--reports-dir", str(reports), "--run-id", "soak", *flags, timeout=timeout)
    summary = orjson.loads((reports / "soak" / "summary.json").read_bytes())
    return proc.returncode, proc.stdout + proc.stderr, summary


def test_the_default_soak_is_the_ramp_then_5_minutes_at_150_percent() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--target-qps", "4"])
    soak = SoakRun("chat.py", "w.yaml", target_qps=4, ramp_stage_s=args.ramp_stage_duration, hold_s=args.duration)
    assert (args.ramp_stage_duration, args.duration) == (60.0, 300.0)
    command = soak.command()
    assert [command[command.index(flag) + 1] for flag in ("--stages", "--stage-duration", "--hold-duration")] == [
        "25,50,100,150",
        "60",
        "300",
    ]


class Soaked(NamedTuple):
    """A soak the CLI ran: its directory (reports/soak under it), exit code, output and summary.json."""

    directory: Path
    code: int
    output: str
    summary: dict


def _live_soak(directory: Path) -> Soaked:
    """The release ritual as CI runs it, with a 2-minute hold on the embedded target."""
    return Soaked(directory, *_soak(
        directory, "--workload", str(small_workload(directory, think_s=1.0)), "--target-qps", "6",
        "--ramp-stage-duration", "10", "--duration", "2m", timeout=300,
    ))  # fmt: skip


def _dying_soak(directory: Path) -> Soaked:
    """A short soak of a simulator whose engine dies on 5% of its requests."""
    with SimProcess("--ttft-ms", "10", "--itl-ms", "2", "--fault", "engine_dead:0.05") as sim:
        return Soaked(directory, *_soak(
            directory, "--host", sim.url, "--workload", str(small_workload(directory)), "--target-qps", "8",
            "--ramp-stage-duration", "2", "--duration", "10s", "--slo-ttft-p99-ms", "5000", timeout=120,
        ))  # fmt: skip


@pytest.fixture(scope="module")
def soaks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Soaked]:
    """The two soaks at once, each with a target of its own: the dying engine's (16 s of stages, 27 s
    alone) is over within the live soak's 30 s ramp, before the hold whose drift checks count the
    machine's other work."""
    with ThreadPoolExecutor(1) as pool:
        live = pool.submit(_live_soak, tmp_path_factory.mktemp("live"))
        dying = _dying_soak(tmp_path_factory.mktemp("dying"))
        return {"live": live.result(), "dying": dying}


def test_a_soak_at_150_percent_passes(soaks: dict[str, Soaked]) -> None:
    """The release ritual as CI runs it, with a 2-minute hold on the embedded target: long enough for
    every check to be judged. The default 5-minute soak is `make bench`'s (benchmarks/soak_default.py)."""
    directory, code, output, summary = soaks["live"]
    assert code == 0, output[-3000:]
    assert "llmload soak: PASS" in output
    hold = summary["stages"][-1]
    assert (hold["name"], hold["duration_s"], hold["target_qps"]) == ("150%", 120.0, 9.0)
    assert summary["verdict"]["passed"] is True
    reasons = " ".join(summary["verdict"]["reasons"])
    for check in ("OOM-family failures", "error rate", "achieved rate", "p99 TTFT drift", "KV-cache usage drift"):
        assert check in reasons
    # 2 minutes hold enough 10 s windows for every drift check to be judged, not skipped
    assert not any(r.startswith("SKIP") and "drift" in r for r in summary["verdict"]["reasons"])
    assert summary["server"]["kv_cache_usage_max"] is not None
    assert (directory / "reports" / "soak" / "report.html").stat().st_size > 10_000


def test_soak_with_dying_engine_fails_with_exit_code_1(soaks: dict[str, Soaked]) -> None:
    _, code, output, summary = soaks["dying"]
    assert code == 1, output[-3000:]
    assert "llmload soak: FAIL" in output
    assert summary["verdict"]["passed"] is False
    assert any(r.startswith("FAIL OOM-family failures") for r in summary["verdict"]["reasons"])
    assert summary["failures"]["by_category"]["engine_dead"] > 0


def test_bad_duration_is_refused(tmp_path: Path) -> None:
    proc = llmload_cli("soak", "--duration", "five minutes", timeout=30)
    assert proc.returncode == 2 and "not a duration" in proc.stderr


def test_a_run_id_in_use_is_refused_before_locust_starts(tmp_path: Path) -> None:
    """The used directory's verdict must not be printed as if it were this run's."""
    used = tmp_path / "reports" / "used"
    used.mkdir(parents=True)
    (used / "run.json").write_text("{}")
    (used / "summary.json").write_text('{"verdict": {"passed": true, "reasons": []}}')
    proc = llmload_cli("soak", "--reports-dir", str(tmp_path / "reports"), "--run-id", "used", timeout=30)
    assert proc.returncode == 2 and "already holds a run (run.json): give another --run-id" in proc.stderr
    assert "PASS" not in proc.stdout and sorted(p.name for p in used.iterdir()) == ["run.json", "summary.json"]


# the flags every soak run sets, derived from the fields SoakRun fills (llmload.gates.locust_run)
SOAK_FLAGS = (
    "--headless", "--only-summary", "--workload", "--stages", "--stage-duration", "--hold-duration", "--run-id",
    "--reports-dir", "--verdict", "--host", "--target-qps",
)  # fmt: skip


def test_a_flag_the_soak_sets_is_refused_before_locust_starts(tmp_path: Path) -> None:
    """`--stage-d 10` abbreviates --stage-duration: passed through, it would replace the soak's ramp."""
    soak = SoakRun("loadtests/chat.py", "w.yaml", target_qps=4, ramp_stage_s=60, hold_s=300, host="http://127.0.0.1:1")
    assert set(long_options(soak.command())) == set(soak.options()) == set(SOAK_FLAGS)
    proc = llmload_cli("soak", "--reports-dir", str(tmp_path / "reports"), "--stage-d", "10", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "--stage-d abbreviates --stage-duration, which is set by the soak" in proc.stderr
    assert not (tmp_path / "reports").exists()
