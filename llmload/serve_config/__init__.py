"""The server's configuration: what a `vllm serve` config file and command line say.

vLLM reads its serving settings from a YAML file (`vllm serve --config FILE`) and the command
line, the command line winning. This room reads both the same way, so capacity, the preflight,
the simulator and the sweep all start from the user's own configuration:

- ``options``: the options vLLM accepts, from a capture of the vLLM the tests run
  (``vllm-<version>.json``, refreshed by ``capture.py``), and how each value is read.
- ``reader``: ``read_serve_config`` turns a file and/or a command line into a ``ServeConfig``
  (llmload/models.py), refusing what vLLM would refuse, with the file and line.
"""
