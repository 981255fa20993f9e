"""How fast does `llmload workload build` turn logs into workloads, and does its memory stay flat?

(a) the Azure LLM inference conversation trace (19,366 requests, lengths only, so every prompt is
    synthesized text of the exact length): build, then `workload stats` of the built file.
    Goal: < 10 s together.
(b) a generated OpenAI chat-completions JSONL log of 1M lines (multi-turn sessions, ~200 bytes a
    message, time-ordered, responses logged without usage, so every message is tokenized):
    build, then `workload stats` of the log. Goal: < 2 min, and memory flat: the 100k-line log
    is built too, and the two peak RSS figures are compared.

Each measurement runs in a fresh (spawned) process, which reports its own peak RSS (build, then
stats) and the CPU time of its build (all threads): on a shared machine the wall time depends on
the neighbours.
"""

from __future__ import annotations

import argparse
import heapq
import random
import resource
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import orjson

AZURE_TRACE = Path(__file__).resolve().parents[1] / "data" / "azure_llm_inference_conv_2023.csv"
_WORDS = (
    "order delivery refund account price invoice shipping address the a to of and is in for my your "
    "please thanks when where why how can could would should today tomorrow week package tracking "
    "number status error payment card plan cancel upgrade support help agent problem issue"
).split()
SYSTEM = "You are the support assistant of an online shop. Answer briefly and politely, in the user's language."


def _text(rng: random.Random, tag: str, size: int = 200) -> str:
    """About `size` bytes of words, made unique by `tag` (so sessions never collide by chance)."""
    words = [tag]
    length = len(tag)
    while length < size:
        word = rng.choice(_WORDS)
        words.append(word)
        length += len(word) + 1
    return " ".join(words)


def generate_openai_log(path: Path, lines: int, *, seed: int = 0, sessions_per_s: float = 40.0) -> int:
    """A time-ordered multi-turn chat log: Poisson session starts, geometric turns (mean 2.5),
    exponential think times (mean 20 s). Streams to disk; returns the number of sessions."""
    rng = random.Random(seed)
    pending: list[tuple[float, int]] = []  # (time of the session's next request, session)
    histories: dict[int, list[dict[str, str]]] = {}
    turns_left: dict[int, int] = {}
    next_start, started, written = 0.0, 0, 0
    with path.open("wb") as out:
        while written < lines:
            if not pending or next_start <= pending[0][0]:
                session, now = started, next_start
                started += 1
                next_start += rng.expovariate(sessions_per_s)
                histories[session] = [{"role": "system", "content": SYSTEM}]
                n_turns = 1
                while rng.random() > 0.4 and n_turns < 12:
                    n_turns += 1
                turns_left[session] = n_turns
            else:
                now, session = heapq.heappop(pending)
            history = histories[session]
            history.append({"role": "user", "content": _text(rng, f"s{session}u{len(history)}")})
            reply = _text(rng, f"s{session}a{len(history)}", rng.randint(60, 400))
            record = {
                "timestamp": round(1_795_000_000 + now, 3),
                "request": {"model": "shop-chat", "messages": history, "max_tokens": 512},
                "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": reply}}]},
            }
            out.write(orjson.dumps(record) + b"\n")
            written += 1
            turns_left[session] -= 1
            if turns_left[session]:
                history.append({"role": "assistant", "content": reply})
                heapq.heappush(pending, (now + rng.expovariate(1 / 20), session))
            else:
                del histories[session], turns_left[session]
    return started


@dataclass
class Measured:
    requests: int
    sessions: int
    build_s: float
    build_cpu_s: float
    stats_s: float
    peak_rss_mb: float


def _measure(sources: list[str], output: str, stats_of: str) -> Measured:
    """In a fresh process: build, then stats of `stats_of` ("workload" or "source")."""
    from llmload.workload.build import build_workload, source_table
    from llmload.workload.files import load_workload
    from llmload.workload.stats import request_table, workload_stats

    started, cpu_started = time.perf_counter(), _cpu_s()
    built_stats = build_workload(sources, output, progress=None).stats  # the build's table is freed here
    built, cpu_built = time.perf_counter(), _cpu_s()
    table = request_table(load_workload(output)) if stats_of == "workload" else source_table(sources).table
    stats = workload_stats(table)
    done = time.perf_counter()
    assert stats == built_stats, "stats of the built workload differ from the build's"
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return Measured(
        stats.requests, stats.sessions, built - started, cpu_built - cpu_started, done - built, peak_kb / 1024
    )


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _fresh(sources: list[Path], output: Path, stats_of: str) -> Measured:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
        return pool.submit(_measure, [str(s) for s in sources], str(output), stats_of).result()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lines", type=int, default=1_000_000, help="lines of the generated OpenAI log")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="llmload-bench-") as tmp:
        work = Path(tmp)
        azure = _fresh([AZURE_TRACE], work / "azure.yaml", "workload")
        total = azure.build_s + azure.stats_s
        rows.append(
            ("Azure conv trace (synthesized text)", f"{azure.requests:,}", azure, "build + stats < 10 s", total < 10)
        )
        for lines in sorted({max(1, args.lines // 10), args.lines}):
            log = work / f"openai-{lines}.jsonl"
            generate_openai_log(log, lines)
            measured = _fresh([log], work / f"openai-{lines}.yaml", "source")
            size = f"{lines:,} lines, {log.stat().st_size / 2**20:,.0f} MiB"
            rows.append(
                (f"OpenAI JSONL ({size})", f"{measured.requests:,}", measured, "build < 2 min", measured.build_s < 120)
            )
            log.unlink()
    print(
        "| source | requests | sessions | build s | build CPU s | stats s | req/s (build) | peak RSS MiB | goal | met |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for name, requests, m, goal, met in rows:
        print(
            f"| {name} | {requests} | {m.sessions:,} | {m.build_s:.1f} | {m.build_cpu_s:.1f} | {m.stats_s:.1f} | "
            f"{m.requests / m.build_s:,.0f} | {m.peak_rss_mb:,.0f} | {goal} | {'yes' if met else 'no'} |"
        )


if __name__ == "__main__":
    main()
