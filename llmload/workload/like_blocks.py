"""`synth --like` of a workload whose prompts are block ids (agentic traces, Mooncake): whole conversations.

An agentic trace's prompt is not a history of appended messages: the agent compacts its context, so
a turn's prompt can shrink, and a subagent opens with its parent's blocks. Lengths alone
(`like.like_shapes`) cannot say that, and a skeleton that appends each turn's new tokens overshot the
20-trace kv-cache-tester set's prompts by 10-26% from turn 8 on. A block workload carries the
structure itself, so its synthetic twin is its conversations (an agent with its subagents) taken
whole, as `like.Resample` picks them, with every id renamed:

- a block id that one conversation alone sends is new in each copy of it, so two copies share
  nothing (as two plays under --cache-bust); one that several conversations send (a shared system
  prompt) stays shared between their copies;
- ids become ranks (consecutive ids stay consecutive, so the file's runs stay runs), and no real id,
  a hash of the real text, is written;
- session ids, parents, spawns and joins are renamed with them, and each conversation keeps its
  recorded times, shifted to a start resampled from the real ones and paced to the real request rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from llmload.models import BlockIds, Session, SessionLinks, Turn, conversations
from llmload.workload.files import Workload
from llmload.workload.like import RequestFigures, Resample, paced, request_rate, resampled_starts
from llmload.workload.prefix import ConversationCodes
from llmload.workload.stats import request_table


def has_blocks(sessions: Sequence[Session]) -> bool:
    """Every prompt is given as block ids (a workload built from a trace of hash ids)."""
    return all(turn.blocks is not None for session in sessions for turn in session.turns)


class Conversations:
    """A block workload's sessions grouped into conversations once, for both the check that whole copies
    keep what the source's conversations share and the copies themselves."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.unit = conversation_units(workload.sessions)
        self.members = _members(self.unit)
        per_conversation = [
            np.unique(np.concatenate([np.asarray(turn.blocks) for i in members for turn in workload.sessions[i].turns]))
            for members in self.members
        ]
        ids, senders = np.unique(np.concatenate(per_conversation), return_counts=True)
        self._rename = _IdRenamer(ids, senders > 1)

    def __len__(self) -> int:
        return len(self.members)

    def keep_shared_blocks(self, count: int) -> bool:
        """Whether `count` whole conversations keep what the source's share with each other: all of them are
        taken (`count` at least theirs), or they share no block. Taken apart, conversations that share a
        prefix with others lose it: 2,000 of Mooncake's 12,031 single-request sessions shared 16% of their
        tokens for 37.3%."""
        return count >= len(self) or not self._rename.shared.any()

    def like(
        self, count: int, rng: np.random.Generator, name: str, output_length: Literal["fixed", "free"] = "fixed"
    ) -> list[Session]:
        """`count` conversations taken from the workload's (each session of one, renamed) as described above."""
        sessions, conversation, members = self.workload.sessions, self.unit, self.members
        table = request_table(self.workload)
        session_of = np.repeat(np.arange(len(sessions)), [len(s.turns) for s in sessions])
        unit = conversation[session_of]
        arrival = table["arrival_s"].to_numpy(dtype=float)
        requests = RequestFigures(
            units=unit,
            sessions=session_of,
            turns=table["turn"].to_numpy(),
            prompt=table["prompt_tokens"].to_numpy(dtype=float),
            output=table["output_tokens"].to_numpy(dtype=float),
            think=table["think_s"].to_numpy(dtype=float),
        )
        picked = rng.permutation(Resample.of_requests(requests, conversation, len(members)).pick(count, rng))
        starts = np.full(len(members), np.inf)
        np.minimum.at(starts, unit, arrival)  # NaN where a conversation's time is unknown
        offsets = resampled_starts(starts, count, rng)
        if offsets[0] is not None:
            times = [arrival[m] - starts[c] for c, m in enumerate(_members(unit))]
            offsets = paced(np.asarray(offsets), [times[c] for c in picked], request_rate(arrival))
        copies = np.zeros(len(members), dtype=int)
        out: list[Session] = []
        for number, (real, offset) in enumerate(zip(picked.tolist(), offsets, strict=True)):
            names = _session_names([sessions[i].id for i in members[real]], f"{name}-{number:05d}")
            for i in members[real]:
                session = sessions[i]
                shift = None if offset is None or session.offset_s is None else offset + session.offset_s - starts[real]
                turns = [
                    _renamed(turn, names, self._rename, int(copies[real]), output_length) for turn in session.turns
                ]
                out.append(
                    Session(
                        id=names[session.id],
                        offset_s=None if shift is None else round(shift, 3),
                        parent=names.get(session.parent) if session.parent is not None else None,
                        turns=turns,
                    )
                )
            copies[real] += 1
        return out


