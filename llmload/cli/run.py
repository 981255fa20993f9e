"""`llmload run`: the plain Locust run of the packaged locustfile, every flag Locust's or llmload's;
`llmload run --help` lists both (llmload.locust.main)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

HELP = "the plain Locust run of the packaged locustfile: llmload's flags and Locust's (--help lists both)"
PASSTHROUGH = True
OWN_HELP = True  # --help goes to Locust, which lists llmload's flags with its own


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None of its own: every flag goes to Locust."""


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    from llmload.locust.main import run_locust  # Locust patches the process with gevent: only for this command

    return run_locust(passthrough)
