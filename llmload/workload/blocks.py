"""Prompts given as prefix blocks: a trace's hash ids, kept as ids in the workload file, not as text.

Each id becomes the same text of exactly `block_size` tokens under the workload's tokenizer, drawn
from the id alone (`TextSynthesizer.keyed_text`), so requests that share ids share exactly that
prefix on the wire and requests that do not share none. A turn of blocks is its whole prompt,
history included (a trace's ids already cover the conversation so far): it is sent as one user
message, cut to the turn's `prompt_tokens` less what the chat template adds, with no history added.
A partial last block with no id of its own (WEKA traces name full blocks only) is text no other
request shares.
A file of ids, consecutive ones written as runs, stays smaller than its trace (the Mooncake
conversation trace: 1.7 MB of 3 MB, where its text was 810 MB), and its reusable prefix is the
trace's own, from the ids.
"""

from __future__ import annotations

from functools import lru_cache

from llmload.models import Message, Turn, WorkloadSpec
from llmload.workload.synth import TextSynthesizer
from llmload.workload.tokens import Tokenizer, get_tokenizer

_CACHED_BLOCKS = 4096  # texts kept: a block drawn again costs ~1 ms


class BlockText:
    """The text of block turns, for one tokenizer and block size."""

    def __init__(self, tokenizer: Tokenizer, block_size: int) -> None:
        self.block_size = block_size
        self._tokenizer = tokenizer
        self._template_tokens = tokenizer.count_chat([{"role": "user", "content": ""}])
        synth = TextSynthesizer(tokenizer)
        self._unshared = TextSynthesizer(tokenizer, seed=1)  # a stream: no two tails alike
        self._block = lru_cache(maxsize=_CACHED_BLOCKS)(lambda block_id: synth.keyed_text((block_id,), block_size))

    @classmethod
    def of(cls, spec: WorkloadSpec) -> BlockText | None:
        """The workload's block text; None for a workload of messages."""
        return None if spec.block_size is None else cls(get_tokenizer(spec.tokenizer), spec.block_size)

    def messages(self, turn: Turn) -> list[Message]:
        """What the turn sends: its messages, or its blocks' text as one user message whose chat
        prompt is `prompt_tokens` long."""
        if turn.blocks is None:
            return turn.messages
        wanted = max(1, (turn.prompt_tokens or 1) - self._template_tokens)
        parts = []
        for position, block_id in enumerate(turn.blocks):
            size = min(self.block_size, wanted - position * self.block_size)
            if size <= 0:
                break
            text = self._block(block_id)
            parts.append(
                text if size == self.block_size else self._tokenizer.decode(self._tokenizer.encode(text)[:size])
            )
        tail = wanted - len(turn.blocks) * self.block_size
        if tail > 0:  # a partial last block the trace gave no id: text of this request's own
            parts.append(self._unshared.text(tail))
        return [Message(role="user", content="".join(parts))]
