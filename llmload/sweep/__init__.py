"""``llmload sweep``: server configurations tried one after another, each with its own server and
its search (or soak), ranked into one table.

- ``configs``: the configurations, a base ``vllm serve --config`` file and what varies.
- ``server``: one configuration's server started, awaited, read for its startup figures and stopped.
- ``run``: the sweep itself, a row per configuration, and the best of them.
"""
