"""Workloads from request logs: sessions, token counts, synthesized or redacted text, streaming write.

The pipeline is one pass: `formats` yields requests in log order; `_Sessions` groups them into
multi-turn sessions; sessions that can no longer grow are finished in batches (token counts with
`count_batch`, text synthesis) and written in start order to the sessions JSONL; a 48-byte row
per request is kept for the statistics. `source_table` runs the same pass without writing.

Session grouping: a chat request whose messages are an earlier request's messages, that
request's assistant reply, then at least one new message, is that session's next turn. Lookups
use a hash of the message prefix, so grouping is O(total message length). Memory is the open
sessions: a session closes when no request continued it for `session_gap_s` of log time, or when
more than `max_open_sessions` are open (the least recently active closes); a request that
continues a closed session starts a new session whose first turn carries the history.
"""

from __future__ import annotations

import gc
import math
import os
import time
from array import array
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import BinaryIO, TextIO

import numpy as np
import orjson
import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, NonNegativeInt, PositiveFloat, PositiveInt

from llmload.models import ChatTemplate, ReusablePrefix, WorkloadSource, WorkloadSpec, block_runs
from llmload.workload.distributions import Distribution
from llmload.workload.files import WorkloadError
from llmload.workload.formats import FORMAT_NAMES, Issue, LogRequest, detect_format, format_named, read_log
from llmload.workload.prefix import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_CHAT_TEMPLATE,
    NO_TEXT,
    ConversationCodes,
    PrefixBlocks,
    PromptLayout,
)
from llmload.workload.stats import WorkloadStats, table_frame, workload_stats
from llmload.workload.synth import TextSynthesizer, draw_tokens
from llmload.workload.tokens import Tokenizer, TokenizerError, get_tokenizer

PROGRESS_EVERY = 100_000
_FINISH_BATCH = 512
_TEXT_CACHE = 16_384  # texts drawn again only when a key comes back after this many others
_KEY_SPAN = 2**64  # a key is non-negative: a redacted message's hash modulo this
_ISSUES_KEPT = 1_000


class BuildOptions(BaseModel):
    """How a log becomes a workload (the `llmload workload build` flags)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: str | None = None
    tokenizer: str = "cl100k_base"
    redact: bool = False
    skip_bad: bool = False
    session_gap_s: PositiveFloat = 600.0
    max_open_sessions: PositiveInt = 100_000
    seed: NonNegativeInt = 0
    model: str | None = None
    block_size: PositiveInt = DEFAULT_BLOCK_SIZE
    """Tokens per block of the reusable-prefix figure (llmload/workload/prefix.py)."""
    chat_template: ChatTemplate = DEFAULT_CHAT_TEMPLATE
    """How the reusable-prefix figure renders a log's messages into prompts."""
    output_tokens: Distribution | None = None
    """Where a request has no output length (no reply, output_tokens or max_tokens), its length is
    drawn from this; without it `build_workload` refuses such a log (the replay would be unbounded)."""


class BuildError(WorkloadError):
    """Bad lines in the sources (without --skip-bad): nothing was written."""

    def __init__(self, issues: list[Issue], by_kind: Counter[str]) -> None:
        total = sum(by_kind.values())
        if total == 1:  # one line says it all
            super().__init__(f"{issues[0].where}: {issues[0].reason}; nothing written (--skip-bad skips bad lines)")
        else:
            super().__init__(f"{total:,} bad line(s) in the sources; nothing written (--skip-bad skips them)")
        self.issues = issues
        self.by_kind = by_kind
        for issue in issues if total > 1 else ():  # printed before the message: each bad line as file:line
            self.add_note(f"{issue.where}: {issue.reason}")
        if total > len(issues):
            self.add_note(f"... and {total - len(issues):,} more")


@dataclass
class LogTable:
    """A log read once: its request table and what was skipped (bad) or ignored (not requests)."""

    table: pd.DataFrame
    format: str
    sessions: int
    skipped: Counter[str]
    ignored: Counter[str]
    think_times: str | None = None
    reusable_prefix: ReusablePrefix | str | None = None
    """The reusable-prefix figure, or why the log has none."""
    unbounded: int = 0
    """Requests with no output length (no reply, output_tokens or max_tokens), drawn or not."""
    drawn: bool = False
    """Their lengths were drawn from `BuildOptions.output_tokens`."""


