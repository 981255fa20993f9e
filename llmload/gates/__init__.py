"""The gates: a run, or runs, judged PASS, FAIL or INCONCLUSIVE, and the commands built on that judgement.

- ``verdict``: the soak verdict's checks of a run (its hold stage), one reason line each.
- ``criteria``: what a hold must show to PASS (``SoakCriteria``), from a YAML file and the flags on top.
- ``locust_run``: the Locust run a gate starts, as typed flags: its command line and the flags it sets.
- ``soak``: ``llmload soak``, a Locust run with the soak's stages and the verdict.
- ``search``: ``llmload search``, the highest rate whose hold passes, probe by probe.
- ``compare``: ``llmload compare``, the bootstrap regression gate between two runs.
- ``passthrough``: the flags a gate hands to Locust, checked against those it sets itself.
"""
