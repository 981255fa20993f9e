"""`python -m llmload.sim ARGS`: what SimProcess starts."""

import sys

from llmload.sim.cli import main

sys.exit(main())
