"""The story of docs/prediction.md, run: Llama-2-70B chat, TP 4 on A100 80 GB, the Azure conversation
trace, a 50 req/s target. Checks each answer the page gives against what happens:

1. max_model_len 8192 is refused with vLLM's message (exit 1);
2. at 4096 the preflight at 4 req/s says compute-bound, with the predicted saturation rate S;
3. the embedded target sized from the same file (`llmload sim --vllm-config --gpu`) is sent every
   request of the workload within ten seconds, and the rate it sustains is the requests it answered
   over the time from the first sent to the last answered: S must be within 15% of it (a burst this
   short is not the steady state the preflight's 2,000-request prediction measures: its first wave
   of max_num_seqs requests finishes together, its last requests run alone; the whole burst's rate
   averages both);
4. `llmload predict` on an H200 and the replicas that carry 150% of 50 req/s.

The workload is every 4th request of the Azure conversation trace's first 2,000 (500 requests, the
trace's mix of lengths), so the simulator answers all of them in about three minutes. Rewrites the
story section of docs/prediction.md (~5 minutes).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from benchmarks import write_between_markers

REPO = Path(__file__).parent.parent
DOC = REPO / "docs" / "prediction.md"
TRACE = REPO / "tests" / "data" / "logs" / "azure-conv-2000.csv"
STORY = """model: meta-llama/Llama-2-70b-chat-hf
tensor-parallel-size: 4
max-model-len: {length}
gpu-memory-utilization: 0.9
"""
LLMLOAD = [sys.executable, "-m", "llmload.cli"]


def _llmload(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*LLMLOAD, *args], capture_output=True, text=True, check=check, timeout=900)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--every", type=int, default=4, help="keep every Nth request of the trace")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        long, short = where / "story-8192.yaml", where / "story.yaml"
        long.write_text(STORY.format(length=8192))
        short.write_text(STORY.format(length=4096))
        workload, log = where / "azure-conv.yaml", where / "azure-conv.csv"
        lines = TRACE.read_text().splitlines(keepends=True)
        log.write_text(lines[0] + "".join(lines[1 :: args.every]))
        _llmload("workload", "build", str(log), "-o", str(workload))
        refused = _llmload("capacity", "--vllm-config", str(long), "--gpu", "a100-80gb", check=False)
        line = next(line for line in refused.stdout.splitlines() if "User-specified max_model_len" in line)
        message = line[line.index("ValueError:") :]
        pre = _llmload(
            "capacity", "--vllm-config", str(short), "--gpu", "a100-80gb", "--workload", str(workload),
            "--target-qps", "4", "--json", check=False,
        )  # fmt: skip
        fit = json.loads(pre.stdout)["preflight"]
        saturation = fit["compute"]["saturation_qps"]
        outcomes = {s["stage"]: s["outcome"] for s in fit["compute"]["stages"]}
        sustained, requests = _sustained(short, workload, where)
        h200 = json.loads(
            _llmload(
                "predict", "--vllm-config", str(short), "--gpu", "h200", "--input-len", "1061", "--output-len",
                "265", "--num-prompts", "1000", "--target-qps", "50", "--json",
            ).stdout
        )  # fmt: skip
        a100 = json.loads(
            _llmload(
                "predict", "--vllm-config", str(short), "--gpu", "a100-80gb", "--input-len", "1061",
                "--output-len", "265", "--num-prompts", "1000", "--target-qps", "50", "--json",
            ).stdout
        )  # fmt: skip
    text = "\n".join(
        [
            f"1. **`max_model_len` 8192 is refused** (`llmload capacity`, exit {refused.returncode}), with vLLM's own "
            f"message:\n\n   ```\n   {message.strip()}\n   ```\n",
            f"2. **At 4096, the preflight at 4 req/s** (`--gpu a100-80gb`): the server completes at most "
            f"**{saturation:.2f} req/s** of this workload; stages "
            + ", ".join(f"{name} {outcome}" for name, outcome in outcomes.items())
            + f"; exit {pre.returncode}. At 50 req/s every stage is far past it.",
            f"3. **The sized simulator confirms it**: `llmload sim --vllm-config story.yaml --gpu a100-80gb`, sent "
            f"the workload's {requests} requests it serves within ten seconds over HTTP, answered them at "
            f"**{sustained:.2f} req/s** (first sent to last answered): predicted / sustained = "
            f"{saturation / sustained:.2f} (bound: within 15%).",
            f"4. **What would carry 50 req/s** (150%: 75 req/s) at ~1,061 prompt and 265 output tokens "
            f"(`llmload predict ... --target-qps 50`): 4×A100 80 GB saturates at "
            f"{a100['saturation_request_throughput']:.2f} req/s, so {a100['replicas_for_target_at_150pct']} "
            f"replicas; 4×H200 at {h200['saturation_request_throughput']:.2f} req/s, "
            f"{h200['replicas_for_target_at_150pct']} replicas (at saturation; more for latency headroom).",
        ]
    )
    write_between_markers(DOC, "<!-- story:begin -->", "<!-- story:end -->", text)
    print(text)
    return 0


def _sustained(config: Path, workload: Path, where: Path) -> tuple[float, int]:
    """(requests answered / seconds from the first sent to the last answered, requests answered) of the
    simulator sized from `config`, sent every request of `workload` within ten seconds."""
    port = "18947"
    sim = subprocess.Popen(
        [*LLMLOAD, "sim", "--vllm-config", str(config), "--gpu", "a100-80gb", "--port", port],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(5)
        count = sum(1 for _ in workload.with_suffix(".sessions.jsonl").open())
        subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(REPO / "loadtests" / "chat.py"), "--headless", "--only-summary",
             "--host", f"http://127.0.0.1:{port}", "--workload", str(workload), "--reports-dir", str(where / "reports"),
             "--run-id", "story", "--target-qps", f"{count / 10:g}", "--stages", "100", "--stage-duration", "10",
             "--warmup", "0", "--arrival", "constant", "--drain-timeout", "1200", "--timeout-first-token", "1200",
             "--timeout-total", "1500", "--max-users", str(2 * count)],
            capture_output=True, text=True, check=False, timeout=1500,
        )  # fmt: skip
    finally:
        sim.terminate()
        sim.wait(timeout=30)
    records = pd.read_parquet(where / "reports" / "story" / "requests.parquet")
    served = records[records["error_category"] != "context_length"]  # refused by max_model_len, as predicted
    if (served["status"] != "ok").any():
        raise RuntimeError(f"requests that did not finish: {served['status'].value_counts().to_dict()}")
    span = served["finished_at"].max() - records["sent_at"].min()
    return float(len(served) / span), len(served)


if __name__ == "__main__":
    sys.exit(main())
