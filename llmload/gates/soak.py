"""The soak: the release ritual in one run, ramp to 150% of the target and hold, then PASS or FAIL.

A thin wrapper over `locust -f loadtests/chat.py --headless --verdict`: the same run and verdict
a plain Locust invocation gives, with the soak's stages filled in. Flags it does not know (SLOs,
criteria, timeouts, Locust's own) are passed to Locust unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llmload import rundir
from llmload.errors import InputError
from llmload.gates.locust_run import LocustRun
from llmload.gates.passthrough import refuse_overrides
from llmload.plan import PlanFlags
from llmload.process_group import run_to_end
from llmload.schedule import DEFAULT_STAGES

DEFAULT_HOLD_S = 300.0  # the hold at the last stage: `soak --duration`'s default, `sweep --soak-duration`'s


@dataclass(frozen=True)
class SoakRun:
    """One soak: the Locust run `llmload soak` starts, and `llmload sweep --mode soak` per configuration."""

    locustfile: str
    workload: str
    target_qps: float | None  # None: the workload's
    ramp_stage_s: float
    hold_s: float
    host: str | None = None  # None: the embedded target
    run_id: str = "soak"
    reports_dir: str = "reports"

    def locust_run(self) -> LocustRun:
        """The soak as a Locust run: the default stages, the ramp's and the hold's lengths, judged."""
        plan = PlanFlags.checked(
            workload=self.workload, target_qps=self.target_qps, stages=DEFAULT_STAGES,
            stage_duration_s=self.ramp_stage_s, hold_duration_s=self.hold_s,
        )  # fmt: skip
        return LocustRun(host=self.host, run_id=self.run_id, reports_dir=self.reports_dir, verdict=True, plan=plan)

    def command(self) -> list[str]:
        """Its Locust command line, before the flags passed through (none of `options()`)."""
        return self.locust_run().command(self.locustfile)

    def options(self) -> list[str]:
        """The flags every soak run sets: refused among the flags passed through."""
        return self.locust_run().options()


def run_soak(soak: SoakRun, passthrough: Sequence[str] = ()) -> int:
    """Locust's exit code (0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE), after printing the verdict and the
    report's path; interrupted (Ctrl-C, SIGTERM), what was measured is printed, marked so, and the interrupt
    raised on."""
    refuse_overrides(soak.options(), passthrough, "the soak")
    if not Path(soak.locustfile).is_file():
        raise InputError(f"no locustfile at {soak.locustfile} (`llmload locustfile` prints the packaged one)")
    run_dir = Path(soak.reports_dir) / soak.run_id
    rundir.claim(run_dir)  # before Locust: a used directory's old verdict must not be read as this run's
    try:
        code = run_to_end([*soak.command(), *passthrough])
    except KeyboardInterrupt:
        _print_outcome(run_dir, interrupted=True)
        raise
    _print_outcome(run_dir, interrupted=False)
    return code


def _print_outcome(run_dir: Path, *, interrupted: bool) -> None:
    summary = rundir.read_summary(run_dir)
    if summary is not None:
        verdict = summary.verdict
        outcome = verdict.label if verdict is not None else "FAIL"
        print(f"\nllmload soak: {'interrupted: not judged' if interrupted else outcome}")
        for reason in verdict.reasons if verdict is not None else []:
            print(f"  - {reason}")
        print(f"report: {run_dir / rundir.REPORT_FILE}")
    elif interrupted:
        print("\nllmload soak: interrupted before the run wrote a report")
