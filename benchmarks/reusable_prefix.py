"""How fast is the reusable-prefix figure (llmload/workload/prefix.py) over 1M requests, and in what memory?

Synthetic sessions (geometric turns, mean ~3.3) open with one of 20 shared system prompts of
400–1,200 tokens, then add 60–300-token user messages and 50–400-token replies; token ids are drawn
directly (tokenizing the text is `workload build`'s cost, measured in benchmarks/workload_build.py).
The figure is computed at block size 16 and 128, each in a fresh (spawned) process that reports
its own peak RSS; the goal is 1M requests in < 60 s.
"""

from __future__ import annotations

import argparse
import resource
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

import numpy as np

_SYSTEM_PROMPTS = 20
_VOCABULARY = 100_000


def _measure(requests: int, block_size: int) -> tuple[float, float, int, float]:
    """(seconds, share, sessions, peak RSS MiB) of the figure over `requests` synthetic requests."""
    from llmload.workload.prefix import PrefixBlocks

    rng = np.random.default_rng(0)
    systems = [rng.integers(0, _VOCABULARY, rng.integers(400, 1200)) for _ in range(_SYSTEM_PROMPTS)]
    started = time.perf_counter()
    blocks = PrefixBlocks.from_text(block_size, "synthetic", "none")
    added = sessions = 0
    clock = 0.0
    while added < requests:
        n_turns = min(int(rng.geometric(0.3)), requests - added)
        system = systems[int(rng.integers(_SYSTEM_PROMPTS))]
        turns = [(rng.integers(0, _VOCABULARY, int(rng.integers(60, 300))), int(rng.integers(50, 400)))]
        turns[0] = (np.concatenate((system, turns[0][0])), turns[0][1])
        turns += [
            (rng.integers(0, _VOCABULARY, int(rng.integers(60, 300))), int(rng.integers(50, 400)))
            for _ in range(n_turns - 1)
        ]
        clock += 0.02
        blocks.add_session(turns, [clock + 20.0 * turn for turn in range(n_turns)])
        added += n_turns
        sessions += 1
    share = blocks.result().share or 0.0
    seconds = time.perf_counter() - started
    return seconds, share, sessions, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    print("| requests | sessions | block size | seconds | reusable share | peak RSS MiB | goal | met |")
    print("|---:|---:|---:|---:|---:|---:|---|---|")
    for block_size in (16, 128):
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            seconds, share, sessions, rss = pool.submit(_measure, args.requests, block_size).result()
        print(
            f"| {args.requests:,} | {sessions:,} | {block_size} | {seconds:.1f} | {100 * share:.1f}% | {rss:,.0f} | "
            f"< 60 s | {'yes' if seconds < 60 else 'no'} |"
        )


if __name__ == "__main__":
    main()
