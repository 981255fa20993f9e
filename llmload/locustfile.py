"""The locustfile: replay a multi-turn chat workload, open loop, ramping to 150% of the target rate.

    llmload run --headless --host http://127.0.0.1:8000 --target-qps 4 --stage-duration 30
    locust -f "$(llmload locustfile)" --headless --host http://127.0.0.1:8000 --target-qps 4

It ships in the package, so an installed llmload needs no checkout; the repository's
loadtests/chat.py imports it. All logic lives in llmload.locust, whose flags.py lists llmload's
flags (`llmload run --help` shows them with Locust's).
"""

from llmload.locust import ChatUser, StagedRamp

__all__ = ["ChatUser", "StagedRamp"]
