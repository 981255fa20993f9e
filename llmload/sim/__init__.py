"""`llmload sim`: an OpenAI-compatible server that behaves like vLLM 0.32, on the wire and under load.

The default target of the demo, the tests' loopback server and the benchmarks' reference: vLLM's
exact bodies and metrics, injectable faults, and either fixed pacing with measured lag or, with a
profile, a model of vLLM's engine (paged KV, batching, preemption). docs/simulator.md has it all.
The server module (aiohttp) is imported only by what serves; SimProcess runs it in a child process.
"""

from llmload.sim.config import FaultSpec, SimConfig
from llmload.sim.process import SimProcess

__all__ = ["FaultSpec", "SimConfig", "SimProcess"]
