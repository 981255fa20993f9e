"""Calibration: a simulator profile fitted to a real vLLM server (`llmload sim calibrate`), and how
far its predictions hold against that server.

- ``target``: what the server says about itself (its model, context length, KV pool), as the
  ``ServeConfig`` it runs with and the notes on what it does not say.
- ``prompts``: prompts of chosen token lengths, made with the server's tokenizer.
- ``measure``: probe shapes (``ProbeShape``) timed by the server's /metrics in rounds within a
  budget, and a steady-load point of Poisson arrivals.
- ``regression``: the least-squares step-time model, fitted through the simulator's own
  scheduler, and the steady-load factor through its virtual-clock replay.
- ``run``: the orchestration (``calibrate``): measure and fit, then build the profile's record.
- ``render``: the fit as printed; ``fidelity``: how far a prediction held against the server.
"""
