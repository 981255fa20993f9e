"""Locust glue, thin. Import it from a locustfile (loadtests/chat.py) and its users, shape and
event listeners are live; the engine it drives (plan, replay, recorder) runs without Locust.

- `flags`: llmload's flags on Locust's command line, and the plan they make
- `user`: `ChatUser`, a request slot that claims the next planned arrival and plays it
- `shape`: `StagedRamp`, enough users for the open-loop plan, and the run's end once every record is in
- `messaging`: a distributed run's workers ship their records and state to the master
- `views`: where a run is watched live: the LLM tab, the console lines, the Prometheus endpoint
- `state`: this process's part of a run (`ProcessRun`) and the state its event handlers share
- `process`: this process's part of a run, wired to Locust's events: a local run's, a master's or a worker's start
- `distributed`: a distributed run's coordination: the master's wait for its workers and watch for a lost
  one, the workers' records and refusals heard, a worker's right to run its share
- `main`: `llmload run`, Locust's main on the packaged locustfile with llmload's flags in its `--help`
"""

import llmload.locust.flags  # noqa: F401  (registers llmload's flags with Locust's parser)
from llmload.locust.shape import StagedRamp
from llmload.locust.user import ChatUser

__all__ = ["ChatUser", "StagedRamp"]
