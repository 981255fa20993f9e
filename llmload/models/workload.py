"""The workload file's contract: its YAML spec, the JSONL sessions beside it, and the prefix its prompts could reuse."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Literal, NamedTuple, overload

import numpy as np
from numpy.typing import DTypeLike
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

from llmload.models.strict import Strict

# --------------------------------------------------------------------------- workload (v1)

BlockItem = int | list[int]  # in the file: one id, or a run [first, count] of consecutive ids


def block_runs(ids: Sequence[int] | np.ndarray) -> list[BlockItem]:
    """Ids as the sessions file writes them: each run of 3 or more consecutive ids as [first, count]. An
    agent's history grows by whole runs, so a turn of thousands of ids is a few items."""
    ids = np.asarray(ids, dtype=np.int64)
    starts = np.flatnonzero(np.diff(ids, prepend=-2) != 1)  # where each run begins
    counts = np.diff(starts, append=len(ids))
    items: list[BlockItem] = []
    for first, count in zip(ids[starts].tolist(), counts.tolist(), strict=True):
        items += [[first, count]] if count > 2 else list(range(first, first + count))
    return items


def _run(item: object) -> np.ndarray:
    """The ids of one item of a file's `blocks`: an id, or a run [first, count]."""
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return np.array([item], dtype=np.int64)
    if (
        isinstance(item, list)
        and len(item) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        and item[0] >= 0
        and item[1] >= 1
    ):
        return np.arange(item[0], item[0] + item[1], dtype=np.int64)
    raise ValueError(f"a block is an id >= 0 or a run [first id, count >= 1], got {item!r}")


class BlockIds(Sequence[int]):
    """A turn's block ids, held as one read-only int64 array: a corpus of agentic traces holds ~100M of
    them, 4 GB as Python ints and 0.8 GB so. Compared, indexed and iterated as a list of ints; written as
    runs (`block_runs`)."""

    __slots__ = ("_ids",)

    def __init__(self, ids: Iterable[int] | np.ndarray) -> None:
        array = np.array(ids if isinstance(ids, np.ndarray) else list(ids), dtype=np.int64)
        array.setflags(write=False)
        self._ids = array

    @classmethod
    def parse(cls, value: object) -> BlockIds:
        """A file's `blocks`: ids and runs [first, count]; a list of plain ids is read in one step."""
        if isinstance(value, BlockIds):
            return value
        if not isinstance(value, list):
            raise ValueError(f"blocks is a list of ids and runs [first id, count], got {type(value).__name__}")
        if all(type(item) is int for item in value):
            ids = np.array(value, dtype=np.int64)
            if len(ids) and ids.min() < 0:
                raise ValueError(f"a block is an id >= 0, got {int(ids.min())}")
            return cls(ids)
        return cls(np.concatenate([_run(item) for item in value]))

    @classmethod
    def __get_pydantic_core_schema__(cls, source: object, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            cls.parse, serialization=core_schema.plain_serializer_function_ser_schema(block_runs)
        )

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> BlockIds: ...
    def __getitem__(self, index: int | slice) -> int | BlockIds:
        return BlockIds(self._ids[index]) if isinstance(index, slice) else int(self._ids[index])

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids.tolist())

    def __array__(self, dtype: DTypeLike | None = None, copy: bool | None = None) -> np.ndarray:
        return self._ids if dtype is None or np.dtype(dtype) == self._ids.dtype else self._ids.astype(dtype)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BlockIds):
            return bool(np.array_equal(self._ids, other._ids))
        if isinstance(other, list | tuple | np.ndarray):
            return len(other) == len(self._ids) and bool(np.array_equal(self._ids, np.asarray(other)))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the list it stands for

    def __repr__(self) -> str:
        return f"BlockIds({self._ids.tolist()!r})"


