"""A Locust run a gate starts (`llmload soak`, a search's probe, `make demo`), as typed flags: its command
line is written from the model, and the flags it sets are the fields its gate filled, which a user
may not pass through again (llmload.gates.passthrough)."""

from __future__ import annotations

import sys

from pydantic import ConfigDict

from llmload.flagmodel import FlagModel
from llmload.plan import PlanFlags

HEADLESS = ("--headless", "--only-summary")  # every gate's run: no web UI, the summary only


class LocustRun(FlagModel):
    """The run's own flags (Locust's --host, llmload's run flags) and its plan's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None = None  # None: the embedded target
    run_id: str | None = None
    reports_dir: str = "reports"
    verdict: bool = False
    criteria: str | None = None
    reset_prefix_cache: bool = False
    plan: PlanFlags = PlanFlags()

    def command(self, locustfile: str) -> list[str]:
        """Its Locust command line, before the flags passed through (none of `options()`)."""
        return [sys.executable, "-m", "locust", "-f", locustfile, *HEADLESS, *self.argv()]

    def options(self) -> list[str]:
        return [*HEADLESS, *super().options()]
