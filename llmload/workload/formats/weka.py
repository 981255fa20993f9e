"""`weka`: agentic coding traces as the kv-cache-tester corpus writes them (one JSON object a trace:
`block_size`, `hash_id_scope`, `requests` of `t`, `in`, `out`, `hash_ids`, `think_time`, `api_time`,
and `type: "subagent"` entries that nest their own `requests`). Lengths and prefix blocks only.

The main agent is a session, named by the trace's `id`; each subagent is a session of its own,
`{id}/{agent_id}`, starting at its entry's `t`, and the agent's next request waits for it (a subagent
after the agent's last request runs in the background). Each request keeps the rank of its model in
the trace (`_models`), which the run maps onto its `--model`s. A request's `finished` is `t + api_time`, so the
builder takes the recorded think time out of the gap, not the recorded server's speed. A request
that answered nothing (`out` 0: cut off) is sent for one token, its prefill being what it cost. Ids of a
`local` scope are the trace's own: they are put in a namespace of the trace, so two traces' id 1 are
two blocks; `global` ids are kept, shared between traces.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from llmload.workload.formats.common import BadLine, Head, Issue, LogFormat, LogRequest, Parsed, integer

WEKA_BLOCK_TOKENS = 64
_LOCAL_ID_BITS = 31  # a local id below 2^31, under a 32-bit namespace of its trace


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadLine(f"bad {what}: {value!r} is not a number of seconds")
    return float(value)


def _ids(value: object, namespace: int | None, length: int, at: str) -> np.ndarray:
    if not isinstance(value, list) or not all(isinstance(h, int) and not isinstance(h, bool) for h in value):
        raise BadLine(f"bad {at}.hash_ids: not a list of integers")
    if len(value) not in (length // WEKA_BLOCK_TOKENS, -(-length // WEKA_BLOCK_TOKENS)):
        raise BadLine(f"bad {at}.hash_ids: {len(value)} blocks for in {length} ({WEKA_BLOCK_TOKENS} tokens per block)")
    if namespace is None:
        return np.asarray(value, dtype=np.int64)
    if any(h < 0 or h >= 1 << _LOCAL_ID_BITS for h in value):
        raise BadLine(f"bad {at}.hash_ids: a local id outside [0, 2^{_LOCAL_ID_BITS})")
    return np.asarray(value, dtype=np.int64) | np.int64(namespace << _LOCAL_ID_BITS)


def _model(entry: dict[str, object]) -> str | None:
    model = entry.get("model")
    return model if isinstance(model, str) else None


def _models(entries: object) -> dict[str | None, int]:
    """The trace's models ranked: its main agent's first (else its first subagent's), then the others in
    the order the file first uses them, as AIPerf maps a trace onto its `--model`s."""
    ranked: dict[str | None, int] = {}

    def walk(entries: object, depth: int) -> Iterator[tuple[int, str | None]]:
        for entry in entries if isinstance(entries, list) else ():
            if isinstance(entry, dict) and entry.get("type") == "subagent":
                yield from walk(entry.get("requests"), depth + 1)
            elif isinstance(entry, dict):
                yield depth, _model(entry)

    used = list(walk(entries, 0))
    main = [model for depth, model in used if depth == 0] or [model for _, model in used]
    for model in main[:1] + [model for _, model in used]:
        ranked.setdefault(model, len(ranked))
    return ranked


@dataclass(frozen=True)
class _Trace:
    """What every request of one trace file is read with: its id namespace and its models' ranks."""

    namespace: int | None
    models: dict[str | None, int]


def _requests(
    where: str,
    entries: object,
    session: str,
    start: float,
    trace: _Trace,
    *,
    parent: str | None = None,
    spawned_at: float | None = None,
) -> Iterator[LogRequest]:
    """One agent's requests, then each of its subagents' where their entry stands. The agent's request
    before a subagent's entry spawns it (the subagent's first request follows that reply by the recorded
    gap: `spawned_at` is when it came back), and its next request joins it; a subagent after the agent's
    last request runs on its own."""
    if not isinstance(entries, list):
        raise BadLine(f"{where}: requests is not a list")
    kinds = [isinstance(e, dict) and e.get("type") == "subagent" for e in entries]
    own = [i for i, subagent in enumerate(kinds) if not subagent]
    spawned: list[str] = []
    spawner_back: float | None = None  # when the agent's last request came back, on the trace's clock
    for index, entry in enumerate(entries):
        at = f"{where}.requests[{index}]"
        if not isinstance(entry, dict):
            raise BadLine(f"{at}: not an object")
        t = start + _number(entry.get("t"), f"{at}.t")
        if kinds[index]:
            child = _child(session, entry, at)
            spawned.append(child)
            yield from _requests(at, entry.get("requests"), child, t, trace, parent=session, spawned_at=spawner_back)
            continue
        length = integer(entry.get("in"), f"{at}.in", minimum=1)
        api = entry.get("api_time")
        finished = None if api is None else t + _number(api, f"{at}.api_time")
        following = list(itertools.takewhile(lambda k: kinds[k], range(index + 1, len(entries))))
        yield LogRequest(
            where=at,
            timestamp=t,
            finished=finished,
            prompt_tokens=length,
            output_tokens=max(1, integer(entry.get("out"), f"{at}.out")),  # out 0 (cut off): its prefill, 1 token
            session=session,
            label=session,
            last=index == own[-1],
            hash_ids=_ids(entry.get("hash_ids"), trace.namespace, length, at),
            parent=parent,
            waits_for=tuple(spawned),
            spawns=tuple(_child(session, entries[k], f"{where}.requests[{k}]") for k in following),
            think_s=None if index != own[0] or spawned_at is None else max(0.0, t - spawned_at),
            model_rank=trace.models[_model(entry)],
        )
        spawned, spawner_back = [], finished if finished is not None else t


def _child(session: str, entry: object, at: str) -> str:
    """A subagent entry's session id."""
    agent = entry.get("agent_id") if isinstance(entry, dict) else None
    if not isinstance(agent, str) or not agent:
        raise BadLine(f"{at}: a subagent without an agent_id")
    return f"{session}/{agent}"


def parse_weka(path: Path) -> Iterator[Parsed]:
    """One trace file: its main agent's requests and its subagents', in file order."""
    try:
        trace = orjson.loads(path.read_bytes())
        if not isinstance(trace, dict):
            raise BadLine("not a JSON object")
        name = trace.get("id")
        if not isinstance(name, str) or not name:
            raise BadLine("no trace id")
        if trace.get("block_size") != WEKA_BLOCK_TOKENS:
            raise BadLine(
                f"block_size {trace.get('block_size')!r}: llmload reads traces of {WEKA_BLOCK_TOKENS}-token blocks"
            )
        scope = trace.get("hash_id_scope", "local")
        if scope not in ("local", "global"):
            raise BadLine(f"bad hash_id_scope {scope!r}: local or global")
        namespace = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=4).digest()) if scope == "local" else None
        requests = trace.get("requests")
        yield from _requests(path.name, requests, name, 0.0, _Trace(namespace, _models(requests)))
    except orjson.JSONDecodeError as exc:
        yield Issue(str(path), f"not valid JSON: {exc}")
    except BadLine as exc:
        yield Issue(str(path), str(exc))


def _sniff(head: Head) -> bool:
    """A JSON object with a trace's `block_size` and `requests`."""
    return head.record is not None and "block_size" in head.record and "requests" in head.record


FORMAT = LogFormat(
    name="weka",
    title="an agentic trace (kv-cache-tester's WEKA format)",
    sniff=_sniff,
    parse=parse_weka,
    hash_block_tokens=WEKA_BLOCK_TOKENS,
)