class Message(Strict):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class Turn(Strict):
    """One request of a session: the messages this turn adds to the conversation, or its whole prompt
    as prefix blocks (a trace's hash ids: llmload/workload/blocks.py)."""

    messages: list[Message] = Field(default_factory=list)
    blocks: BlockIds | None = Field(
        default=None,
        description="the whole prompt, history included, as ids of the spec's block_size-token blocks (the last"
        " may be partial); sent as one user message whose text each id gives, with no history added. The file"
        " may give a run of consecutive ids as [first, count]",
    )
    max_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = Field(
        default=None, description="forced output length (min_tokens = max_tokens = this, ignore_eos)"
    )
    think_time_s: NonNegativeFloat = Field(
        default=0.0,
        description="pause after the previous reply before this turn is sent (a minimum in replay); a subagent's"
        " first: after the reply of the turn that spawned it",
    )
    at_s: NonNegativeFloat | None = Field(
        default=None, description="when the source sent this turn, in seconds after the session's first turn"
    )
    prompt_tokens: PositiveInt | None = Field(
        default=None, description="prompt length in the source (history included), for stats"
    )
    model: str | None = Field(
        default=None, min_length=1, description="the model or LoRA adapter this turn asks for (default: --model's)"
    )
    model_rank: NonNegativeInt | None = Field(
        default=None,
        description="which of the run's --model this turn asks for, by position (modulo their count): an agentic"
        " trace's main model is 0, its others 1, 2, ... in order of first use",
    )
    waits_for: list[str] = Field(
        default_factory=list,
        description="subagent sessions (ids) that must have ended before this turn is sent: the agent joins the"
        " subagents it spawned (trace replay)",
    )
    spawns: list[str] = Field(
        default_factory=list,
        description="subagent sessions (ids) this turn starts once its reply is back, each its first think time"
        " later (trace replay)",
    )

    @model_validator(mode="after")
    def _bounded(self) -> Turn:
        """A request with no length limit would run to the server's max_model_len: never sent. A
        prompt is messages or blocks, and blocks say how long it is."""
        if (self.blocks is None) == (not self.messages):
            raise ValueError("a turn has messages or blocks (a prompt as prefix block ids), one of the two")
        if self.blocks is not None and self.prompt_tokens is None:
            raise ValueError(
                "a turn of blocks needs prompt_tokens: how long its prompt is (its last block may be partial)"
            )
        if self.output_tokens is None and self.max_tokens is None:
            raise ValueError(
                "a turn needs output_tokens or max_tokens (without, a server generates up to max_model_len);"
                " `llmload workload build --output-tokens DISTRIBUTION` draws them for a log that has none"
            )
        return self


REPLAY_SEPARATOR = "~"
"""A run longer than its workload replays it again: the n-th replay of session `id` is `id~n` in the records."""


class Session(Strict):
    id: str
    offset_s: NonNegativeFloat | None = Field(default=None, description="arrival offset in the source")
    parent: str | None = Field(
        default=None, description="a subagent's: the session that spawned it (replayed on the same worker)"
    )
    turns: list[Turn] = Field(min_length=1)


class SessionLinks(NamedTuple):
    """Sessions by id and who spawns whom, built once for all that read them: the worker split, the trace
    dispatcher and `--use-think-time-only`'s pacing."""

    by_id: dict[str, int]  # each session's position
    spawner: dict[int, int]  # a subagent's position: that of the session whose turn spawns it

    @classmethod
    def of(cls, sessions: Sequence[Session]) -> SessionLinks:
        index = {session.id: i for i, session in enumerate(sessions)}
        spawner = {
            index[name]: i
            for i, session in enumerate(sessions)
            for turn in session.turns
            for name in turn.spawns
            if name in index
        }
        return cls(index, spawner)


def conversations(sessions: Sequence[Session], index: Mapping[str, int]) -> np.ndarray:
    """Each session's conversation, numbered in order: the one of the session at the top of its chain of
    parents (its own for a session without one, or whose parent the workload lacks); `index`: each
    session's position by id (`SessionLinks`)."""
    roots = np.arange(len(sessions), dtype=np.int64)
    for i in range(len(sessions)):
        seen = {i}
        while (name := sessions[roots[i]].parent) is not None and index.get(name, i) not in seen:
            roots[i] = index[name]
            seen.add(int(roots[i]))
    return np.unique(roots, return_inverse=True)[1].astype(np.int64)


class WorkloadSource(Strict):
    files: list[str] = Field(default_factory=list)
    format: str
    built_at: datetime | None = None
    generator: dict[str, object] | None = None


class WorkloadSpec(Strict):
    """The YAML file a person reads and edits; sessions live in a JSONL file beside it."""

    version: Literal[1]
    name: str
    source: WorkloadSource | None = None
    tokenizer: str = "cl100k_base"
    model: str | None = None
    target_qps: float | None = Field(default=None, gt=0)
    sessions: str = Field(description="JSONL file of sessions, relative to the YAML file")
    history_turns: PositiveInt | None = Field(default=None, description="replay keeps only the last N turns of history")
    block_size: PositiveInt | None = Field(
        default=None, description="tokens per prefix block of the turns given as `blocks` (512 for Mooncake)"
    )
    stats: dict[str, object] | None = None


