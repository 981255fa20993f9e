"""`--use-think-time-only` and `--max-think-time`: how a replay paces a session's follow-up turns.

A trace records when each turn was sent (`at_s`). Replayed at those times, a turn waits for a reply
the recorded server gave, so that server's speed leaks into the run: a faster server idles, a slower
one has turns pile up. With think time only, each follow-up goes out its think time (the recorded
gap less the recorded answer time) after the reply the run's own server gave. An agent's idle gaps
(a person away for an hour) hold sessions open for nothing in a soak: `--max-think-time` caps each.
Both are applied to the workload once, where the plan loads it.
"""

from __future__ import annotations

import dataclasses

from llmload.workload.files import Workload


def paced(workload: Workload, *, think_time_only: bool, max_think_s: float | None) -> Workload:
    """The workload with its recorded send times dropped (`think_time_only`) and its think times capped."""
    if not think_time_only and max_think_s is None:
        return workload
    cap = float("inf") if max_think_s is None else max_think_s
    sessions = [
        session.model_copy(
            update={
                "turns": [
                    turn.model_copy(
                        update={
                            "think_time_s": min(turn.think_time_s, cap),
                            "at_s": None if think_time_only else turn.at_s,
                        }
                    )
                    for turn in session.turns
                ]
            }
        )
        for session in workload.sessions
    ]
    return dataclasses.replace(workload, sessions=sessions)
