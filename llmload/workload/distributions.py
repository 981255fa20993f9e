"""Length and time distributions of `llmload workload synth`, each written as one flag value.

`KIND:KEY=VALUE,...` (or `fixed:VALUE`, or a bare number for fixed): `fixed:512`,
`uniform:low=100,high=400`, `normal:mean=300,sd=50`, `lognormal:median=400,sigma=0.8`,
`geometric:p=0.3`, `percentiles:p50=300,p90=900,p99=2000`. The simulator's reasoning mode takes
the same values (`llmload sim --reasoning-tokens`).
One strict model per kind behind one parser, so a misspelt key or an impossible request (P50 above
P99) is refused with its reason before anything is drawn.
"""

from __future__ import annotations

import itertools
from typing import Annotated, Literal

import numpy as np
from pydantic import Field, NonNegativeFloat, PositiveFloat, TypeAdapter, ValidationError, model_validator
from pydantic_core import ErrorDetails

from llmload.errors import InputError
from llmload.models import Strict


class Fixed(Strict):
    kind: Literal["fixed"]
    value: NonNegativeFloat

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value)


class Uniform(Strict):
    kind: Literal["uniform"]
    low: NonNegativeFloat
    high: NonNegativeFloat

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.high < self.low:
            raise ValueError(f"high={self.high:g} is below low={self.low:g}")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.uniform(self.low, self.high, n)


class Normal(Strict):
    kind: Literal["normal"]
    mean: float
    sd: NonNegativeFloat

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.normal(self.mean, self.sd, n)


class LogNormal(Strict):
    kind: Literal["lognormal"]
    median: PositiveFloat
    sigma: NonNegativeFloat

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.lognormal(np.log(self.median), self.sigma, n)


class Geometric(Strict):
    """Counts 1, 2, ... each `1 - p` times as likely as the one before (turns per session)."""

    kind: Literal["geometric"]
    p: float = Field(gt=0, le=1)

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.geometric(self.p, n).astype(float)


class Empirical(Strict):
    """Percentiles of a real distribution: the inverse CDF is piecewise linear through them, and its
    first and last segments extend to percentiles 0 (not below 0) and 100, so each given percentile
    is reproduced; give a low one (p1, p5) for a short lower tail."""

    kind: Literal["percentiles"]
    points: dict[float, float] = Field(description="percentile (0..100) -> value")

    @model_validator(mode="after")
    def _monotone(self) -> Empirical:
        if len(self.points) < 2:
            raise ValueError("give at least two percentiles, e.g. p50=300,p99=2000")
        for q in self.points:
            if not 0 <= q <= 100:
                raise ValueError(f"p{q:g} is not a percentile (0..100)")
        ordered = sorted(self.points.items())
        for (q_lo, v_lo), (q_hi, v_hi) in itertools.pairwise(ordered):
            if v_lo > v_hi:
                raise ValueError(f"p{q_lo:g}={v_lo:g} is above p{q_hi:g}={v_hi:g}: percentiles cannot decrease")
        return self

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ordered = sorted(self.points.items())
        qs = [q / 100 for q, _ in ordered]
        vs = [v for _, v in ordered]
        if qs[0] > 0:  # extend the first segment down to percentile 0
            slope = (vs[1] - vs[0]) / (qs[1] - qs[0])
            qs.insert(0, 0.0)
            vs.insert(0, max(0.0, vs[0] - slope * qs[1]))
        if qs[-1] < 1:
            slope = (vs[-1] - vs[-2]) / (qs[-1] - qs[-2])
            vs.append(vs[-1] + slope * (1 - qs[-1]))
            qs.append(1.0)
        return np.interp(rng.random(n), qs, vs)


Distribution = Annotated[Fixed | Uniform | Normal | LogNormal | Geometric | Empirical, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[Distribution] = TypeAdapter(Distribution)
KINDS = ("fixed", "uniform", "normal", "lognormal", "geometric", "percentiles")


def parse_distribution(text: str, flag: str) -> Distribution:
    """A distribution from its flag value; an `InputError` naming the flag and the reason otherwise."""
    kind, _, body = text.partition(":")
    if kind.replace(".", "", 1).isdigit() and not body:  # a bare number: fixed
        kind, body = "fixed", kind
    if kind not in KINDS:
        raise InputError(
            f"{flag} {text!r}: unknown distribution {kind!r}; one of {', '.join(KINDS)} (KIND:KEY=VALUE,...)"
        )
    fields: dict[str, object] = {"kind": kind}
    try:
        if kind == "fixed":
            fields["value"] = float(body)
        else:
            pairs = [item.split("=", 1) for item in body.split(",") if item]
            if any(len(pair) != 2 for pair in pairs):
                raise ValueError(f"expected KEY=VALUE pairs, not {body!r}")
            if kind == "percentiles":
                if any(not key.startswith("p") for key, _ in pairs):
                    raise ValueError("keys are percentiles: p50=300,p99=2000")
                fields["points"] = {float(key[1:]): float(value) for key, value in pairs}
            else:
                fields.update({key: float(value) for key, value in pairs})
        return _ADAPTER.validate_python(fields)
    except ValidationError as exc:
        reasons = "; ".join(_reason(err) for err in exc.errors())
        raise InputError(f"{flag} {text!r}: {reasons}") from None
    except ValueError as exc:
        raise InputError(f"{flag} {text!r}: {exc}") from None


def _reason(err: ErrorDetails) -> str:
    loc = [str(part) for part in err["loc"][1:]]  # the first part is the kind
    message = {"extra_forbidden": "unknown key", "missing": "missing"}.get(
        err["type"], str(err["msg"]).removeprefix("Value error, ")
    )
    return f"{'.'.join(loc)}: {message}" if loc else message
