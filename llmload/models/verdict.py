"""verdict.json's contract: a gate's outcome, the kinds of check it judges, and its exit codes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field, model_validator

CheckKind = Literal[
    "failures", "rate", "keeping_up", "slo", "goodput", "drift", "alert", "hold_length", "release", "prefix_cache"
]
"""What a verdict's check judges: `hold_length` fails a hold too short for the latencies it saw (a search
lengthens such a probe); `drift` and `keeping_up` fit a slope, and may fail marginally."""


VerdictOutcome = Literal["pass", "fail", "inconclusive"]
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "inconclusive": 3}
"""A gate's exit code by its outcome; 2 is bad input."""
"""`inconclusive`: no check failed, but one that decides whether the server keeps up could not be measured
(a hold too short for its answers or its noise): neither a pass nor the server's fault; exit code 3."""


class Verdict(BaseModel):
    outcome: VerdictOutcome
    reasons: list[str]
    failed_kinds: list[CheckKind] = Field(default_factory=list, description="the kind of each check that failed")
    inconclusive_kinds: list[CheckKind] = Field(
        default_factory=list, description="the kind of each check that could not tell (a longer hold would)"
    )
    hold_needed_s: float | None = Field(default=None, description="INCONCLUSIVE: about the hold that would tell")
    served_low_qps: float | None = Field(
        default=None,
        description="the rate the hold shows the server serves: its rate × (1 − the in-flight growth's upper bound)"
        " at keeping up's pass confidence; None where keeping up was not judged",
    )
    marginal: bool = Field(
        default=False,
        description="failed only on checks a second hold may reverse: a drift past its limit at the slope's "
        "estimate but not at its confidence interval's low end",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_passed(cls, data: Any) -> Any:
        """A verdict.json of an earlier llmload has only `passed`."""
        if isinstance(data, dict) and "outcome" not in data and "passed" in data:
            data = {**data, "outcome": "pass" if data["passed"] else "fail"}
        return data

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        """True only on PASS: INCONCLUSIVE never counts as passing."""
        return self.outcome == "pass"

    @property
    def label(self) -> str:
        return self.outcome.upper()
