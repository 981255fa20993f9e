"""The hardware llmload reasons about, described once from its vendors' data sheets.

- ``gpus``: the GPUs `--gpu NAME` knows (`GpuSpec`, `GPUS`, `gpu`), one entry each in ``gpus.yaml``
  with every figure cited: memory as torch reports it, memory bandwidth, dense BF16/FP8/INT8 tensor
  throughput, the interconnect; ``peak_flops`` and ``hbm_bytes_per_s`` in per-second units. Read by
  capacity (memory) and the performance model (timing).

Import each name from the module that defines it: this package re-exports nothing.
"""