@dataclass
class BuildResult:
    """What `build_workload` wrote: the spec (at `path`), its statistics, and how the log read."""

    spec: WorkloadSpec
    path: Path
    stats: WorkloadStats
    log: LogTable


# --------------------------------------------------------------------------- sessions


Key = int | str
"""A message-prefix hash (Python's 64-bit `hash`, chained message by message), or a conversation id."""


@dataclass(slots=True, eq=False)
class _Open:
    """A session being assembled: its turns are requests holding only their new messages."""

    index: int
    turns: list[LogRequest]
    n_messages: int = 0
    keys: tuple[Key, ...] = ()
    last_seen: float | None = None
    closed: bool = False
    id: str = ""  # the session's id: the log's own name for it (a ShareGPT id, an agent's) where it has one


class _Sessions:
    """Groups requests into sessions and hands back closed sessions in start order.

    Each session's id is given as it starts, so an agentic trace's links name the parts a gap split its
    sessions into (the log names an agent or subagent, never its parts): a subagent's `parent` is the part
    whose request spawns it, a `spawns` its first part, a `waits_for` its latest part, all of whose requests
    come before the request that joins it."""

    def __init__(self, name: str, gap_s: float, max_open: int) -> None:
        self._name = name
        self._gap_s = gap_s
        self._max_open = max_open
        self._by_key: dict[Key, list[_Open]] = {}
        self._active: dict[int, _Open] = {}  # by last activity, oldest first
        self._started: deque[_Open] = deque()
        self._taken: set[str] = set()
        self._first_part: dict[str, str] = {}  # a subagent spawned, not yet started: its first part's id
        self._spawner: dict[str, str] = {}  # a subagent: the id of the part whose request spawns it
        self._latest_part: dict[str, str] = {}  # a subagent: the id of its latest part
        self.count = 0

    def add(self, request: LogRequest) -> None:
        if request.timestamp is not None:
            self._expire(request.timestamp)
        if request.parent is not None and request.label is not None:
            request.parent = self._spawner.get(request.label, request.parent)
        request.waits_for = tuple(self._latest_part.get(name, name) for name in request.waits_for)
        messages = request.messages
        if messages is None and request.session is None:  # length-only trace: a session of its own
            self._close(self._start(request))
            return
        # an explicit conversation (ShareGPT, an agent's): the reply follows the last request
        if request.session is not None:
            keys: tuple[Key, ...] = (request.session,)
            found = self._take(request.session)
            split = found.n_messages if found is not None else None
        else:
            assert messages is not None
            found, split, keys = self._match(messages, request.reply)
        if found is None or split is None:
            found = self._start(request)
        else:
            if messages is not None:  # the reply, then this request's new messages
                previous = found.turns[-1]
                if previous.reply is None:
                    previous.reply = messages[split]["content"]
                request.messages = messages[split + 1 :]
            found.turns.append(request)
            del self._active[found.index]
            self._active[found.index] = found
        if request.spawns:
            request.spawns = tuple(self._spawn(name, found) for name in request.spawns)
        found.n_messages = len(messages or ())
        found.last_seen = request.timestamp
        found.keys = keys
        for key in keys:
            self._by_key.setdefault(key, []).append(found)
        if request.last:
            self._close(found)
        while len(self._active) > self._max_open:
            self._close(next(iter(self._active.values())))

    def _match(
        self, messages: list[dict[str, str]], reply: str | None
    ) -> tuple[_Open | None, int | None, tuple[Key, ...]]:
        """(the open session this request continues, its reply's index, the keys to find this request by).

        A reply can sit at any assistant message but the first and last; the prefix hashes before
        and after each are taken in one pass. A 64-bit hash collision between two open sessions
        (odds ~1e-8 in a million-session log) would merge them.
        """
        prefix = 0
        last = len(messages) - 1
        candidates: list[tuple[int, int, int]] = []
        for index, message in enumerate(messages):
            role = message["role"]
            before = prefix
            prefix = hash((prefix, role, message["content"]))
            if role == "assistant" and 0 < index < last:
                candidates.append((index, before, prefix))
        keys: tuple[Key, ...] = (prefix,)
        if reply is not None:
            keys = (hash((prefix, "assistant", reply)), prefix)
        for index, before, after in reversed(candidates):
            # registered with its reply known (exact), else without (the log had no response)
            found = self._take(after) or self._take(before)
            if found is not None:
                return found, index, keys
        return None, None, keys

    def _take(self, key: Key) -> _Open | None:
        waiting = self._by_key.get(key)
        if not waiting:
            return None
        found = waiting[0]  # identical histories: the longest-waiting session continues first
        self._unregister(found)
        return found

    def _unregister(self, session: _Open) -> None:
        for key in session.keys:
            waiting = self._by_key.get(key)
            if waiting is not None:
                waiting.remove(session)
                if not waiting:
                    del self._by_key[key]
        session.keys = ()

    def _spawn(self, name: str, spawner: _Open) -> str:
        """The id of subagent `name`'s first part, given when `spawner`'s request spawns it."""
        self._spawner[name] = spawner.id
        self._first_part[name] = self._unique(name)
        return self._first_part[name]

    def _unique(self, base: str) -> str:
        """`base`, made unique with `#n` when taken (a log that repeats a name, or a part a gap split off)."""
        unique, n = base, 1
        while unique in self._taken:
            n += 1
            unique = f"{base}#{n}"
        self._taken.add(unique)
        return unique

    def _start(self, request: LogRequest) -> _Open:
        session = _Open(self.count, [request], last_seen=request.timestamp)
        label = request.label
        if label is not None and label in self._first_part:
            session.id = self._first_part.pop(label)
        else:
            session.id = self._unique(label if label is not None else _session_id(self._name, self.count))
        if request.parent is not None and label is not None:
            self._latest_part[label] = session.id
        self.count += 1
        self._active[session.index] = session
        self._started.append(session)
        return session

    def _close(self, session: _Open) -> None:
        self._unregister(session)
        self._active.pop(session.index, None)
        session.closed = True

    def _expire(self, now: float) -> None:
        while self._active:
            oldest = next(iter(self._active.values()))
            if oldest.last_seen is None or oldest.last_seen >= now - self._gap_s:
                return
            self._close(oldest)

    def close_all(self) -> None:
        for session in list(self._active.values()):
            self._close(session)

    def ready(self) -> Iterator[_Open]:
        """Closed sessions at the head of start order (the output keeps the source's order)."""
        while self._started and self._started[0].closed:
            yield self._started.popleft()


