"""The gates' error rates, measured against servers whose capacity is known exactly.

- ``servers``: a FIFO server with c slots and a continuous-batching server, each turning arrival times
  into first tokens and finishes.
- ``runs``: a run against one of them, planned, drained and recorded as llmload does, judged by the
  verdict's own code.
- ``grid``: the cells (server, hold, arrivals, load) and the tally of their verdicts over seeds.
- ``search``: ``llmload search``'s own loop, its probes made against such a server.
- ``compare``: ``llmload compare`` between runs of one server, and of it against a slower copy.
- ``walk``: how calm a saturated server's random walk can look (the verdict's table of quantiles).
"""
