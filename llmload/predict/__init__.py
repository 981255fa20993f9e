"""What a server would measure, predicted in seconds without one (`llmload predict`).

- ``bench``: a `vllm bench serve` load (`BenchLoad`) through the simulator's engine on a virtual
  clock, and the figures vLLM's client prints, under its names (`BenchResult`, `predict_bench`).
- ``points``: files of measured points (tests/data/gputruth is the public one) predicted and compared,
  figure by figure (`load_points`, `predict_point`, `accuracy`).
- ``render``: both as text.

docs/prediction.md. Import each name from the module that defines it: this package re-exports nothing.
"""
