"""Synthetic text and workloads: text of an exact token count, and multi-turn chat sessions.

Exact counts matter: a replay must send the prompt lengths the workload promises. Text is built
from words that are one token each in the chosen tokenizer, so n words are n tokens; the result
is checked with the tokenizer itself. Length-only traces (issue 3) and `--redact` reuse this.

A workload is made in two steps: session shapes (lengths and times, no text), drawn from the
`SynthOptions` distributions or copied from a real workload (`like`), then text of those lengths,
with shared prefixes (system prompts, documents) at the start of a chosen share of sessions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

import numpy as np
from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, ValidationError

from llmload.errors import InputError, validation_message
from llmload.models import Message, Session, Strict, Turn, WorkloadSource, WorkloadSpec
from llmload.workload.distributions import Distribution, Geometric, LogNormal
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
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        single = [w for w in dict.fromkeys(_WORDS) if len(tokenizer.encode(" " + w)) == 1]
        if len(single) < 20:
            raise ValueError(f"tokenizer {tokenizer.name} has too few single-token words to synthesize text")
        self._vocab = np.array([" " + w for w in single])

    def text(self, n_tokens: int) -> str:
        """The next text of the synthesizer's stream."""
        return self._draw(self._rng, n_tokens)

    def keyed_text(self, key: tuple[int, ...], n_tokens: int) -> str:
        """Text that is a function of `key` (non-negative integers) and the seed alone: the same key
        gives the same text whenever it is asked for, so texts named by an id (a trace's prefix block)
        are shared exactly however many other texts came between."""
        return self._draw(np.random.default_rng([self._seed, *key]), n_tokens)

    def _draw(self, rng: np.random.Generator, n_tokens: int) -> str:
        if n_tokens <= 0:
            return ""
        words = self._vocab[rng.integers(0, len(self._vocab), n_tokens)]
        text = "".join(words.tolist())
        counted = self.tokenizer.count(text)
        if counted != n_tokens:  # a tokenizer that merges across words: trim or pad until exact
            while counted > n_tokens:
                text = text[: text.rfind(" ")]
                counted = self.tokenizer.count(text)
            while counted < n_tokens:
                text += str(self._vocab[rng.integers(0, len(self._vocab))])
                counted = self.tokenizer.count(text)
        return text


class PrefixPool(Strict):
    """`--shared-prefix COUNT:TOKENS`: COUNT different prefixes (system prompts, documents) of TOKENS each."""

    count: PositiveInt
    tokens: PositiveInt

    @classmethod
    def parse(cls, text: str) -> PrefixPool:
        count, _, tokens = text.partition(":")
        try:
            return cls(count=int(count), tokens=int(tokens))
        except (ValueError, ValidationError):
            raise InputError(f"--shared-prefix {text!r}: expected COUNT:TOKENS, two positive integers") from None


class Popularity(Strict):
    """How often each prefix of a pool is chosen: Zipf (the k-th most popular ~ 1/k^s) or uniform."""

    zipf_s: float | None = Field(default=1.1, gt=0, description="None: uniform")

    @classmethod
    def parse(cls, text: str) -> Popularity:
        if text == "uniform":
            return cls(zipf_s=None)
        kind, _, exponent = text.partition(":")
        try:
            if kind != "zipf":
                raise ValueError
            return cls(zipf_s=float(exponent))
        except (ValueError, ValidationError):
            raise InputError(f"--prefix-popularity {text!r}: expected uniform or zipf:S with S > 0") from None

    def weights(self, count: int) -> np.ndarray:
        ranks = np.arange(1, count + 1, dtype=float)
        raw = np.ones(count) if self.zipf_s is None else ranks**-self.zipf_s
        return raw / raw.sum()


class SynthOptions(Strict):
    """What `llmload workload synth` draws; token counts are under `tokenizer`, clipped at 1."""

    sessions: PositiveInt = 200
    seed: NonNegativeInt = 0
    turns: Distribution = Geometric(kind="geometric", p=0.3)
    max_turns: PositiveInt = 8
    prompt_tokens: Distribution = Field(
        default=LogNormal(kind="lognormal", median=90, sigma=0.9), description="new tokens of each turn"
    )
    output_tokens: Distribution = LogNormal(kind="lognormal", median=160, sigma=0.7)
    output_length: Literal["fixed", "free"] = Field(
        default="fixed", description="fixed: the reply is forced to its drawn length; free: that length is max_tokens"
    )
    think_time_s: Distribution = LogNormal(kind="lognormal", median=4.0, sigma=0.8)
    session_rate: PositiveFloat = Field(default=1.0, description="sessions started per second (Poisson)")
    shared_prefixes: list[PrefixPool] = Field(default_factory=lambda: [PrefixPool(count=3, tokens=400)])
    prefix_popularity: Popularity = Popularity()
    prefix_sessions: float = Field(default=1.0, ge=0, le=1, description="share of sessions that start with prefixes")
    tokenizer: str = "cl100k_base"

    @classmethod
    def from_flags(cls, **values: object) -> SynthOptions:
        """The options from command-line values; a refused value is an `InputError` naming its flag."""
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise InputError(validation_message(exc, flags={"think_time_s": "think-time"})) from None


@dataclass
class SessionShape:
    """A session without its text: what each turn adds, its reply, and when it is sent."""

    new_tokens: list[int]
    output_tokens: list[int | None]
    think_times_s: list[float]  # per turn; the first turn's is 0
    offset_s: float | None
    at_s: list[float] | None = None  # per turn, when it is sent after the first: copied from a real session