# --------------------------------------------------------------------------- reusable prefix


class TurnReuse(BaseModel):
    """The reusable share of prompt tokens at one turn index (1 = first turn)."""

    model_config = ConfigDict(extra="forbid")

    turn: int
    requests: int
    share: float | None


class ShareSpread(BaseModel):
    """How a share spreads over conversations: each conversation's own share, its quantiles and mean
    (a conversation counts once, however many tokens it sent)."""

    model_config = ConfigDict(extra="forbid")

    conversations: int
    min: float
    p25: float
    median: float
    p75: float
    max: float
    mean: float

    @classmethod
    def of(cls, shares: Sequence[float] | np.ndarray) -> ShareSpread | None:
        """The spread of per-conversation shares; None without any."""
        values = np.asarray(shares, dtype=float)
        if not values.size:
            return None
        low, p25, median, p75, high = np.percentile(values, [0, 25, 50, 75, 100])
        return cls(
            conversations=int(values.size), min=float(low), p25=float(p25), median=float(median),
            p75=float(p75), max=float(high), mean=float(values.mean()),
        )  # fmt: skip

    def describe(self) -> str:
        """The spread in words, as the report and `workload stats` print it."""
        named = {"min": self.min, "P25": self.p25, "median": self.median, "P75": self.p75, "max": self.max}
        figures = ", ".join(f"{name} {value:.1%}" for name, value in {**named, "mean": self.mean}.items())
        return f"{figures} over {self.conversations:,} conversations"


ChatTemplate = Literal["chatml", "none"]
"""How the reusable-prefix figure renders messages into a prompt (llmload/workload/prefix.py)."""


class ReusablePrefix(BaseModel):
    """Prompt tokens an infinite prefix cache could serve (llmload/workload/prefix.py defines it)."""

    model_config = ConfigDict(extra="forbid")

    block_size: PositiveInt = Field(description="tokens per block; 512 for Mooncake hash_ids")
    basis: str = Field(description="what the blocks were cut from: message text, or the log's hash_ids")
    chat_template: ChatTemplate | None = Field(
        default=None, description="how prompts were rendered from messages; None for hash_ids"
    )
    requests: int
    prompt_tokens: int = Field(description="tokens of the prompts counted (as rendered), replies included")
    reusable_tokens: int
    history_tokens: int = Field(description="reusable, first sent by the same session")
    shared_tokens: int = Field(description="reusable, first sent by another session")
    share: float | None = Field(description="reusable / prompt tokens; None without prompt tokens")
    history_share: float | None
    shared_share: float | None
    by_turn: list[TurnReuse]
    by_conversation: ShareSpread | None = Field(
        default=None,
        description="each conversation's reusable share (a session with its subagents and the parts --session-gap"
        " split off; each replay its own), spread over the conversations; None where not grouped",
    )
    server_block_size: PositiveInt | None = Field(
        default=None, description="the server's own prefix-cache block, where a run's usage showed it"
    )
    server_share: float | None = Field(
        default=None,
        description="what the server's blocks could hit: each request's reusable tokens short of its last token"
        " (a server computes at least one), in whole server blocks; None without server_block_size",
    )

    @property
    def ceiling(self) -> PrefixCeiling:
        """The share a server's hit rate is judged against: in its own blocks where its usage showed them, as
        finer blocks count hits its cache cannot make; else in `block_size`."""
        if self.server_share is not None and self.server_block_size is not None:
            return PrefixCeiling(self.server_share, self.server_block_size, in_server_blocks=True)
        return PrefixCeiling(self.share, self.block_size, in_server_blocks=False)


class PrefixCeiling(NamedTuple):
    """What a prefix cache could hit (`share`) and the blocks it is counted in (`ReusablePrefix.ceiling`)."""

    share: float | None
    block_size: int
    in_server_blocks: bool

    @property
    def blocks(self) -> str:
        """The blocks, in words."""
        return (
            f"the server's {self.block_size}-token blocks"
            if self.in_server_blocks
            else f"{self.block_size}-token blocks"
        )
