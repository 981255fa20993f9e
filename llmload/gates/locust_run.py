"""A Locust run a gate starts (`llmload soak`, a search's probe, `make demo`), as typed flags: its command
line is written from the model, and the flags it sets are the fields its gate filled, which a user
may not pass through again (llmload.gates.passthrough)."""

from __future__ import annotations

import argparse
import sys
from typing import Annotated, ClassVar

from pydantic import ConfigDict

from llmload.flagmodel import Flag, FlagModel
from llmload.plan import PlanFlags

HEADLESS = ("--headless", "--only-summary")  # every gate's run: no web UI, the summary only


def add_host_argument(parser: argparse.ArgumentParser) -> None:
    """A gate's `--host` (soak, search): the target its runs load, None when not given, and the gate
    then starts the embedded target (`LocustRun.host`)."""
    parser.add_argument(
        "--host", default=None, help="target base URL, or replicas as URL,URL or @FILE (default: the embedded target)"
    )


class LocustRun(FlagModel):
    """The run's own flags (Locust's --host, llmload's run flags) and its plan's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str | None = None  # None: the embedded target (Locust's own flag)
    run_id: Annotated[str | None, Flag("run directory name (default: time + workload)")] = None
    reports_dir: Annotated[str, Flag("where run directories are written")] = "reports"
    verdict: Annotated[bool, Flag("judge the hold stage (soak criteria): exit code 0 PASS, 1 FAIL, 3 INCONCLUSIVE")] = (
        False
    )
    criteria: str | None = None  # with the criteria's own flags (llmload.gates.criteria)
    reset_prefix_cache: Annotated[
        bool,
        Flag(
            "empty the server's prefix cache before the run, where its kind offers that (vLLM: POST"
            " /reset_prefix_cache, with VLLM_SERVER_DEV_MODE=1); run.json says whether it was done"
        ),
    ] = False
    plan: PlanFlags = PlanFlags()

    RUN_FLAGS: ClassVar[tuple[str, ...]] = (
        "reset_prefix_cache",
        "run_id",
        "reports_dir",
        "verdict",
    )  # on Locust's parser, from these fields

    def command(self, locustfile: str) -> list[str]:
        """Its Locust command line, before the flags passed through (none of `options()`)."""
        return [sys.executable, "-m", "locust", "-f", locustfile, *HEADLESS, *self.argv()]

    def options(self) -> list[str]:
        return [*HEADLESS, *super().options()]