# --------------------------------------------------------------------------- finishing


@dataclass
class _Table:
    """The request table's columns, kept compact (48 bytes a request) while the build streams."""

    session: array[int] = field(default_factory=lambda: array("q"))
    turn: array[int] = field(default_factory=lambda: array("q"))
    arrival: array[float] = field(default_factory=lambda: array("d"))
    think: array[float] = field(default_factory=lambda: array("d"))
    prompt: array[int] = field(default_factory=lambda: array("q"))
    output: array[float] = field(default_factory=lambda: array("d"))
    max_tokens: array[float] = field(default_factory=lambda: array("d"))

    def frame(self, ids: Sequence[str]) -> pd.DataFrame:
        def column(values: array[int] | array[float]) -> np.ndarray:
            return np.frombuffer(values, dtype=np.int64 if values.typecode == "q" else np.float64)

        names = np.array(ids, dtype=object)
        return table_frame(
            {
                "session_id": names[column(self.session)],  # one string per session, shared by its requests
                "turn": column(self.turn),
                "arrival_s": column(self.arrival),
                "think_s": column(self.think),
                "prompt_tokens": column(self.prompt),
                "output_tokens": column(self.output),
                "max_tokens": column(self.max_tokens),
            }
        )


def _session_id(name: str, index: int) -> str:
    return f"{name}-{index:06d}"


Record = dict[str, object]
"""A session line, shaped as `models.Session` (the tests load every built file with the strict loader).
Built as plain dicts: validating a million sessions with pydantic would double the build time, and
every value is checked where the log is read."""


