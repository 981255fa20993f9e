"""How fast a server is, derived before any GPU is involved: the performance model.

- ``roofline``: one engine step's time on a GPU from what it reads and computes (`RooflineTiming`),
  and the few global constants fitted on public measurements (`Efficiency`, ``efficiency.yaml``).
- ``derive``: a model's `RooflineTiming` on a GPU of llmload/hardware under a server's settings
  (tensor parallelism, dtypes, quantization, CUDA graphs): `derive_timing`, `precision`.

Read by the simulator's profiles (llmload/sim/profiles.py), hence by `capacity`'s preflight, `sim
--vllm-config --gpu`, `sweep --predict` and `llmload predict`; docs/prediction.md.

Import each name from the module that defines it: this package re-exports nothing.
"""