def draw_tokens(distribution: Distribution, rng: np.random.Generator, n: int) -> list[int]:
    """Token counts: whole numbers, at least 1."""
    return np.maximum(np.rint(distribution.draw(rng, n)), 1).astype(int).tolist()


def draw_seconds(distribution: Distribution, rng: np.random.Generator, n: int) -> list[float]:
    return np.maximum(distribution.draw(rng, n), 0.0).round(2).tolist()


def draw_shapes(options: SynthOptions, rng: np.random.Generator) -> list[SessionShape]:
    turn_counts = np.clip(np.rint(options.turns.draw(rng, options.sessions)), 1, options.max_turns).astype(int)
    offsets = np.cumsum(rng.exponential(1 / options.session_rate, options.sessions)).round(3).tolist()
    shapes = []
    for n_turns, offset in zip(turn_counts.tolist(), offsets, strict=True):
        thinks = draw_seconds(options.think_time_s, rng, n_turns)
        shapes.append(
            SessionShape(
                new_tokens=draw_tokens(options.prompt_tokens, rng, n_turns),
                output_tokens=list(draw_tokens(options.output_tokens, rng, n_turns)),
                think_times_s=[0.0, *thinks[1:]],
                offset_s=offset,
            )
        )
    return shapes


class _Prefixes:
    """The shared prefixes: one text per prefix, chosen per session by popularity."""

    def __init__(self, options: SynthOptions, synth: TextSynthesizer, rng: np.random.Generator) -> None:
        self._options = options
        self._rng = rng
        self._texts = [[synth.text(pool.tokens) for _ in range(pool.count)] for pool in options.shared_prefixes]
        self._weights = [options.prefix_popularity.weights(pool.count) for pool in options.shared_prefixes]

    def choose(self) -> str:
        """The prefix text of the next session ("" for one that starts without)."""
        if not self._texts or self._rng.random() >= self._options.prefix_sessions:
            return ""
        return "".join(
            texts[self._rng.choice(len(texts), p=w)] for texts, w in zip(self._texts, self._weights, strict=True)
        )


def _leading_words(text: str, words: int) -> str:
    """The first `words` words of synthesized text (one token each in its tokenizer), all of it when shorter."""
    if words <= 0:
        return ""
    parts = text.split(" ")  # synthesized text starts with a space: parts[0] == ""
    return text if len(parts) <= words + 1 else " ".join(parts[: words + 1])


def synthesize_workload(
    name: str,
    options: SynthOptions,
    *,
    shapes: list[SessionShape] | None = None,
    prefix_in_first_turn: bool = False,
    generator: dict[str, object] | None = None,
) -> tuple[WorkloadSpec, list[Session]]:
    """Sessions of the given shapes (drawn from `options` when None) made into text.

    A session's prefix is its first message (system); with `prefix_in_first_turn` it takes its
    tokens from the first turn's new tokens (shapes copied from a real workload already hold them),
    cut to its leading words where the first turn is shorter, so the prompt lengths stay the shapes'
    (the cut prefix still shares its full blocks with the whole one); else it comes on top.
    Each turn's `prompt_tokens` is the history as the tokenizer counts it.
    """
    rng = np.random.default_rng(options.seed)
    tokenizer = get_tokenizer(options.tokenizer)
    synth = TextSynthesizer(tokenizer, options.seed)
    shapes = draw_shapes(options, rng) if shapes is None else shapes
    prefixes = _Prefixes(options, synth, rng)
    out: list[Session] = []
    for index, shape in enumerate(shapes):
        prefix = prefixes.choose()
        if prefix_in_first_turn:
            prefix = _leading_words(prefix, shape.new_tokens[0] - 1)
        history = tokenizer.count(prefix) if prefix else 0
        turns = []
        for k, (new, output, think) in enumerate(
            zip(shape.new_tokens, shape.output_tokens, shape.think_times_s, strict=True)
        ):
            user = max(1, new - history) if k == 0 and prefix_in_first_turn else new
            messages = [Message(role="user", content=synth.text(user))]
            if k == 0 and prefix:
                messages.insert(0, Message(role="system", content=prefix))
            history += user
            forced = output if options.output_length == "fixed" else None
            turns.append(
                Turn(
                    messages=messages,
                    max_tokens=output,
                    output_tokens=forced,
                    think_time_s=think,
                    at_s=shape.at_s[k] if shape.at_s is not None and k else None,
                    prompt_tokens=history,
                )
            )
            history += output or 0
        out.append(Session(id=f"{name}-{index:05d}", offset_s=shape.offset_s, turns=turns))
    made_by = generator if generator is not None else options.model_dump(mode="json")
    return synthetic_spec(name, "synthetic-chat", made_by, options.tokenizer), out


def synthetic_spec(
    name: str, kind: str, generator: dict[str, object], tokenizer: str, *, block_size: int | None = None
) -> WorkloadSpec:
    """The spec of a synthesized workload: what made it, and its sessions file beside it."""
    return WorkloadSpec(
        version=1,
        name=name,
        source=WorkloadSource(format=kind, built_at=datetime.now(UTC).replace(microsecond=0), generator=generator),
        tokenizer=tokenizer,
        sessions=f"{name}.sessions.jsonl",
        block_size=block_size,
    )
