"""KV-cache capacity for vLLM: what a model's KV cache holds on a server, and what a start-up log says.

It answers two questions. How many tokens and concurrent requests the KV cache of a model holds
on a given server (bytes per token, blocks, concurrency, max_model_len), and what the KV-cache
lines and errors of a vLLM start-up log mean and what to change. The arithmetic mirrors vLLM 0.32
itself (page sizes in ``vllm/v1/kv_cache_interface.py``, block counts, the startup check and the
logged capacity in ``vllm/v1/core/kv_cache_utils.py``), so the figures match the lines vLLM
prints at startup; docs/capacity.md explains each formula.

- ``model``: ModelSpec read from a HF config.json, the parameter estimate, and the bundled
  configs in ``models/`` (``known_models``, ``load_bundled_model``, ``load_config_file``).
- ``max_len``: the model's limit on max_model_len as vLLM derives and enforces it (``verify_max_model_len``).
- ``kv``: one GPU's KV page geometry (``kv_layout``), the block pool, concurrency per request length.
- ``overhead``: what vLLM's profile run takes per GPU besides weights (activation peak, non-torch
  memory), from the model and the batch settings (``estimate_overhead``).
- ``plan``: serving inputs, the per-GPU memory budget and ``plan_capacity``'s report with advice.
- ``vllm_log``: the start-up log explainer, ``explain_vllm_log``.
- ``render``: the text ``llmload capacity`` prints.

Import each name from the module that defines it: this package re-exports nothing. The command
line is ``llmload.capacity_cli``.
"""
