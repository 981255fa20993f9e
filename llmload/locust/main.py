"""`llmload run`: Locust's own main on the packaged locustfile, llmload's flags registered first, so
its `--help` lists them with Locust's (Locust prints its help before it loads a locustfile)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from locust.main import main as locust_main

import llmload.locust.flags  # noqa: F401  (registers llmload's flags with Locust's parser)
from llmload.packaged import LOCUSTFILE


def run_locust(args: Sequence[str]) -> int:
    """Locust's exit code for `locust -f LOCUSTFILE ARGS`, run in this process."""
    sys.argv = ["llmload run", "-f", str(LOCUSTFILE), *args]
    try:
        locust_main()
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    return 0
