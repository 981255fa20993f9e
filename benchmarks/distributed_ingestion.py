"""Where does a distributed run's master stop keeping up? Its record ingestion as workers are added.

Hosts of tests/netns.py (needs root): the target, `llmload sim` answering at once (0 ms TTFT
and ITL) with exactly 256 tokens a request, so each record carries 255 ITL gaps; a Locust master;
1, 2 and 4 workers, placed alternately in two worker namespaces. Each run steps its rate up
(stages of STAGE_S s each) past what the fleet can send; per stage: the records per second the
master wrote to requests.jsonl, the CPU of the master, of the workers (summed) and of the target,
achieved against target rate and the schedule delay p99. The master's CPU per record gives its
ceiling (records/s at one full core). A stage is limited by the master when it spends ~a whole
core while the others have room, and by the machine when every core is busy (all processes share
this machine's cores).
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from tests.distributed_harness import Fleet, start_fleet, start_target
from tests.locust_runs import fixed_output_workload
from tests.netns import hosts

OUTPUT_TOKENS = 256
STAGES = (25, 50, 75, 100)  # percent of each fleet's --target-qps
STAGE_S = 4.0
SAMPLE_S = 0.25
DEFAULT_RATES = "1:1600,2:2800,4:2800"  # 2 cores: one worker saturates near 1.4k req/s, the machine near 2k
BUSY = 85.0  # % of a core (of every core, for the machine): saturated


@dataclass
class Sample:
    at: float  # unix time
    lines: int  # requests.jsonl lines written so far
    master: float  # CPU seconds so far
    workers: float
    target: float
    idle: float  # the machine's idle CPU seconds so far, all cores


class Sampler:
    """Counts requests.jsonl's lines as the master appends them, and the processes' CPU seconds."""

    def __init__(self, records: Path, master: int, workers: list[int], target: int) -> None:
        self.records, self.offset, self.lines = records, 0, 0
        self.master = psutil.Process(master)
        self.workers = [psutil.Process(pid) for pid in workers]
        self.target = psutil.Process(target)
        self.samples: list[Sample] = []

    @staticmethod
    def _cpu(proc: psutil.Process) -> float:
        try:
            t = proc.cpu_times()
        except psutil.NoSuchProcess:
            return 0.0
        return float(t.user + t.system)

    def sample(self) -> None:
        if self.records.exists():
            with self.records.open("rb") as f:
                f.seek(self.offset)
                data = f.read()
            end = data.rfind(b"\n") + 1  # a line counts once written whole
            self.lines += data.count(b"\n", 0, end)
            self.offset += end
        self.samples.append(
            Sample(time.time(), self.lines, self._cpu(self.master), sum(map(self._cpu, self.workers)),
                   self._cpu(self.target), psutil.cpu_times().idle)
        )  # fmt: skip

    def between(self, start: float, end: float) -> tuple[float, float, float, float, float]:
        """Records/s written, CPU % (of one core) of master, workers, target, and the machine's busy
        share (% of all cores: the kernel's network work too) over [start, end]."""
        inside = [s for s in self.samples if start <= s.at <= end]
        if len(inside) < 2:
            return (float("nan"),) * 5
        a, b = inside[0], inside[-1]
        wall = b.at - a.at
        return (
            (b.lines - a.lines) / wall,
            100 * (b.master - a.master) / wall,
            100 * (b.workers - a.workers) / wall,
            100 * (b.target - a.target) / wall,
            100 - 100 * (b.idle - a.idle) / wall / (os.cpu_count() or 1),
        )


def _run(workers: int, target_qps: float, tmp: Path) -> list[str]:
    """One fleet's stepped run; a table row per judged stage."""
    workload = fixed_output_workload(tmp, OUTPUT_TOKENS)
    logs, reports = tmp / f"logs-{workers}", tmp / "reports"
    run_id = f"ingest-{workers}"
    flags = (
        "--target-qps", f"{target_qps:g}", "--stages", ",".join(map(str, STAGES)), "--stage-duration", f"{STAGE_S:g}",
        "--arrival", "constant", "--warmup", "3", "--max-users", "200", "--drain-timeout", "10",
    )  # fmt: skip
    with hosts("master", "worker1", "worker2", "target") as net:
        url = start_target(net, "target", logs, "--ttft-ms", "0", "--itl-ms", "0")
        target_pid = net.processes[0].pid
        fleet: Fleet = start_fleet(
            net, url, workload, reports, run_id, flags=flags, logs=logs, workers=workers,
            worker_hosts=["worker1", "worker2"],
        )  # fmt: skip
        sampler = Sampler(fleet.run_dir / "requests.jsonl", fleet.master.pid, [w.pid for w in fleet.workers],
                          target_pid)  # fmt: skip
        deadline = time.monotonic() + 120
        while fleet.master.poll() is None and time.monotonic() < deadline:
            sampler.sample()
            time.sleep(SAMPLE_S)
        code = fleet.wait(30)
        fleet.stop_workers()
        if code != 0 and not (fleet.run_dir / "summary.json").exists():
            raise RuntimeError(f"the master exited {code}\n{fleet.tails()}")
        summary = fleet.summary
    started = summary["run"]["started_at"]
    rows, offset = [], 0.0
    for stage in summary["stages"]:
        # the stage's window, its first half-second left out (the rate step's transient)
        start, offset = started + offset, offset + stage["duration_s"]
        if stage["warmup"]:  # users spawning: not a rate the fleet was asked to hold
            continue
        records_s, master, worker_cpu, target, busy = sampler.between(start + 0.5, started + offset)
        held = stage["achieved_qps"] >= 0.98 * stage["target_qps"] and stage["schedule_delay_p99_ms"] <= 100
        if master >= BUSY and worker_cpu / workers < BUSY:
            limit = "master"
        elif busy >= BUSY:
            limit = "machine"
        elif worker_cpu / workers >= BUSY:
            limit = "workers"
        else:
            limit = "none"
        per_record = 1e4 * master / records_s if records_s > 0 else float("nan")  # µs of master CPU a record
        rows.append(
            f"| {workers} | {stage['target_qps']:,.0f} | {stage['achieved_qps']:,.0f} "
            f"| {stage['schedule_delay_p99_ms']:,.0f} | {records_s:,.0f} | {master:.0f}% | {worker_cpu:.0f}% "
            f"| {target:.0f}% | {busy:.0f}% | {per_record:,.0f} µs → {1e6 / per_record:,.0f}/s "
            f"| {'yes' if held else 'NO'} | {limit} |"
        )
    return rows


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rates", default=DEFAULT_RATES,
        help="WORKERS:RATE,...: the fleets to run and the 100%% rate each steps up to (past one worker's ~1.4k req/s)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    print("\n## distributed ingestion: the master's records/s as workers are added\n")
    if os.geteuid() != 0:
        print("SKIPPED: needs root (network namespaces, tests/netns.py): run"
              " `python -m benchmarks.distributed_ingestion` as root")  # fmt: skip
        return
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())  # fmt: skip
    print(f"machine: {os.cpu_count()} cores ({cpu}), Linux {platform.release()}; {OUTPUT_TOKENS}-token records\n")
    print("| workers | target req/s | achieved req/s | sched. delay p99 ms | records/s written "
          "| master CPU | workers CPU (sum) | target CPU | machine busy | master CPU/record → ceiling "
          "| held | saturated |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for pair in args.rates.split(","):
            workers, rate = pair.split(":")
            for row in _run(int(workers), float(rate), Path(tmp)):
                print(row, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
