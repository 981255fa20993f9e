"""The notes report.md and report.html both print under their tables, written once here, so the two
pages never explain a figure in different words."""

from __future__ import annotations

from llmload.stats.sketch import METHOD as ITL_METHOD

REQUESTS_NOTE = (
    "Unfinished requests were still running when the drain after the plan ended: the target did not keep up,"
    " and they count as failures. Cancelled requests were cut by the operator (Ctrl-C, SIGTERM): never judged."
    " Warm-up requests are counted apart and left out of every figure but the stage table."
)
ITL_NOTE = f"ITL: every gap of every successful request, pooled; {ITL_METHOD}."


def lost_note(lost: int) -> str:
    return (
        f"{lost} requests were lost with a worker (in flight when it died, or due on it and never sent): never"
        " judged against the target, and the hold's achieved-rate check fails (see Workers)."
    )


REPLICA_SERVER_NOTE = (
    "Each replica's /metrics, scraped with the others every sample: preemptions over the judged stages, the peaks"
    " over the whole run."
)
