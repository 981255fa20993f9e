"""The preflight: whether a workload fits a vLLM configuration at every stage, before the load test.

- ``memory``: context fit per turn, concurrency fit per stage (Little's law against the KV pool and
  max_num_seqs, with each stage's predicted E2E), and the verdict ``llmload capacity --workload``
  exits with (memory and compute).
- ``compute``: whether the server can do the work: the workload's saturation rate on the server and
  each stage's share of it, prompt and output tokens/s asked, TTFT and E2E with queueing, through
  the simulator's engine on a virtual clock.
- ``render``: the text it prints.
"""
