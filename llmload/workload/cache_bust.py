"""`--cache-bust`: every play of a session opens with a marker of its own.

A run longer than its workload plays sessions again (`id~1`, `id~2`: a play each). A second play is
the same text, so a server's prefix cache serves it from the first, and a search's probes or a rerun
warm each other: a hit rate production traffic never gets. A marked play's first message begins with
its run and play, so plays share no prefix with one another or with another run's, while the sessions
of one play still share what the workload has them share (system prompts, documents). The marker adds
a few tokens to every prompt of the play; the report's reusable prefix counts them. A prompt given as
prefix block ids (llmload/workload/blocks.py) has its ids renamed by the marker instead.
"""

from __future__ import annotations

import hashlib

from llmload.models import BlockIds, Session


def play_marker(run_id: str, play: int) -> str:
    """The text a play's first message begins with: the same for every session of that play."""
    return f"[{run_id} play {play}]\n"


def marked(session: Session, marker: str) -> Session:
    """The session with `marker` before its first message (every later turn carries it in its history);
    a session of block turns has its ids renamed by the marker instead, the same way for every session
    of the play."""
    if any(turn.blocks is not None for turn in session.turns):
        salt = marker.encode()
        return session.model_copy(
            update={
                "turns": [
                    turn
                    if turn.blocks is None
                    else turn.model_copy(update={"blocks": BlockIds(_renamed(i, salt) for i in turn.blocks)})
                    for turn in session.turns
                ]
            }
        )
    first = session.turns[0]
    message = first.messages[0]
    opened = first.model_copy(
        update={"messages": [message.model_copy(update={"content": marker + message.content}), *first.messages[1:]]}
    )
    return session.model_copy(update={"turns": [opened, *session.turns[1:]]})


def _renamed(block_id: int, salt: bytes) -> int:
    """A block id of the play: a 63-bit hash of the marker and the id."""
    digest = hashlib.blake2b(block_id.to_bytes(8, "little", signed=False) + salt, digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
