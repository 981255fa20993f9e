"""`llmload locustfile`: the path of the packaged locustfile, for `locust -f "$(llmload locustfile)"`."""

from __future__ import annotations

import argparse

from llmload.packaged import LOCUSTFILE

HELP = 'print the path of the packaged locustfile (locust -f "$(llmload locustfile)")'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None."""


def run(args: argparse.Namespace) -> int:
    print(LOCUSTFILE)
    return 0