class _Finisher:
    """Closed sessions to session lines: token counts, synthesized or redacted text, table rows."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        prefix: PrefixBlocks,
        layout: PromptLayout,
        *,
        write: bool,
        redact: bool,
        seed: int,
        fill: Distribution | None = None,
    ) -> None:
        self.prefix = prefix
        self.layout = layout
        self.tokenizer = tokenizer
        self.write = write
        self.redact = redact
        self.seed = seed
        self.table = _Table()
        self.ids: list[str] = []  # each session's id, in session order: the log's own name where it has one
        self._conversations = ConversationCodes()
        self.prefix_conversations = array("q")  # the conversation of each request the prefix figure holds
        self.t0: float | None = None
        self.think_basis: Counter[str] = Counter()  # follow-up turns by how their think time was found
        self.fill = fill
        self._fill_rng = np.random.default_rng([seed, 2])
        self.unbounded = 0  # requests without an output length or max_tokens (drawn when `fill` is given)

    @cached_property
    def _synth(self) -> TextSynthesizer:
        return TextSynthesizer(self.tokenizer, self.seed)

    @cached_property
    def _keyed_text(self) -> Callable[[tuple[int, ...], int], str]:
        """A redacted message's text, a function of its content alone (the same message gets the same
        text however far apart it comes); the cache only saves drawing it again."""
        return lru_cache(maxsize=_TEXT_CACHE)(self._synth.keyed_text)

    @cached_property
    def _template_tokens(self) -> int:
        """What the chat template adds to one user message (0 without a template)."""
        return self.tokenizer.count_chat([{"role": "user", "content": ""}])

    def finish(self, batch: Sequence[_Open]) -> list[Record]:
        counts = self._counts(batch)
        records = []
        for session in batch:
            first_row = len(self.table.turn)
            record = self._session(session, counts)
            self._add_prefix(session, first_row)
            if record is not None:
                records.append(record)
        return records

    def _add_prefix(self, session: _Open, first_row: int) -> None:
        """The session's blocks for the reusable-prefix figure: from hash ids, else from message text."""
        arrivals = self.table.arrival[first_row:]
        if session.turns[0].hash_ids is not None or session.turns[0].messages is not None:
            self.prefix_conversations.extend([self._conversations.code(self.ids[-1])] * len(session.turns))
        if session.turns[0].hash_ids is not None:
            requests = [
                (index, () if r.hash_ids is None else r.hash_ids, r.prompt_tokens or 0)
                for index, r in enumerate(session.turns)
            ]
            self.prefix.add_hashed_session(requests, arrivals[: len(requests)], owner=len(self.ids) - 1)
            return
        if session.turns[0].messages is None:
            return  # lengths only: nothing to cut blocks from
        replies = self.table.output[first_row:]
        turns = [
            (
                self.layout.turn((m["role"], m["content"]) for m in request.messages or ()),
                0 if math.isnan(reply) else int(reply),
            )
            for request, reply in zip(session.turns, replies, strict=True)
        ]
        self.prefix.add_session(turns, arrivals, self.layout.reply_end)

    def _counts(self, batch: Sequence[_Open]) -> Iterator[int]:
        """Content token counts of each turn's new messages then reply (all turns in order), when needed."""
        turns = [t for o in batch for t in o.turns if t.messages is not None]
        needed = self.redact or any(
            t.prompt_tokens is None or (t.output_tokens is None and t.reply is not None) for t in turns
        )
        if not needed:
            return iter(())
        texts = [text for t in turns for text in (*(m["content"] for m in t.messages or ()), t.reply or "")]
        return iter(self.tokenizer.count_batch(texts))

    def _session(self, session: _Open, counts: Iterator[int]) -> Record | None:
        self.ids.append(session.id)
        turns: list[Record] = []
        history: list[dict[str, str]] = []  # for templated counting only
        templated = self.tokenizer.templated
        prompt = previous_reply = 0
        first = session.turns[0].timestamp
        previous_ts: float | None = None
        previous_end: float | None = None
        if first is not None and self.t0 is None:
            self.t0 = first
        offset = None if first is None or self.t0 is None else max(0.0, first - self.t0)
        for index, request in enumerate(session.turns):
            messages = request.messages or []
            message_counts = [next(counts, 0) for _ in messages]
            reply_count = next(counts, 0) if request.messages is not None else 0
            if templated:
                history += messages
            if request.prompt_tokens is not None:
                prompt = request.prompt_tokens
            elif templated:
                try:
                    prompt = self.tokenizer.count_chat(history)
                except TokenizerError as exc:
                    raise WorkloadError(f"{request.where}: {exc}") from None
            else:  # content-only counting is additive: the history is not counted again
                prompt = (prompt + previous_reply if index else 0) + sum(message_counts)
            if templated and request.reply is not None:
                history.append({"role": "assistant", "content": request.reply})
            output = request.output_tokens
            if output is None and request.reply is not None:
                output = reply_count
            if not output and request.max_tokens is None:  # replayed as is, the server would not stop
                self.unbounded += 1
                if self.fill is not None:
                    output = draw_tokens(self.fill, self._fill_rng, 1)[0]
            previous_reply = reply_count
            think = request.think_s or 0.0
            if request.think_s is None and previous_ts is not None and request.timestamp is not None:
                # the log's gap holds the previous reply's duration too: take it out where the log says
                start = previous_end if previous_end is not None else previous_ts
                think = max(0.0, request.timestamp - start)
                self.think_basis["after_reply" if previous_end is not None else "with_reply"] += 1
            previous_ts, previous_end = request.timestamp, request.finished
            sent = request.timestamp
            at = max(0.0, sent - first) if index and first is not None and sent is not None else None
            self._row(session.index, index, offset=offset, at=at, think=think, prompt=prompt, output=output,
                      limit=request.max_tokens)  # fmt: skip
            if self.write:
                turns.append(self._turn(request, message_counts, output=output, think=think, at=at, prompt=prompt))
        if not self.write:
            return None
        record: Record = {"id": self.ids[-1]}
        if offset is not None:
            record["offset_s"] = offset
        if session.turns[0].parent is not None:
            record["parent"] = session.turns[0].parent
        record["turns"] = turns
        return record

    def _turn(
        self,
        request: LogRequest,
        message_counts: list[int],
        *,
        output: int | None,
        think: float,
        at: float | None,
        prompt: int,
    ) -> Record:
        """The turn as the sessions file holds it: block ids where the log gives them, else messages."""
        turn: Record = (
            {"blocks": block_runs(request.hash_ids)}  # a few runs where a session's ids go on
            if request.hash_ids is not None and len(request.hash_ids)
            else {"messages": self._messages(request, message_counts)}
        )
        if request.max_tokens is not None:
            turn["max_tokens"] = request.max_tokens
        if output:
            turn["output_tokens"] = output
        turn["think_time_s"] = think
        if at is not None:
            turn["at_s"] = at
        if prompt:
            turn["prompt_tokens"] = prompt
        if request.model_rank is not None:
            turn["model_rank"] = request.model_rank
        if request.waits_for:
            turn["waits_for"] = list(request.waits_for)
        if request.spawns:
            turn["spawns"] = list(request.spawns)
        return turn

    def _row(
        self,
        session: int,
        turn: int,
        *,
        offset: float | None,
        at: float | None,
        think: float,
        prompt: int,
        output: int | None,
        limit: int | None,
    ) -> None:
        """One request's row, timed as `request_table` times the turn the build writes: its recorded time
        (`at`, after the session's first request) where the log gives one, else the previous request's plus
        the think time; no time and no think time where the session's start is unknown."""
        table = self.table
        if offset is None:
            arrival = pause = math.nan
        else:
            arrival = offset if turn == 0 else offset + at if at is not None else table.arrival[-1] + think
            pause = math.nan if turn == 0 else think
        table.session.append(session)
        table.turn.append(turn)
        table.arrival.append(arrival)
        table.think.append(pause)
        table.prompt.append(prompt)
        table.output.append(output or math.nan)  # 0 tokens cannot be replayed: unknown
        table.max_tokens.append(math.nan if limit is None else limit)

    def _messages(self, request: LogRequest, counts: list[int]) -> list[dict[str, str]]:
        if request.messages is None:
            return [{"role": "user", "content": self._length_only_text(request)}]
        if not self.redact:
            return request.messages
        return [
            {"role": m["role"], "content": self._keyed_text((hash(m["content"]) % _KEY_SPAN,), n)}
            for m, n in zip(request.messages, counts, strict=True)
        ]

    def _length_only_text(self, request: LogRequest) -> str:
        """Text whose chat prompt has the log's length (a log of lengths without hash ids)."""
        return self._synth.text(max(1, (request.prompt_tokens or 1) - self._template_tokens))


