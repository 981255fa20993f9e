"""The preflight: whether a workload fits a vLLM configuration at every stage, before the load test.

- ``memory``: context fit per turn, concurrency fit per stage (Little's law against the KV pool and
  max_num_seqs), and the verdict ``llmload capacity --workload`` exits with.
- ``render``: the text it prints.
"""