class _IdRenamer:
    """Each real block id as its rank among the workload's ids (`ids`, sorted): the same in every copy for
    an id several conversations send (`shared`), offset by the copy number for one a conversation sends alone."""

    def __init__(self, ids: np.ndarray, shared: np.ndarray) -> None:
        self._ids, self.shared = ids, shared

    def __call__(self, blocks: BlockIds, copy: int) -> BlockIds:
        rank = np.searchsorted(self._ids, np.asarray(blocks))
        return BlockIds(np.where(self.shared[rank], rank, (copy + 1) * self._ids.size + rank))


def conversation_units(sessions: Sequence[Session]) -> np.ndarray:
    """Each session's conversation, numbered from 0: sessions joined by their parents (`conversations`) or
    by their names (`ConversationCodes`: a subagent `id/agent`, a part --session-gap split off, `id#2`,
    which shares its first part's blocks), so a resample takes them together."""
    by_parents = conversations(sessions, SessionLinks.of(sessions).by_id)
    by_names = ConversationCodes().of([session.id for session in sessions])
    unit = by_parents.copy()
    while True:  # each session takes the least number of either group it is in, until none changes
        joined = unit.copy()
        for groups in (by_parents, by_names):
            least = np.full(groups.max() + 1, len(sessions))
            np.minimum.at(least, groups, joined)
            joined = least[groups]
        if np.array_equal(joined, unit):
            return np.unique(unit, return_inverse=True)[1]
        unit = joined


def _members(conversation: np.ndarray) -> list[np.ndarray]:
    """Each conversation's sessions (positions), in workload order."""
    order = np.argsort(conversation, kind="stable")
    return np.split(order, np.flatnonzero(np.diff(conversation[order])) + 1)


def _session_names(real: list[str], root: str) -> dict[str, str]:
    """A conversation's session names with their conversation's part (up to the first `/` or `#`) replaced
    by `root`: a subagent stays `root/agent` and a split part `root#2`, as `ConversationCodes` groups them.
    Sessions joined by their parents alone (no such part) are told apart by their position."""
    names: dict[str, str] = {}
    for position, session in enumerate(real):
        cut = min((i for i in (session.find("/"), session.find("#")) if i >= 0), default=len(session))
        renamed = root + session[cut:]
        names[session] = renamed if renamed not in names.values() else f"{renamed}/{position}"
    return names


def _renamed(
    turn: Turn, names: dict[str, str], rename: _IdRenamer, copy: int, output_length: Literal["fixed", "free"]
) -> Turn:
    assert turn.blocks is not None  # `has_blocks` chose this path
    lengths: dict[str, int | None] = (
        {"max_tokens": turn.output_tokens or turn.max_tokens, "output_tokens": None} if output_length == "free" else {}
    )
    return turn.model_copy(
        update={
            "blocks": rename(turn.blocks, copy),
            "spawns": [names[s] for s in turn.spawns if s in names],
            "waits_for": [names[s] for s in turn.waits_for if s in names],
            **lengths,
        }
    )
