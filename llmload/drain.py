"""When the drain after the plan ends: sized from the answers seen, not a fixed time.

A fixed drain judged healthy servers by the length of their answers: with 35 s answers and a 30 s
drain, half the soaks of a server at half its capacity ended with requests still running, and failed.
So the run waits while a request in flight is younger than `AGE_FACTOR` × the longest answer seen so
far (it may well finish), or while the server still answers (the last answer came back less than
that long ago: a request queued behind others ages while it waits its turn, and a one-slot server
at 70% of its capacity once had a probe's third request given up that way), and gives up on the
rest (stuck), never past `--drain-timeout` after the plan's end. Until `MIN_ANSWERS` answers came
back, every request is waited for: the longest of two or three answers says little about the tail
(a one-slot server's probe once gave up on an 18 s answer after seeing 5.4 s and 3.5 s ones). A
healthy server's drain ends with its last answer; an overloaded one's queue drains up to that cap,
and is judged on what it did meanwhile.
"""

from __future__ import annotations

import numpy as np

AGE_FACTOR = 3.0
MIN_ANSWERS = 10
DEFAULT_CAP_S = 600.0  # --drain-timeout's default, the request's own --timeout-total: only a stuck or overloaded
# server's drain lasts that long (answers of 60 s mean, lognormal σ 0.9, outlived a 300 s cap in 8% of soaks)
RULE = (
    f"the drain ends sooner, once {MIN_ANSWERS} answers came back, every request still running is older than"
    f" {AGE_FACTOR:g}x the longest answer seen and no answer came for as long"
)
"""When the drain ends before its cap, as the flags that set the cap say it (--drain-timeout, --probe-drain)."""


class DrainOver(Exception):
    """Raised in a request still on the wire when the drain gives up on it: it becomes `unfinished`."""


def waiting_on(ages: np.ndarray, answers: int, longest_answer_s: float, since_answer_s: float) -> bool:
    """Whether a request in flight, of these ages (s), may still finish: one younger than AGE_FACTOR ×
    the longest of the `answers` seen, or any while the last answer came back (`since_answer_s` ago)
    less than that long ago, or any before MIN_ANSWERS answers came back."""
    if not len(ages):
        return False
    patience = AGE_FACTOR * longest_answer_s
    return answers < MIN_ANSWERS or since_answer_s < patience or bool((np.asarray(ages) < patience).any())


def drain_end(sent: np.ndarray, finished: np.ndarray, plan_end: float, cap_s: float) -> float:
    """When the drain ends for requests sent at `sent` that would finish at `finished` (s, one clock):
    the first moment after the plan's end at which `waiting_on` says no, at most `cap_s` after it; the
    rule the running dispatcher applies (llmload.replay), here on answer times known in advance."""
    deadline = plan_end + cap_s
    order = np.argsort(finished, kind="stable")
    ends, starts = finished[order], sent[order]
    if not len(ends) or ends[-1] <= plan_end:
        return plan_end
    longest = np.maximum.accumulate(ends - starts)
    youngest = np.maximum.accumulate(starts[::-1])[::-1]  # of the requests still to finish, from each on
    done = int(np.searchsorted(ends, plan_end, side="right"))
    now = plan_end
    while done < len(ends):
        seen = float(longest[done - 1]) if done else 0.0
        if done >= MIN_ANSWERS:  # until the next answer nothing changes but the ages of those in flight
            gives_up = max(now, max(float(youngest[done]), float(ends[done - 1])) + AGE_FACTOR * seen)
            if gives_up < ends[done]:
                return min(gives_up, deadline)
        now = float(ends[done])
        if now >= deadline:
            return deadline
        done += 1
    return now
