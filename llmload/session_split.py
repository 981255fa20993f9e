"""Which share of a split a session falls in (its model, its replica): a hash of the session's id, so every
worker of a distributed run and every rerun of a workload splits the sessions the same way, salted by what
is split, so one split does not decide the other (without the salt, a 50/50 model mix over two replicas
would send each model to one replica)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Sequence

_HASH_RANGE = float(2**64)


def pick(session_id: str, salt: str, weights: Sequence[float]) -> int:
    """The index of the share `session_id` falls in, each share as likely as its weight."""
    if len(weights) == 1:
        return 0
    digest = hashlib.blake2b(session_id.encode(), digest_size=8, person=salt.encode()[:16]).digest()
    draw = int.from_bytes(digest) / _HASH_RANGE
    total = sum(weights)
    for index, edge in enumerate(itertools.accumulate(weight / total for weight in weights)):
        if draw < edge:
            return index
    return len(weights) - 1