# --------------------------------------------------------------------------- the pass


def _format(sources: Sequence[Path], given: str | None) -> str:
    if given is not None:
        if given not in FORMAT_NAMES:
            raise WorkloadError(f"unknown format {given!r}: one of {', '.join(FORMAT_NAMES)}")
        return given
    found = {path: detect_format(path) for path in sources}
    if len(set(found.values())) > 1:
        listing = ", ".join(f"{p}: {f}" for p, f in found.items())
        raise WorkloadError(f"the sources have different formats ({listing}); build them separately")
    return next(iter(found.values()))


@contextmanager
def _without_cyclic_gc() -> Iterator[None]:
    """The pass allocates millions of objects in no reference cycles; the cyclic collector's full
    sweeps over the open sessions would cost a third of the build time. Refcounting frees them."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _source_files(sources: Sequence[Path]) -> list[Path]:
    """The files to read: each source given, a directory's `*.json` files in name order (a trace set)."""
    files = []
    for source in sources:
        found = sorted(source.glob("*.json")) if source.is_dir() else [source]
        if not found:
            raise WorkloadError(f"{source}: a directory with no *.json file to read")
        files += found
    for path in files:
        if not path.is_file():
            raise WorkloadError(f"{path}: no such file")
    if not files:
        raise WorkloadError("no source files")
    return files


