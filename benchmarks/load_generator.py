"""How fast and how honest is the load generator? One client process on one core.

(a) saturation: the embedded target answers 256-token streams with no pacing; how many chunks/s
    and requests/s can one client process parse?
(b) accuracy: 100 concurrent streams x 64 tokens, the target pacing first token at 50 ms and
    then 10 ms per token: measured TTFT and ITL minus that truth, and the client's CPU.

The client is llmload's own hot path (ChatClient.stream_chat, the code every Locust user runs),
pinned to one core; the target runs on the other. Goals (from measuring peer clients on this
2-core machine): at least vLLM's bench client (≈ 100k chunks/s; TTFT error p99 ≤ 72 ms), aiming
at ≥ 150k chunks/s, TTFT error p50 ≤ 2 ms / p99 ≤ 25 ms, ITL error p99 ≤ 3 ms.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import gevent
import numpy as np

from benchmarks import client_on_core_0
from llmload.client import ChatClient, StreamResult
from llmload.observe.host import StealMeter
from llmload.server.request import chat_body
from llmload.sim.process import SimProcess

MESSAGES = [{"role": "user", "content": "benchmark"}]
STEAL_WARN = 1.0
CPU_WARN = 60.0


@dataclass
class Load:
    results: list[StreamResult]
    wall_s: float
    cpu_s: float

    @property
    def cpu_percent(self) -> float:
        return 100 * self.cpu_s / self.wall_s

    @property
    def chunks(self) -> int:
        return sum(len(r.token_times) for r in self.results)


@contextmanager
def _pinned(sim: SimProcess) -> Iterator[SimProcess]:
    """The target on core 1, away from the client on core 0."""
    with sim:
        if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
            os.sched_setaffinity(sim.pid, {1})
        yield sim


def drive(
    url: str,
    *,
    streams: int,
    tokens: int,
    seconds: float | None = None,
    requests: int | None = None,
    stagger_s: float = 0.0,
) -> Load:
    """`streams` concurrent sessions sending back-to-back requests until time or count runs out.

    `stagger_s` spreads the sessions' first requests, so they do not all hit the target in lockstep.
    """
    body = chat_body("llmload-sim", MESSAGES, max_tokens=None, output_tokens=tokens)
    results: list[StreamResult] = []
    stop_at = time.perf_counter() + (seconds or 1e9)
    per_stream = (requests // streams) if requests else None

    def loop(delay: float) -> None:
        client = ChatClient(url)
        gevent.sleep(delay)
        sent = 0
        while time.perf_counter() < stop_at and (per_stream is None or sent < per_stream):
            results.append(client.stream_chat(body))
            sent += 1
        client.close()

    wall0, cpu0 = time.perf_counter(), time.process_time()
    gevent.joinall([gevent.spawn(loop, stagger_s * i / streams) for i in range(streams)])
    return Load(results, time.perf_counter() - wall0, time.process_time() - cpu0)


def saturation(seconds: float) -> list[tuple[str, str]]:
    rows = []
    for tokens in (256, 16):
        with _pinned(SimProcess("--ttft-ms", "0", "--itl-ms", "0")) as sim:
            drive(sim.url, streams=32, tokens=tokens, seconds=1.0)  # warm connections and caches
            load = drive(sim.url, streams=32, tokens=tokens, seconds=seconds)
        failed = sum(not r.ok for r in load.results)
        rows.append(
            (
                f"saturation, {tokens}-token streams, 32 concurrent",
                f"{load.chunks / load.wall_s:,.0f} chunks/s, {len(load.results) / load.wall_s:,.0f} req/s, "
                f"client CPU {load.cpu_percent:.0f}%, {1e6 * load.cpu_s / max(1, load.chunks):.1f} µs CPU/chunk"
                + (f", {failed} FAILED" if failed else ""),
            )
        )
    return rows


def accuracy(rounds: int) -> list[tuple[str, str]]:
    ttft_truth, itl_truth = 50.0, 10.0
    with _pinned(SimProcess("--ttft-ms", str(ttft_truth), "--itl-ms", str(itl_truth))) as sim:
        request_s = (ttft_truth + 63 * itl_truth) / 1000
        drive(sim.url, streams=100, tokens=64, requests=100)
        sim.reset_stats()  # forget the warm-up
        steal = StealMeter()
        load = drive(sim.url, streams=100, tokens=64, requests=100 * rounds, stagger_s=request_s)
        lag = sim.stats()["emission_lag_ms"]
    ok = [r for r in load.results if r.ok]
    ttft_err = np.array([(r.token_times[0] - r.sent_at) * 1000 - ttft_truth for r in ok])
    itl_err = np.concatenate([np.diff(r.token_times) * 1000 - itl_truth for r in ok])
    rows = [
        ("accuracy: streams x tokens", f"100 x 64, {len(ok)} requests ok of {len(load.results)}"),
        ("TTFT error p50 / p99 (ms)", f"{np.percentile(ttft_err, 50):+.2f} / {np.percentile(ttft_err, 99):+.2f}"),
        ("ITL error p50 / p99 (ms)", f"{np.percentile(itl_err, 50):+.3f} / {np.percentile(itl_err, 99):+.3f}"),
        ("client CPU", f"{load.cpu_percent:.0f}% of one core ({load.chunks / load.wall_s:,.0f} chunks/s)"),
        ("target's own emission lag p50 / p99 (ms)", f"{lag['p50']:.3f} / {lag['p99']:.3f} (part of the errors above)"),
        ("CPU steal by the hypervisor", f"{steal.percent:.1f}% of the machine's CPU time"),
    ]
    if steal.percent > STEAL_WARN:
        rows.append(("WARNING", f"CPU steal above {STEAL_WARN:.0f}%: tails include descheduled vCPUs"))
    if load.cpu_percent > CPU_WARN:
        rows.append(("WARNING", f"client CPU above {CPU_WARN:.0f}%: its timings include its own delay"))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each saturation run")
    parser.add_argument("--rounds", type=int, default=5, help="requests per stream in the accuracy run")
    args = parser.parse_args(argv)
    with client_on_core_0():
        rows = saturation(args.seconds) + accuracy(args.rounds)
    width = max(len(k) for k, _ in rows)
    print("\n## load generator (one process, one core)\n")
    print(f"| {'measure'.ljust(width)} | result |\n|{'-' * (width + 2)}|---|")
    for key, value in rows:
        print(f"| {key.ljust(width)} | {value} |")


if __name__ == "__main__":
    main()
