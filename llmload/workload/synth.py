"""Synthetic text and workloads: text of an exact token count, and multi-turn chat sessions.

Exact counts matter: a replay must send the prompt lengths the workload promises. Text is built
from words that are one token each in the chosen tokenizer, so n words are n tokens; the result
is checked with the tokenizer itself. Length-only traces (issue 3) and `--redact` reuse this.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from llmload.models import Message, Session, Turn, WorkloadSource, WorkloadSpec
from llmload.workload.tokens import Tokenizer, get_tokenizer

_WORDS = """
the of and to in is was for on that with as by at from his it an were are which this be has or had
not but first one their its new after who they two her she been other when there all during into
school time may years more most only over city some world would where later up such used many can
state about national out known university united then made three before also well than under system
team people year part game work since between both these found second each life through number way
them area until well while however another day series place house while around service data model
request server memory cache token queue batch latency window answer question help please thanks
order account price report plan check update support issue error problem change email today week
month name phone address store product customer delivery return refund
""".split()


class TextSynthesizer:
    """Deterministic filler text whose token count is exact for one tokenizer."""

    def __init__(self, tokenizer: Tokenizer, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self._rng = np.random.default_rng(seed)
        single = [w for w in dict.fromkeys(_WORDS) if len(tokenizer.encode(" " + w)) == 1]
        if len(single) < 20:
            raise ValueError(f"tokenizer {tokenizer.name} has too few single-token words to synthesize text")
        self._vocab = np.array([" " + w for w in single])

    def text(self, n_tokens: int) -> str:
        if n_tokens <= 0:
            return ""
        words = self._vocab[self._rng.integers(0, len(self._vocab), n_tokens)]
        text = "".join(words.tolist())
        counted = self.tokenizer.count(text)
        if counted != n_tokens:  # a tokenizer that merges across words: trim or pad until exact
            while counted > n_tokens:
                text = text[: text.rfind(" ")]
                counted = self.tokenizer.count(text)
            while counted < n_tokens:
                text += str(self._vocab[self._rng.integers(0, len(self._vocab))])
                counted = self.tokenizer.count(text)
        return text


def _lognormal_ints(rng: np.random.Generator, median: float, sigma: float, n: int, *, lo: int, hi: int) -> list[int]:
    return np.clip(np.rint(rng.lognormal(np.log(median), sigma, n)), lo, hi).astype(int).tolist()


def synthesize_chat_workload(
    name: str,
    *,
    sessions: int = 200,
    seed: int = 0,
    max_turns: int = 8,
    system_prompts: Sequence[int] = (180, 320, 650),
    user_tokens_median: float = 90,
    output_tokens_median: float = 160,
    think_time_median_s: float = 4.0,
    tokenizer: str = "cl100k_base",
) -> tuple[WorkloadSpec, list[Session]]:
    """Multi-turn chat sessions with production-like length tails.

    Turns per session fall off geometrically from 1 to `max_turns`; user messages and replies
    are log-normal (long right tails, as in real chat logs); a few shared system prompts let
    prefix caching behave as it does in production.
    """
    rng = np.random.default_rng(seed)
    synth = TextSynthesizer(get_tokenizer(tokenizer), seed)
    systems = [synth.text(n) for n in system_prompts]
    system_tokens = list(system_prompts)
    turn_counts = np.minimum(rng.geometric(0.3, sessions), max_turns).tolist()
    offsets = np.cumsum(rng.exponential(1.0, sessions)).tolist()
    out: list[Session] = []
    for index, n_turns in enumerate(turn_counts):
        system_choice = int(rng.integers(0, len(systems)))
        user_lengths = _lognormal_ints(rng, user_tokens_median, 0.9, n_turns, lo=4, hi=4000)
        output_lengths = _lognormal_ints(rng, output_tokens_median, 0.7, n_turns, lo=8, hi=1024)
        thinks = np.clip(rng.lognormal(np.log(think_time_median_s), 0.8, n_turns), 0.5, 60.0).round(2).tolist()
        history = system_tokens[system_choice]
        turns = []
        for k in range(n_turns):
            messages = [Message(role="user", content=synth.text(user_lengths[k]))]
            if k == 0:
                messages.insert(0, Message(role="system", content=systems[system_choice]))
            history += user_lengths[k]
            turns.append(
                Turn(
                    messages=messages,
                    max_tokens=output_lengths[k],
                    output_tokens=output_lengths[k],
                    think_time_s=0.0 if k == 0 else thinks[k],
                    prompt_tokens=history,
                )
            )
            history += output_lengths[k]
        out.append(Session(id=f"{name}-{index:05d}", offset_s=round(offsets[index], 3), turns=turns))
    spec = WorkloadSpec(
        version=1,
        name=name,
        source=WorkloadSource(
            format="synthetic-chat",
            built_at=datetime.now(UTC).replace(microsecond=0),
            generator={
                "sessions": sessions,
                "seed": seed,
                "max_turns": max_turns,
                "system_prompts": list(system_prompts),
                "user_tokens_median": user_tokens_median,
                "output_tokens_median": output_tokens_median,
                "think_time_median_s": think_time_median_s,
            },
        ),
        tokenizer=tokenizer,
        sessions=f"{name}.sessions.jsonl",
    )
    return spec, out
