"""Replay a multi-turn chat workload, open loop, ramping to 150% of the target rate.

    locust -f loadtests/chat.py --headless --host http://127.0.0.1:8000 \
        --workload workloads/chat-multiturn.yaml --target-qps 4 --stage-duration 30

All logic lives in llmload: the Locust glue is llmload.locust, whose flags.py lists llmload's
flags (Locust 2.47 prints `--help` before it loads a locustfile, so its help does not show them;
README.md does).
"""

from llmload.locust import ChatUser, StagedRamp

__all__ = ["ChatUser", "StagedRamp"]
