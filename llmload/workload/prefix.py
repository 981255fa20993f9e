"""Reusable prefix: the share of prompt tokens an infinite prefix cache could serve.

Defined as vLLM's prefix cache keys its blocks, with no eviction:

- a prompt's tokens are cut into full blocks of `block_size`; a partial tail block never counts;
- block i's key is a hash of blocks 0..i, so a block matches only with its whole prefix;
- a request's reusable tokens are `block_size` × the number of its blocks whose key an earlier
  request (by arrival, ties in file order) already produced. Because keys are chained, those
  blocks are always a leading run;
- a reusable block is *history* when the earliest request that produced its key is in the same
  session, else *shared* (a system prompt, document or few-shot block another session sent first).

What a prompt is: its messages as a chat template renders them (`template`), tokenized by the
workload's tokenizer. Turn k's prompt is turn k-1's prompt, then turn k-1's reply, then turn k's
new messages. With `chatml` (the default, the simulator's template), a turn adds each new
message's `<|im_start|>{role}\n{text}<|im_end|>\n`, then the generation prompt
`<|im_start|>assistant\n`; a reply adds its tokens and the `<|im_end|>\n` that closes it (its
assistant message opened with the generation prompt, already in the stream). The template tokens
of earlier messages are prefix a server reuses, so they count; a model's own template differs by
a few tokens per message. With `none`, a prompt is its messages' content tokens alone. A workload
holds no reply text (the server writes it), so a reply is modelled as `output_tokens` tokens
unique to its request: never shared with another session, but history for the same session's
later turns. Each message (ChatML piece) is tokenized alone and the pieces laid end to end, as
the simulator tokenizes its prompts; for cl100k that equals tokenizing the whole prompt, as every
piece starts with `<|` and ends with a newline, which no pre-token spans.

How it is computed, for a million requests: each message is tokenized once, and a session's
turns are laid end to end as one token stream (a turn's prompt is a prefix of the next), so a
block is hashed once per session, not once per request. Block keys are prefix hashes: the
cumulative (wrapping uint64) sum of a 64-bit mix of (token, position), vectorised in numpy over
batches of sessions. The key of every block goes into int64 columns with the request that first
includes it in its session; one sort by (key, arrival) finds each key's first producer. Memory is
~16 bytes per (session, block) while collecting and ~60 during the final sort; no per-request
Python objects are kept. A 64-bit key collision (odds ~1e-7 in 10^12 block pairs) would count a
block as reusable.

Mooncake traces carry `hash_ids`, already one id per 512-token prefix block: they are used as the
blocks (block size 512, whatever `--block-size` says), chained again so that the same id at a
different prefix cannot match. Every Mooncake line is its own session, so its reuse counts as
shared; a trace with sessions (weka's agents, a built workload of `blocks` turns) counts a block its
own session sent before as history. Formats with neither text nor hashes (azure_trace) have no figure, and say why.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import get_args

import numpy as np
import pandas as pd

from llmload.models import REPLAY_SEPARATOR, ChatTemplate, ReusablePrefix, Session, ShareSpread, TurnReuse
from llmload.workload.cache_bust import marked, play_marker
from llmload.workload.files import Workload
from llmload.workload.formats.mooncake import MOONCAKE_BLOCK_TOKENS
from llmload.workload.stats import request_table
from llmload.workload.tokens import GENERATION_PROMPT, MESSAGE_END, chatml_message, get_tokenizer

DEFAULT_BLOCK_SIZE = 16
MIN_HITS_FOR_BLOCK = 20
CHAT_TEMPLATES: tuple[ChatTemplate, ...] = get_args(ChatTemplate)
DEFAULT_CHAT_TEMPLATE: ChatTemplate = "chatml"
NO_TEXT = "the log carries no text or hashes"
_FLUSH_UNITS = 1 << 21  # tokens hashed per numpy batch: ~100 MB of temporaries


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijective scramble of uint64 values (wrapping arithmetic)."""
    z = values + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class PrefixBlocks:
    """Collects the block keys of sessions (text) or of Mooncake lines (hash ids), then `result()`.

    Add sessions in any order; arrivals decide which request was first. `unit_tokens` is how many
    tokens one stream element stands for (512 for hash ids, 1 for tokens)."""

    def __init__(self, block_size: int, *, basis: str) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be positive, not {block_size}")
        self.block_size = block_size
        self.basis = basis
        self.chat_template: ChatTemplate | None = None  # None: blocks from hash ids
        self._unit_tokens = 1
        # per request, in insertion order (a session's turns are contiguous)
        self._session = array("q")  # the stream a request's blocks were hashed in (a session, or a hashed request)
        self._owner = array("q")  # the session it belongs to: a block it reuses from another is shared
        self._turn = array("q")
        self._arrival = array("d")
        self._prompt_tokens = array("q")
        self._prompt_blocks = array("q")
        self._cached_blocks = array("q")  # its session's blocks in the cache once it was served
        # per (session, block): its key and the request that first includes it
        self._keys = array("q")
        self._owners = array("q")
        # the batch being collected, hashed by `_flush`
        self._pieces: list[np.ndarray] = []
        self._piece_units = 0
        self._session_starts: list[int] = []
        self._cached_ends: list[int] = []
        self._sessions = 0
        self._replies = 0
        self._flushed_requests = 0

    @property
    def requests(self) -> int:
        return len(self._session)

    @classmethod
    def from_text(cls, block_size: int, tokenizer: str, template: ChatTemplate) -> PrefixBlocks:
        """Blocks of prompt tokens (`PromptLayout`'s; the tokenizer and template named for the basis)."""
        text = "ChatML prompts" if template == "chatml" else "message text"
        blocks = cls(block_size, basis=f"{text} ({tokenizer}), replies as unique tokens")
        blocks.chat_template = template
        return blocks

    @classmethod
    def from_hash_ids(cls, block_size: int = MOONCAKE_BLOCK_TOKENS) -> PrefixBlocks:
        """Blocks from a trace's hash ids (Mooncake's `hash_ids`, a workload's `blocks`): one element
        per `block_size`-token block."""
        blocks = cls(1, basis=f"the prompts' block ids ({block_size}-token blocks, as the trace's hash_ids)")
        blocks._unit_tokens = block_size
        return blocks

    def add_session(
        self, turns: Sequence[tuple[np.ndarray, int]], arrivals: np.ndarray | Sequence[float], reply_end: int = 0
    ) -> None:
        """One session: each turn's new tokens (int64, ids ≥ 0, `PromptLayout.turn`'s) and its reply's
        length; `reply_end` template tokens close each reply. A request also fills the cache with the
        blocks of its reply but the last token (sampled, never fed back), as vLLM caches decoded blocks."""
        if self._unit_tokens != 1:
            raise ValueError("a hash-id collection takes add_hashed_session, not add_session")
        self._session_starts.append(self._piece_units)
        length = 0
        for index, ((tokens, _), arrival) in enumerate(zip(turns, arrivals, strict=True)):
            if index:
                previous_reply = turns[index - 1][1]
                unique = previous_reply + reply_end
                if unique > 0:  # a token unique to that reply, repeated: shared by no other request
                    self._replies += 1
                    self._pieces.append(np.full(unique, -self._replies, dtype=np.int64))
                    length += unique
            self._pieces.append(np.asarray(tokens, dtype=np.int64))
            length += len(tokens)
            decoded = max(turns[index][1] - 1, 0) if index + 1 < len(turns) else 0
            self._add_request(index, arrival, length, length, (length + decoded) // self.block_size)
            self._cached_ends.append(self._piece_units + length + decoded)
        self._close_session(length)

    def add_hashed_session(
        self, requests: Sequence[tuple[int, Sequence[int] | np.ndarray, int]], arrivals: Sequence[float], owner: int
    ) -> None:
        """One session's requests given as (turn, their full blocks' hash ids, prompt tokens), in turn
        order (a Mooncake line is a session of one). `owner` numbers the session (unique per session): a
        block an earlier turn of it sent is history, one another session sent is shared. A request whose
        ids go on from the previous one's (the history grew) is hashed as the rest of its stream, so only
        its new blocks are kept, as a text session's turns are; one that does not starts a stream anew."""
        stream: np.ndarray | None = None  # the current stream's ids: the previous request's
        for (turn, hash_ids, prompt_tokens), arrival in zip(requests, arrivals, strict=True):
            full = min(len(hash_ids), prompt_tokens // self._unit_tokens)
            ids = np.asarray(hash_ids[:full], dtype=np.int64)
            if stream is not None and len(ids) >= len(stream) and np.array_equal(ids[: len(stream)], stream):
                self._pieces.append(ids[len(stream) :])
            else:
                if stream is not None:
                    self._close_session(len(stream))
                self._session_starts.append(self._piece_units)
                self._pieces.append(ids)
            stream = ids
            self._add_request(turn, arrival, prompt_tokens, full, full, owner=owner)
            self._cached_ends.append(self._piece_units + full)
        if stream is not None:
            self._close_session(len(stream))

    def _add_request(
        self,
        turn: int,
        arrival: float,
        prompt_tokens: int,
        prompt_units: int,
        cached_blocks: int,
        *,
        owner: int | None = None,
    ) -> None:
        """`owner`: the session the request is part of, where that is not its stream (hashed requests)."""
        self._session.append(self._sessions)
        self._owner.append(self._sessions if owner is None else owner)
        self._turn.append(turn)
        self._arrival.append(arrival)
        self._prompt_tokens.append(prompt_tokens)
        self._prompt_blocks.append(prompt_units // self.block_size)
        self._cached_blocks.append(cached_blocks)

    def _close_session(self, length: int) -> None:
        self._sessions += 1
        self._piece_units += length
        if self._piece_units >= _FLUSH_UNITS:
            self._flush()

    def _flush(self) -> None:
        """Hash the collected sessions' streams and keep one key per full block."""
        if not self._session_starts:
            return
        stream = np.concatenate(self._pieces).view(np.uint64) if self._pieces else np.zeros(0, np.uint64)
        starts = np.asarray(self._session_starts, dtype=np.int64)
        lengths = np.diff(np.append(starts, len(stream)))
        base = np.repeat(starts, lengths)
        position = np.arange(len(stream), dtype=np.int64) - base
        with np.errstate(over="ignore"):
            prefix = np.cumsum(_mix(stream ^ _mix(position.view(np.uint64))), dtype=np.uint64)
            before = np.concatenate(([np.uint64(0)], prefix))[base]  # the stream's sum before each session
            ends = np.flatnonzero((position + 1) % self.block_size == 0)
            keys = _mix(prefix[ends] - before[ends])
        owners = np.searchsorted(np.asarray(self._cached_ends, dtype=np.int64), ends + 1, side="left")
        self._keys.frombytes(keys.view(np.int64).tobytes())
        self._owners.frombytes((owners + self._flushed_requests).astype(np.int64).tobytes())
        self._flushed_requests += len(self._cached_ends)
        self._pieces, self._piece_units, self._session_starts, self._cached_ends = [], 0, [], []

    def result(
        self,
        counted: np.ndarray | None = None,
        conversations: np.ndarray | None = None,
        server_block: int | None = None,
    ) -> ReusablePrefix:
        """The figure over the requests `counted` (a boolean mask in insertion order; all by default),
        spread over `conversations` (a code per request, in insertion order) when given, and in the
        server's blocks of `server_block` tokens when known. Every request added, counted or not, fills
        the cache for the later ones."""
        self._flush()
        share = _reuse(self)
        mask = np.ones(len(self._session), dtype=bool) if counted is None else np.asarray(counted, dtype=bool)
        if mask.shape != (len(self._session),):
            raise ValueError(f"counted has {mask.size} entries for {len(self._session)} requests")
        scale = self.block_size * self._unit_tokens
        prompt = np.frombuffer(self._prompt_tokens, dtype=np.int64)
        reusable, shared = share[0] * scale, share[1] * scale
        turn = np.frombuffer(self._turn, dtype=np.int64)[mask]
        by_turn_prompt = np.bincount(turn, weights=prompt[mask])
        by_turn_reusable = np.bincount(turn, weights=reusable[mask])
        by_turn_requests = np.bincount(turn)
        by_conversation = None
        if conversations is not None:
            codes = np.asarray(conversations, dtype=np.int64)[mask]
            prompt_by, reusable_by = np.bincount(codes, prompt[mask]), np.bincount(codes, reusable[mask])
            by_conversation = ShareSpread.of(reusable_by[prompt_by > 0] / prompt_by[prompt_by > 0])
        total = int(prompt[mask].sum())
        reusable_total = int(reusable[mask].sum())
        server_share = None
        if server_block is not None:  # a server recomputes a prompt's last token, and caches whole blocks
            reachable = np.minimum(reusable, prompt - 1).clip(min=0) // server_block * server_block
            server_share = _ratio(int(reachable[mask].sum()), total)
        shared_total = int(shared[mask].sum())
        return ReusablePrefix(
            block_size=scale,
            basis=self.basis,
            chat_template=self.chat_template,
            requests=int(mask.sum()),
            prompt_tokens=total,
            reusable_tokens=reusable_total,
            history_tokens=reusable_total - shared_total,
            shared_tokens=shared_total,
            share=_ratio(reusable_total, total),
            history_share=_ratio(reusable_total - shared_total, total),
            shared_share=_ratio(shared_total, total),
            by_turn=[
                TurnReuse(turn=index + 1, requests=int(n), share=_ratio(r, p))
                for index, (n, r, p) in enumerate(zip(by_turn_requests, by_turn_reusable, by_turn_prompt, strict=True))
                if n
            ],
            by_conversation=by_conversation,
            server_block_size=server_block,
            server_share=server_share,
        )


def _ratio(part: float, whole: float) -> float | None:
    return float(part) / float(whole) if whole else None


def _reuse(blocks: PrefixBlocks) -> tuple[np.ndarray, np.ndarray]:
    """(reusable blocks, shared blocks) per request, from the collected keys."""
    session = np.frombuffer(blocks._session, dtype=np.int64)
    arrival = np.frombuffer(blocks._arrival, dtype=np.float64)
    count = len(session)
    rank = np.empty(count, dtype=np.int64)
    rank[np.lexsort((np.arange(count), arrival))] = np.arange(count)  # NaN arrivals last, in file order
    keys = np.frombuffer(blocks._keys, dtype=np.int64)
    owners = np.frombuffer(blocks._owners, dtype=np.int64)
    if not keys.size:
        return np.zeros(count, dtype=np.int64), np.zeros(count, dtype=np.int64)
    order = rank[owners]
    by_key = np.lexsort((order, keys))
    sorted_keys = keys[by_key]
    group_start = np.flatnonzero(np.r_[True, sorted_keys[1:] != sorted_keys[:-1]])
    first = np.repeat(by_key[group_start], np.diff(np.r_[group_start, len(by_key)]))
    seen = np.empty(len(keys), dtype=bool)
    seen[by_key] = order[by_key] > order[first]
    other = np.empty(len(keys), dtype=bool)
    owner = np.frombuffer(blocks._owner, dtype=np.int64)
    other[by_key] = owner[owners[first]] != owner[owners[by_key]]
    produced = np.bincount(owners, minlength=count)
    seen_new = np.bincount(owners, weights=seen, minlength=count).astype(np.int64)
    shared_new = np.bincount(owners, weights=other & seen, minlength=count).astype(np.int64)
    prompt_blocks = np.frombuffer(blocks._prompt_blocks, dtype=np.int64)
    reply_blocks = np.frombuffer(blocks._cached_blocks, dtype=np.int64) - prompt_blocks  # its own decoded ones
    inherited = prompt_blocks - (produced - reply_blocks)  # earlier turns' blocks
    # shared blocks of the session's earlier turns: a running sum restarted at each session
    running = np.cumsum(shared_new)
    session_first = np.flatnonzero(np.r_[True, session[1:] != session[:-1]])
    restart = np.repeat(running[session_first] - shared_new[session_first], np.diff(np.r_[session_first, count]))
    shared_inherited = running - shared_new - restart
    return inherited + seen_new, shared_inherited + shared_new


class PromptLayout:
    """What a session's turns and replies add to its token stream under a chat template."""

    def __init__(self, tokenizer: str, template: ChatTemplate) -> None:
        self._encode = get_tokenizer(tokenizer).encode
        self._chatml = template == "chatml"
        self._generation_prompt = self._encode(GENERATION_PROMPT) if self._chatml else []
        self.reply_end = len(self._encode(MESSAGE_END)) if self._chatml else 0
        """Tokens that close a reply's message in the next prompt (its opening is the generation prompt)."""

    def turn(self, messages: Iterable[tuple[str, str]]) -> np.ndarray:
        """A turn's new tokens from its (role, text) messages: ChatML pieces and the generation prompt,
        or the texts alone."""
        if self._chatml:
            pieces = [*(self._encode(chatml_message(role, text)) for role, text in messages), self._generation_prompt]
        else:
            pieces = [self._encode(text) for _, text in messages]
        return np.fromiter(chain.from_iterable(pieces), dtype=np.int64)

    def session_turns(self, session: Session) -> list[np.ndarray]:
        return [self.turn((m.role, m.content) for m in turn.messages) for turn in session.turns]


def workload_prefix(
    workload: Workload, *, block_size: int = DEFAULT_BLOCK_SIZE, template: ChatTemplate = DEFAULT_CHAT_TEMPLATE
) -> ReusablePrefix:
    """The reusable prefix of a workload file: its requests at the request table's arrivals, a reply
    as long as the turn's `output_tokens` (else `max_tokens`, else 0). What a run sent: `sent_prefix`."""
    arrivals = request_table(workload)["arrival_s"].to_numpy()
    conversations = ConversationCodes().of([session.id for session in workload.sessions for _ in session.turns])
    if workload.spec.block_size is not None:
        return _block_prefix(workload, arrivals, conversations)
    layout = PromptLayout(workload.spec.tokenizer, template)
    blocks = PrefixBlocks.from_text(block_size, workload.spec.tokenizer, template)
    request = 0
    for session in workload.sessions:
        tokens = layout.session_turns(session)
        replies = [turn.output_tokens or turn.max_tokens or 0 for turn in session.turns]
        blocks.add_session(
            list(zip(tokens, replies, strict=True)), arrivals[request : request + len(tokens)], layout.reply_end
        )
        request += len(tokens)
    return blocks.result(conversations=conversations)


def _block_prefix(workload: Workload, arrivals: np.ndarray, conversations: np.ndarray) -> ReusablePrefix:
    """A workload of block turns: the figure from its ids, as its trace's is (a turn of messages has no
    ids and reuses nothing)."""
    assert workload.spec.block_size is not None
    blocks = PrefixBlocks.from_hash_ids(workload.spec.block_size)
    first = 0
    for number, session in enumerate(workload.sessions):
        requests: list[tuple[int, Sequence[int], int]] = [
            (index, turn.blocks or [], turn.prompt_tokens or 0) for index, turn in enumerate(session.turns)
        ]
        blocks.add_hashed_session(requests, arrivals[first : first + len(requests)].tolist(), number)
        first += len(requests)
    return blocks.result(conversations=conversations)


def sent_prefix(
    workload: Workload,
    sent: pd.DataFrame,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    template: ChatTemplate = DEFAULT_CHAT_TEMPLATE,
    bust_run: str | None = None,
    server_block: int | None = None,
) -> ReusablePrefix | str:
    """The reusable prefix of what a run sent: `sent` has one row per request sent (session_id,
    turn, sent_at, output_tokens, and `counted`: whether the figure counts it), in any order.

    Each replayed session is a session of the figure, its turns at their send times and its replies
    their real lengths (a turn it never sent: no arrival, no reply). A workload session replayed
    again (`id~n`, a run longer than the workload) is a session of its own with the same text, so its
    turns reuse the first replay's blocks as shared ones, up to its first reply, which is its own;
    unless the run was `bust_run` (its id, --cache-bust), whose plays open with their own markers.
    `server_block`: the server's own cache block, for what it could hit. Each workload session is
    tokenized once per marker. A string says why there is no figure."""
    if sent.empty:
        return "the run sent no request"
    index = {session.id: number for number, session in enumerate(workload.sessions)}
    names = sent.session_id.astype("category")
    played = [_played_session(str(name), index) for name in names.cat.categories]
    if None in played:
        return "the run sent sessions the workload file does not hold: it changed since the run"
    known = [pair for pair in played if pair is not None]
    codes = names.cat.codes.to_numpy()
    conversation = ConversationCodes().of([str(name) for name in names.cat.categories])[codes]
    session = np.asarray([number for number, _ in known], dtype=np.int64)[codes]
    lap = np.asarray([lap for _, lap in known], dtype=np.int64)[codes]
    turn = sent.turn.to_numpy(dtype=np.int64)
    if (turn >= np.asarray([len(s.turns) for s in workload.sessions])[session]).any():
        return "the run sent turns the workload file does not hold: it changed since the run"
    sent_at = sent.sent_at.to_numpy(dtype=float)
    replies = np.nan_to_num(sent.output_tokens.to_numpy(dtype=float)).astype(np.int64)
    is_counted = sent.counted.to_numpy(dtype=bool)
    order = np.lexsort((turn, lap, session))  # each play of a session, turn by turn
    if workload.spec.block_size is not None:
        blocks = _sent_blocks(workload, (session[order], lap[order], turn[order]), sent_at[order], bust_run)
        return blocks.result(is_counted[order], conversation[order], server_block)
    starts = np.flatnonzero(np.r_[True, (np.diff(session[order]) != 0) | (np.diff(lap[order]) != 0)])
    layout = PromptLayout(workload.spec.tokenizer, template)
    blocks = PrefixBlocks.from_text(block_size, workload.spec.tokenizer, template)
    counted: list[np.ndarray] = []
    conversations: list[np.ndarray] = []
    tokens: list[np.ndarray] = []
    tokenized = (-1, -1)
    for rows in np.split(order, starts[1:]):
        text_of = (int(session[rows[0]]), int(lap[rows[0]]) if bust_run is not None else 0)
        if text_of != tokenized:  # sorted by session: its replays follow one another
            tokenized = text_of
            text = workload.sessions[text_of[0]]
            tokens = layout.session_turns(marked(text, play_marker(bust_run, text_of[1])) if bust_run else text)
        depth = int(turn[rows].max()) + 1
        arrival, reply, mask = np.full(depth, np.nan), np.zeros(depth, dtype=np.int64), np.zeros(depth, dtype=bool)
        arrival[turn[rows]], reply[turn[rows]], mask[turn[rows]] = sent_at[rows], replies[rows], is_counted[rows]
        blocks.add_session(list(zip(tokens[:depth], reply.tolist(), strict=True)), arrival, layout.reply_end)
        counted.append(mask)
        conversations.append(np.full(depth, conversation[rows[0]]))
    return blocks.result(np.concatenate(counted), np.concatenate(conversations), server_block)


def server_block_size(cached_tokens: np.ndarray) -> int | None:
    """The server's prefix-cache block, read from what it served: every request's cached tokens are whole
    blocks, so their greatest common divisor over enough hits (a coincidence of larger multiples is then
    out of reach). None with fewer than `MIN_HITS_FOR_BLOCK` hits."""
    hits = np.asarray(cached_tokens, dtype=float)
    hits = hits[np.isfinite(hits) & (hits > 0)].astype(np.int64)
    return int(np.gcd.reduce(hits)) if len(hits) >= MIN_HITS_FOR_BLOCK else None


def _sent_blocks(
    workload: Workload, requests: tuple[np.ndarray, np.ndarray, np.ndarray], sent_at: np.ndarray, bust_run: str | None
) -> PrefixBlocks:
    """What a run of a workload of block turns sent, by the ids each request's text came from (a
    --cache-bust play's renamed ones), each at its send time; each play of a session is a session.
    `requests` (session number, play, turn) are sorted: a play's turns in order, one play after another."""
    assert workload.spec.block_size is not None
    blocks = PrefixBlocks.from_hash_ids(workload.spec.block_size)
    session, lap, turn = requests
    starts = np.flatnonzero(np.r_[True, (np.diff(session) != 0) | (np.diff(lap) != 0)])
    for owner, rows in enumerate(np.split(np.arange(len(session)), starts[1:])):
        played = workload.sessions[int(session[rows[0]])]
        if bust_run is not None:
            played = marked(played, play_marker(bust_run, int(lap[rows[0]])))
        sent = [(index, played.turns[index].blocks or [], played.turns[index].prompt_tokens or 0) for index in
                turn[rows].tolist()]  # fmt: skip
        blocks.add_hashed_session(sent, sent_at[rows].tolist(), owner)
    return blocks


def conversation_of(session_id: str) -> str:
    """The conversation a session is part of: a subagent's session (`parent/agent`) and a part that
    --session-gap split off (`id#2`) are their parent's; a replay (`id~1`) is a conversation of its own."""
    base, _, play = session_id.rpartition(REPLAY_SEPARATOR)
    if not (base and play.isdigit()):
        base, play = session_id, ""
    root = base.split("/", 1)[0].split("#", 1)[0]
    return f"{root}{REPLAY_SEPARATOR}{play}" if play else root


class ConversationCodes:
    """A number per conversation (`conversation_of`), in the order conversations are first seen: the
    same for every session of one conversation, whether the ids come all at once or one by one."""

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}

    def code(self, session_id: str) -> int:
        return self._codes.setdefault(conversation_of(session_id), len(self._codes))

    def of(self, session_ids: Sequence[str]) -> np.ndarray:
        return np.fromiter((self.code(name) for name in session_ids), np.int64, len(session_ids))


def _played_session(name: str, index: dict[str, int]) -> tuple[int, int] | None:
    """(workload session, replay) of a record's session id; None when the workload holds no such session."""
    if name in index:
        return index[name], 0
    base, _, lap = name.rpartition(REPLAY_SEPARATOR)
    return (index[base], int(lap)) if base in index and lap.isdigit() else None
