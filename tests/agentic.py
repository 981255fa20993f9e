"""Small agentic traces in kv-cache-tester's format (`workload build --format weka`): a main agent whose
prompt grows by a tool result a turn, and a subagent (on another model) that opens with the parent's first
blocks and that the agent's next request joins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson


def write_agentic_traces(directory: Path, *, traces: int = 3, opening_blocks: int = 2, seed: int = 4) -> Path:
    """`traces` traces of six 64-token-block requests each (the first `opening_blocks` blocks shared by
    the agent's requests and its subagent's), written as t0.json, t1.json, ... in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for number in range(traces):
        ids = list(range(1, opening_blocks + 1))
        next_id, requests = opening_blocks + 1, []
        for k in range(6):
            grown = int(rng.integers(1, 3))
            ids = [*ids, *range(next_id, next_id + grown)]
            next_id += grown
            tokens = 64 * len(ids) + int(rng.integers(0, 64))
            requests.append({"t": 2.0 * k, "in": tokens, "out": 6, "hash_ids": ids, "api_time": 0.5, "think_time": 0.2,
                             "model": "opus"})  # fmt: skip
            if k == 2:
                sub = [*ids[:opening_blocks], next_id]
                next_id += 1
                requests.append({"t": 2.0 * k + 0.5, "type": "subagent", "agent_id": "agent_001", "requests": [
                    {"t": 0.0, "in": 64 * len(sub) + 10, "out": 6, "hash_ids": sub, "api_time": 0.5, "think_time": 0.0,
                     "model": "haiku"},
                    {"t": 3.0, "in": 64 * (len(sub) + 1) + 10, "out": 6, "hash_ids": [*sub, next_id], "api_time": 0.5,
                     "think_time": 0.2, "model": "haiku"},
                ]})  # fmt: skip
                next_id += 1
        trace = {"id": f"t{number}", "block_size": 64, "hash_id_scope": "local", "requests": requests}
        (directory / f"t{number}.json").write_bytes(orjson.dumps(trace))
    return directory


def write_compacting_traces(directory: Path, *, traces: int = 12, seed: int = 7) -> Path:
    """`traces` traces of 16 agent requests, each opening with the same two-block system prompt (global
    ids 1 and 2, as `hash_id_scope: global` gives them), whose agent compacts its context at request 9 (the
    prompt shrinks to the system prompt and a two-block summary, then grows again), and whose subagent,
    spawned after request 4 and joined by request 5, opens with the system prompt and the agent's first
    block. Every other id is the trace's own (number × 1000 + k)."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for number in range(traces):
        next_id = 1000 * (number + 1)
        ids, requests, at = [1, 2], [], 0.0
        for k in range(16):
            if k == 9:
                ids = [1, 2, next_id, next_id + 1]
                next_id += 2
            grown = int(rng.integers(1, 4 + number % 3))
            ids = [*ids, *range(next_id, next_id + grown)]
            next_id += grown
            at += float(rng.integers(2, 30))
            requests.append({"t": at, "in": 64 * len(ids) + int(rng.integers(0, 64)), "out": int(rng.integers(5, 400)),
                             "hash_ids": ids, "api_time": 1.0, "think_time": 1.0})  # fmt: skip
            if k == 4:
                sub = [1, 2, ids[2], next_id]
                next_id += 1
                requests.append({"t": at + 1.5, "type": "subagent", "agent_id": "agent_001", "requests": [
                    {"t": 0.0, "in": 64 * len(sub) + 5, "out": 20, "hash_ids": sub, "api_time": 0.5, "think_time": 0.0},
                    {"t": 2.0, "in": 64 * (len(sub) + 1) + 5, "out": 20, "hash_ids": [*sub, next_id],
                     "api_time": 0.5, "think_time": 0.5},
                ]})  # fmt: skip
                next_id += 1
        trace = {"id": f"c{number}", "block_size": 64, "hash_id_scope": "global", "requests": requests}
        (directory / f"c{number:02d}.json").write_bytes(orjson.dumps(trace))
    return directory
