"""`--use-think-time-only` and `--max-think-time`: how a replay paces a session's follow-up turns.

A trace records when each turn was sent (`at_s`). Replayed at those times, a turn waits for a reply
the recorded server gave, so that server's speed leaks into the run: a faster server idles, a slower
one has turns pile up. With think time only, each follow-up goes out its think time (the recorded
gap less the recorded answer time) after the reply the run's own server gave, and a subagent its first
think time after the reply that spawned it (it arrives with its agent). An agent's idle gaps
(a person away for an hour) hold sessions open for nothing in a soak: `--max-think-time` caps each.
Both are applied to the workload once, where the plan loads it.
"""

from __future__ import annotations

import dataclasses

from llmload.models import SessionLinks
from llmload.workload.files import Workload


def paced(workload: Workload, *, think_time_only: bool, max_think_s: float | None) -> Workload:
    """The workload with its recorded send times dropped (`think_time_only`) and its think times capped."""
    if not think_time_only and max_think_s is None:
        return workload
    cap = float("inf") if max_think_s is None else max_think_s
    spawner = SessionLinks.of(workload.sessions).spawner
    sessions = [
        session.model_copy(
            update={
                # a subagent's arrival with its agent's: it starts its think time after the reply that spawns it
                "offset_s": workload.sessions[spawner[i]].offset_s
                if think_time_only and i in spawner
                else session.offset_s,
                "turns": [
                    turn.model_copy(
                        update={
                            "think_time_s": min(turn.think_time_s, cap),
                            "at_s": None if think_time_only else turn.at_s,
                        }
                    )
                    for turn in session.turns
                ],
            }
        )
        for i, session in enumerate(workload.sessions)
    ]
    return dataclasses.replace(workload, sessions=sessions)
