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

from collections.abc import Iterable

import numpy as np
import pandas as pd
from pydantic import ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import GoodputSLO, ItlStatistic
from llmload.records import RunRecords

# metric in the --goodput-slo syntax -> (GoodputSLO field, the records' column)
METRICS = {"ttft": "ttft_ms", "ttfo": "ttfo_ms", "tpot": "tpot_ms", "itl": "itl_ms", "e2e": "e2e_ms"}
# the per-request figures judged as they are, one value each (ITL is a statistic of a request's gaps)
SCALAR_FIELDS = tuple(field for field in METRICS.values() if field != "itl_ms")
# a figure whose absence means the SLO was missed: no first answer token is no answer
MISSING_FAILS = {"ttfo_ms"}
ITL_STATISTICS: tuple[str, ...] = ItlStatistic.__args__  # type: ignore[attr-defined]
SYNTAX = "METRIC=MS or itl:STAT=MS, e.g. ttft=2000,tpot=50,itl:p99=100,e2e=30000"


def parse_goodput_slo(specs: Iterable[str]) -> GoodputSLO:
    """`--goodput-slo` values (repeatable, comma-separated) as one GoodputSLO; an unknown metric or
    a statistic a metric does not have (AIPerf #1154: an SLO on a missing statistic failed every
    point) is an InputError naming it, before anything runs."""
    fields: dict[str, object] = {}
    for spec in (part.strip() for text in specs for part in text.split(",") if part.strip()):
        key, sep, value = spec.partition("=")
        metric, _, statistic = key.strip().partition(":")
        where = f"--goodput-slo {spec!r}"
        if not sep:
            raise InputError(f"{where}: expected {SYNTAX}")
        if metric not in METRICS:
            raise InputError(f"{where}: no per-request metric {metric!r}; known: {', '.join(METRICS)} ({SYNTAX})")
        if statistic and metric != "itl":
            raise InputError(
                f"{where}: {metric} is one value per request, so it has no statistic {statistic!r}; only itl"
                f" (a request's gaps) takes one: {', '.join(ITL_STATISTICS)}"
            )
        if statistic and statistic not in ITL_STATISTICS:
            raise InputError(f"{where}: itl has no statistic {statistic!r}; known: {', '.join(ITL_STATISTICS)}")
        try:
            fields[METRICS[metric]] = float(value)
        except ValueError:
            raise InputError(f"{where}: {value!r} is not a number of milliseconds") from None
        if statistic:
            fields["itl_stat"] = statistic
    try:
        return GoodputSLO.model_validate(fields)
    except ValidationError as exc:
        raise InputError(f"--goodput-slo: {validation_message(exc)}") from None


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
