"""`llmload sim`: an OpenAI-compatible server that looks like vLLM 0.32 on the wire.

The default target of the demo, the tests' loopback server and the benchmarks' reference: paced
token emission with measured lag, vLLM's exact error bodies, and injectable faults. The server
module (aiohttp) is imported only by what serves; SimProcess runs it in a child process.
"""

from llmload.sim.config import FaultSpec, SimConfig
from llmload.sim.process import SimProcess

__all__ = ["FaultSpec", "SimConfig", "SimProcess"]