def _run(
    sources: Sequence[Path],
    options: BuildOptions,
    name: str,
    *,
    out: BinaryIO | None = None,
    progress: TextIO | None = None,
) -> LogTable:
    """Read, group and finish every request; finished sessions go to `out` as JSONL when given."""
    sources = _source_files(sources)
    fmt = _format(sources, options.format)
    hashed = format_named(fmt).hash_block_tokens
    try:
        tokenizer = get_tokenizer(options.tokenizer)
    except TokenizerError as exc:
        raise WorkloadError(str(exc)) from None
    prefix = (
        PrefixBlocks.from_hash_ids(hashed)
        if hashed is not None
        else PrefixBlocks.from_text(options.block_size, options.tokenizer, options.chat_template)
    )
    layout = PromptLayout(options.tokenizer, options.chat_template)
    finisher = _Finisher(
        tokenizer, prefix, layout, write=out is not None, redact=options.redact, seed=options.seed,
        fill=options.output_tokens,
    )  # fmt: skip
    sessions = _Sessions(name, options.session_gap_s, options.max_open_sessions)
    issues: list[Issue] = []
    skipped: Counter[str] = Counter()
    ignored: Counter[str] = Counter()
    batch: list[_Open] = []
    seen = 0
    started = time.perf_counter()

    def flush(force: bool) -> None:
        batch.extend(sessions.ready())
        while len(batch) >= _FINISH_BATCH or (force and batch):
            chunk = batch[:_FINISH_BATCH]
            del batch[:_FINISH_BATCH]
            if options.skip_bad or not skipped:  # a failing build only goes on to report every bad line
                finished = finisher.finish(chunk)
                if out is not None:
                    out.writelines(
                        orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n" for record in finished
                    )

    with _without_cyclic_gc():
        for path in sources:
            for item in read_log(path, fmt)[1]:
                if isinstance(item, Issue):
                    if not item.fatal:
                        ignored[item.kind] += 1
                        continue
                    skipped[item.kind] += 1
                    if len(issues) < _ISSUES_KEPT:
                        issues.append(item)
                    continue
                sessions.add(item)
                seen += 1
                flush(force=False)
                if progress is not None and seen % PROGRESS_EVERY == 0:
                    rate = seen / (time.perf_counter() - started)
                    print(f"  {seen:,} requests, {sessions.count:,} sessions ({rate:,.0f} requests/s)", file=progress)
        sessions.close_all()
        flush(force=True)
    if skipped and not options.skip_bad:
        raise BuildError(issues, skipped)
    if not seen:
        raise WorkloadError(f"no requests in {', '.join(map(str, sources))}")
    table = finisher.table.frame(finisher.ids)
    conversations = np.frombuffer(finisher.prefix_conversations, np.int64)
    reuse = prefix.result(conversations=conversations) if prefix.requests else NO_TEXT
    return LogTable(
        table, fmt, sessions.count, skipped, ignored, think_time_note(finisher.think_basis), reuse,
        unbounded=finisher.unbounded, drawn=options.output_tokens is not None,
    )  # fmt: skip


