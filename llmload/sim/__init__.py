"""`llmload sim`: an OpenAI-compatible server that behaves like vLLM 0.32, on the wire and under load.

The default target of the demo, the tests' loopback server and the benchmarks' reference: vLLM's
exact bodies and metrics, injectable faults, and either fixed pacing with measured lag or, with a
profile, a model of vLLM's engine (paged KV, batching, preemption). docs/simulator.md has it all.

- ``config``: what it is told (`SimConfig`: pacing, faults, the serving settings), checked once.
- ``server``: the HTTP server (aiohttp), imported only by what serves; ``process`` runs it in a
  child process (`SimProcess`).
- ``wire`` and ``protocol``: vLLM's exact bodies, errors and stream events, and the requests it accepts.
- ``pacing``: fixed TTFT and ITL with measured lag; ``engine``: vLLM's scheduler over a paged KV
  cache, timed by a profile (``profiles``: `serving: ServeConfig` + `timing`).
- ``metrics``: its /metrics, named as vLLM names them; ``faults``: the fault table.
"""

from llmload.sim.config import FaultSpec, SimConfig
from llmload.sim.process import SimProcess

__all__ = ["FaultSpec", "SimConfig", "SimProcess"]
