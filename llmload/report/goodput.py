"""Goodput: the requests per second that met every per-request SLO given (DistServe's rule).

A request counts only when it succeeded and its own TTFT, TTFO (time to the first answer token
of a reasoning model), TPOT, ITL statistic (a percentile or the max of its gaps) and E2E each
meet their SLO. A failed request never does. A cancelled one
was cut by the run, not by the server, so it is left out of both sides (GuideLLM PR 1085). A
figure a request does not have (the TPOT of a one-token reply) is not held against it, except
the TTFO: a request without one thought until its budget ran out and never answered, which no
user counts as a good answer (the verdict's TTFO SLO takes its E2E as a lower bound: the same).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from llmload.models import GOODPUT_METRICS, GoodputSLO
from llmload.records import RunRecords

# the per-request figures judged as they are, one value each (ITL is a statistic of a request's gaps)
SCALAR_FIELDS = tuple(field for field in GOODPUT_METRICS.values() if field != "itl_ms")
# a figure whose absence means the SLO was missed: no first answer token is no answer
MISSING_FAILS = {"ttfo_ms"}


def conforming(frame: pd.DataFrame, slo: GoodputSLO, request_itl: np.ndarray | None = None) -> pd.Series:
    """Per record (frame's index): True when it succeeded and met every SLO. `request_itl` is each
    record's ITL statistic (RunRecords.itl_per_request), needed when the SLO has itl_ms."""
    good = (frame.status == "ok").to_numpy(dtype=bool, copy=True)
    for field in SCALAR_FIELDS:
        limit = getattr(slo, field)
        if limit is not None:
            values = frame[field].to_numpy(dtype=float)
            good &= values <= limit if field in MISSING_FAILS else ~(values > limit)  # NaN: a figure it lacks
    if slo.itl_ms is not None:
        if request_itl is None:
            raise ValueError("an ITL SLO needs each request's ITL statistic")
        good &= ~(request_itl > slo.itl_ms)
    return pd.Series(good, index=frame.index)


def good_requests(records: RunRecords, slo: GoodputSLO | None) -> pd.Series | None:
    """conforming() of a run's records, each request's ITL statistic streamed from its gaps when an
    ITL SLO needs it; None without an SLO."""
    if slo is None:
        return None
    request_itl = None
    if slo.itl_ms is not None:
        ok = (records.frame.status == "ok").to_numpy(dtype=bool)
        percentile = None if slo.itl_stat == "max" else float(slo.itl_stat.removeprefix("p"))
        request_itl = records.itl_per_request(ok, percentile)
    return conforming(records.frame, slo, request_itl)