def think_time_note(basis: Counter[str]) -> str | None:
    """What `workload stats` says of think times: measured from the reply's end, or holding it."""
    after, within = basis["after_reply"], basis["with_reply"]
    if not after and not within:
        return None
    if not within:
        return f"measured from the end of the previous reply ({after:,} follow-up turns; the log gives response times)"
    return (
        f"for {within:,} of {after + within:,} follow-up turns, the gap between requests, which includes the"
        " previous reply's duration: the log gives no response time (response_timestamp or latency_ms), so"
        " replay, which waits for the reply and then the think time, paces those sessions slower than logged"
    )


def source_table(sources: Sequence[Path | str], options: BuildOptions | None = None) -> LogTable:
    """The request table of logs, read as `build_workload` reads them (nothing is synthesized or written)."""
    return _run([Path(s) for s in sources], options or BuildOptions(), "source")


def build_workload(
    sources: Sequence[Path | str],
    output: Path | str,
    options: BuildOptions | None = None,
    *,
    progress: TextIO | None = None,
) -> BuildResult:
    """Write `output` (YAML) and its sessions JSONL from logs; on failure nothing is written.

    `progress` gets a line every 100,000 requests (the CLI passes stderr)."""
    options = options or BuildOptions()
    output = Path(output)
    name = output.name.removesuffix(".yaml").removesuffix(".yml")
    sessions_path = output.parent / f"{name}.sessions.jsonl"
    partial = sessions_path.with_name(f".{sessions_path.name}.{os.getpid()}.partial")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        handle = partial.open("wb")
    except OSError as exc:
        raise WorkloadError(f"{output}: cannot write: {exc.strerror or exc}") from None
    try:
        with handle as out:
            log = _run([Path(s) for s in sources], options, name, out=out, progress=progress)
        if log.unbounded and not log.drawn:
            raise WorkloadError(
                f"{log.unbounded:,} of {len(log.table):,} requests in {', '.join(map(str, sources))} have no output"
                " length (no reply, output_tokens or max_tokens), so a server would generate up to max_model_len"
                " for each: give --output-tokens DISTRIBUTION (e.g. lognormal:median=160,sigma=0.7) to draw theirs"
            )
        stats = workload_stats(log.table, think_times=log.think_times, reusable_prefix=log.reusable_prefix)
        spec = WorkloadSpec(
            version=1,
            name=name,
            source=WorkloadSource(
                files=[str(s) for s in sources],
                format=log.format,
                built_at=datetime.now(UTC).replace(microsecond=0),
                generator={
                    "redacted": options.redact,
                    "skipped_lines": dict(log.skipped),
                    "session_gap_s": options.session_gap_s,
                    **(
                        {"output_tokens_drawn": log.unbounded, "output_tokens": options.output_tokens.model_dump()}
                        if log.unbounded and options.output_tokens is not None
                        else {}
                    ),
                },
            ),
            tokenizer=options.tokenizer,
            model=options.model,
            target_qps=stats.requests_per_s or None,
            sessions=sessions_path.name,
            block_size=format_named(log.format).hash_block_tokens,
            stats=stats.model_dump(mode="json"),
        )
        os.replace(partial, sessions_path)
    finally:
        partial.unlink(missing_ok=True)
    # The YAML as files.save_workload writes it (which wants every session in memory at once).
    output.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False))
    return BuildResult(spec, output, stats, log)
