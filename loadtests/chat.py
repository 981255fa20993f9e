"""Replay a multi-turn chat workload, open loop, ramping to 150% of the target rate.

    locust -f loadtests/chat.py --headless --host http://127.0.0.1:8000 \
        --workload workloads/chat-multiturn.yaml --target-qps 4 --stage-duration 30

All logic lives in llmload.locust; `locust -f loadtests/chat.py --help` lists llmload's flags.
"""

from llmload.locust import ChatUser, StagedRamp

__all__ = ["ChatUser", "StagedRamp"]
