"""Locust glue, thin: llmload's flags, the user, the load shape, and the messages between a
distributed run's processes. Import it from a locustfile (loadtests/chat.py) and its users, shape
and event listeners are live; the engine it drives (plan, replay, recorder) runs without Locust.
"""

from llmload.locust.shape import StagedRamp
from llmload.locust.user import ChatUser

__all__ = ["ChatUser", "StagedRamp"]
