"""`llmload run`: the plain Locust run of the packaged locustfile, every flag Locust's or llmload's
(`llmload run --help` lists both: Locust prints its help before it loads a locustfile, so
llmload's flags are registered first, here)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from llmload.packaged import LOCUSTFILE

HELP = "the plain Locust run of the packaged locustfile: llmload's flags and Locust's (--help lists both)"
PASSTHROUGH = True
OWN_HELP = True  # --help goes to Locust, which lists llmload's flags with its own


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None of its own: every flag goes to Locust."""


def run(args: argparse.Namespace, passthrough: Sequence[str] = ()) -> int:
    from locust.main import main as locust_main

    import llmload.locust.flags  # noqa: F401  (registers llmload's flags before Locust builds --help)

    sys.argv = ["llmload run", "-f", str(LOCUSTFILE), *passthrough]
    try:
        locust_main()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0
