"""Chat prompts of a chosen length in the server's own tokens (vLLM's /tokenize and /detokenize),
none sharing a cached prefix with another.

A body of the right length is cut from a pool of filler tokens and turned back into text; each
prompt starts with its own head (this calibration's nonce and a serial number), so its first KV
block, and with it every block chained after it, is new to the prefix cache. The server's own
count of each prompt comes back in the response's usage, and that is what the fit uses.
"""

from __future__ import annotations

import itertools
import random
import secrets

from llmload.calibrate.target import get_json

# filler: common words in a seeded random order, so the pool is the same text on every run
WORDS = (
    "the server model queue token batch cache block engine request stream prompt answer step "
    "time load rate memory length context decode prefill latency first next value test run"
).split()
POOL_PIECE_WORDS = 2000
LENGTH_TRIES = 4  # /tokenize rounds per body length: the text of n tokens re-tokenizes to n ± a few


class PromptMaker:
    """`prompts(tokens, count)`: `count` chat contents whose whole chat prompt is about `tokens` long."""

    def __init__(self, url: str, model: str, seed: int = 0) -> None:
        self.url = url
        self.model = model
        self._nonce = secrets.token_hex(3)
        self._serial = itertools.count()
        self._random = random.Random(seed)
        self._pool: list[int] = []
        self._bodies: dict[int, str] = {}

    def _head(self) -> str:
        return f"{self._nonce}{next(self._serial):06d}"

    def chat_tokens(self, content: str) -> int:
        """The server's count of a one-message chat prompt (with the generation prompt, as served)."""
        return self.count([{"role": "user", "content": content}])

    def count(self, messages: list[dict[str, str]]) -> int:
        """The server's count of a chat prompt (with the generation prompt, as served)."""
        body = {"model": self.model, "messages": messages}
        return int(get_json(self.url, "/tokenize", body)["count"])

    def _filler(self, tokens: int) -> list[int]:
        while len(self._pool) < tokens:
            text = " ".join(self._random.choice(WORDS) for _ in range(POOL_PIECE_WORDS))
            body = {"model": self.model, "prompt": " " + text, "add_special_tokens": False}
            self._pool += get_json(self.url, "/tokenize", body)["tokens"]
        return self._pool[:tokens]

    def _text(self, tokens: int) -> str:
        if tokens <= 0:
            return ""
        return str(get_json(self.url, "/detokenize", {"model": self.model, "tokens": self._filler(tokens)})["prompt"])

    def body(self, tokens: int) -> str:
        """Filler text that makes a prompt (with a head) `tokens` long, or as near as the tokenizer allows."""
        if tokens not in self._bodies:
            sample_head = self._head()
            n = tokens - self.chat_tokens(sample_head)
            best = ""
            for _ in range(LENGTH_TRIES):
                best = self._text(n)
                missing = tokens - self.chat_tokens(sample_head + best)
                if missing == 0 or n + missing < 0:
                    break
                n += missing
            self._bodies[tokens] = best
        return self._bodies[tokens]

    def prompts(self, tokens: int, count: int) -> list[str]:
        body = self.body(tokens)
        return [self._head() + body for _ in range(count)]
