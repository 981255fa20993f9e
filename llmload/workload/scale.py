"""`--scale-tokens F`: every length of a workload times F, its shares and its growth per turn kept.

An agentic trace's prompts run to hundreds of thousands of tokens; a small model's context is a few
thousand. Scaled, the same trace replays on a CPU vLLM or the embedded target:
- a turn of prefix blocks keeps its ids, and each block becomes `block_size × F` tokens, so requests
  share exactly the blocks they shared before and the reusable share of the workload is unchanged.
  F must make that a whole number of tokens; the error names the nearest factors that do;
- a turn of messages has each message cut to F of its tokens, so a prompt shared across sessions
  stays shared and a conversation's history grows by F of what it grew by;
- forced output lengths, max_tokens and the recorded prompt lengths are scaled alike, each at least 1.
Times (offsets, think times) are not scaled. The run records F among its flags, and its report says
the run was scaled. `--scale-to-max-prompt N` picks F for the user: the longest prompt becomes at most N.
"""

from __future__ import annotations

import dataclasses
import math

from llmload.models import Message, Session, Turn
from llmload.workload.files import Workload, WorkloadError
from llmload.workload.tokens import Tokenizer, get_tokenizer


def scaled(workload: Workload, factor: float) -> Workload:
    """The workload with every length times `factor` (0 < factor ≤ 1); the workload itself at 1."""
    if factor == 1:
        return workload
    if not 0 < factor < 1:
        raise WorkloadError(f"--scale-tokens {factor:g}: a factor in (0, 1] shrinks the workload's lengths")
    spec = workload.spec
    block_size = spec.block_size
    if block_size is not None:
        scaled_block = block_size * factor
        if abs(scaled_block - round(scaled_block)) > 1e-9 or round(scaled_block) < 1:
            below, above = max(1, math.floor(scaled_block)), math.ceil(scaled_block)
            raise WorkloadError(
                f"--scale-tokens {factor:g} makes {workload.path}'s blocks of {block_size} tokens"
                f" {scaled_block:g} tokens long; a block must stay whole to keep its share: try"
                f" {below / block_size:g} ({below} tokens)"
                + (f" or {above / block_size:g} ({above})" if above != below else "")
            )
    tokenizer = get_tokenizer(spec.tokenizer)
    return dataclasses.replace(
        workload,
        spec=spec.model_copy(
            update={"block_size": None if block_size is None else round(block_size * factor), "stats": None}
        ),
        sessions=[_session(session, factor, block_size, tokenizer) for session in workload.sessions],
    )


def factor_for_max_prompt(workload: Workload, max_prompt: int) -> float:
    """The largest factor that brings the longest prompt to at most `max_prompt` tokens (1 where it fits),
    of a block workload the largest that keeps a block a whole number of tokens."""
    from llmload.workload.stats import request_table  # pandas: not for every Locust start (llmload.plan)

    longest = int(request_table(workload).prompt_tokens.max())
    if longest <= max_prompt:
        return 1.0
    factor = max_prompt / longest
    block_size = workload.spec.block_size
    if block_size is not None:
        block = math.floor(block_size * factor)
        if block < 1:
            raise WorkloadError(
                f"--scale-to-max-prompt {max_prompt}: {workload.path}'s longest prompt of {longest:,} tokens would"
                f" need its blocks of {block_size} tokens under 1 token long; the least it can be is"
                f" {math.ceil(longest / block_size):,} tokens"
            )
        factor = block / block_size
    return factor


def _session(session: Session, factor: float, block_size: int | None, tokenizer: Tokenizer) -> Session:
    return session.model_copy(update={"turns": [_turn(turn, factor, block_size, tokenizer) for turn in session.turns]})


def _turn(turn: Turn, factor: float, block_size: int | None, tokenizer: Tokenizer) -> Turn:
    update: dict[str, object] = {
        "max_tokens": _length(turn.max_tokens, factor),
        "output_tokens": _length(turn.output_tokens, factor),
    }
    if turn.blocks is not None and block_size is not None and turn.prompt_tokens is not None:
        full, partial = divmod(turn.prompt_tokens, block_size)
        block = round(block_size * factor)
        # a partial block stays: partial where it has no id (the ids go on covering the prompt as they did)
        tail = min(block if len(turn.blocks) > full else block - 1, max(1, round(partial * factor))) if partial else 0
        update["prompt_tokens"] = max(1, full * block + tail)
    else:
        update["messages"] = [_message(message, factor, tokenizer) for message in turn.messages]
        update["prompt_tokens"] = _length(turn.prompt_tokens, factor)
    return turn.model_copy(update=update)


def _message(message: Message, factor: float, tokenizer: Tokenizer) -> Message:
    tokens = tokenizer.encode(message.content)
    if not tokens:
        return message
    return message.model_copy(update={"content": tokenizer.decode(tokens[: max(1, round(len(tokens) * factor))])})


def _length(tokens: int | None, factor: float) -> int | None:
    return None if tokens is None else max(1, round(tokens * factor))
