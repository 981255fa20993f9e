"""The repository's locustfile: the packaged one (llmload/locustfile.py), so `locust -f loadtests/chat.py` works.

locust -f loadtests/chat.py --headless --host http://127.0.0.1:8000 --target-qps 4 --stage-duration 30
"""

from llmload.locustfile import ChatUser, StagedRamp

__all__ = ["ChatUser", "StagedRamp"]
