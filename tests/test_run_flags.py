"""The run's flags described once (llmload.flagmodel): PlanFlags gives its flags' parser entries, reads
them back, and writes a command line that parses back to the same plan."""

from __future__ import annotations

import argparse

import pytest

from llmload.errors import InputError
from llmload.plan import PlanFlags


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    PlanFlags.add_arguments(parser)
    return parser


def test_the_defaults_parsed_are_the_models() -> None:
    assert PlanFlags.from_options(_parser().parse_args([])) == PlanFlags()


def test_a_plan_written_as_argv_parses_back_to_itself() -> None:
    plan = PlanFlags(
        workload="w.yaml", target_qps=2.5, stages="100", stage_duration_s=12.0, warmup_s=0.0, arrival="gamma",
        drain_s=15, seed=3, first_session=40, timeout_total=90.0, goodput_slo=("ttft=500", "e2e=2000"),
        cancel_share=0.1, gpu_hour_cost=2.25,
    )  # fmt: skip
    argv = plan.argv()
    assert argv[:4] == ["--workload", "w.yaml", "--target-qps", "2.5"] and "--goodput-slo=e2e=2000" in argv
    assert PlanFlags.from_options(_parser().parse_args(argv)) == plan
    assert plan.options() == list(dict.fromkeys(arg.split("=")[0] for arg in argv if arg.startswith("--")))


def test_only_the_fields_given_are_written() -> None:
    assert PlanFlags(target_qps=None, seed=0).argv() == ["--seed", "0"]
    assert PlanFlags(target_qps=None, seed=0).options() == ["--target-qps", "--seed"]


def test_a_value_out_of_range_names_its_flag() -> None:
    with pytest.raises(InputError, match=r"^--timeout-first-token: Input should be greater than 0"):
        PlanFlags.from_options(_parser().parse_args(["--timeout-first-token", "0"]))
    with pytest.raises(InputError, match=r"^--drain-timeout: Input should be greater than or equal to 0"):
        PlanFlags.from_options(_parser().parse_args(["--drain-timeout", "-1"]))


def test_a_literal_gives_choices_and_a_tuple_a_repeatable_flag() -> None:
    with pytest.raises(SystemExit):
        _parser().parse_args(["--arrival", "burst"])
    options = _parser().parse_args(["--goodput-slo", "ttft=1", "--goodput-slo", "e2e=2"])
    assert PlanFlags.from_options(options).goodput_slo == ("ttft=1", "e2e=2")
