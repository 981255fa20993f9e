"""`llmload workload synth --like`: a synthetic workload with a real one's figures and none of its text.

Matching approach: the real sessions' length skeletons (each turn's new prompt tokens, its output
tokens, the time since the previous turn, the session's start gap) are resampled and given
synthetic text of exactly those token counts. Drawing per-turn lengths from fitted distributions
would lose how a session's turns relate (history growth, long sessions of long messages), and the
real per-turn prompt percentiles would only be approached. The resampling is not a plain draw:
a draw of a few thousand sessions moves a P99 by more than the 5% the check allows on its own, so
the sessions are taken stratified, then swapped until the checked percentiles hold (`Resample`).

The reusable-prefix history share comes with the shapes; the shared share is matched by one pool
of shared prefixes sized to it (`like_prefixes`), since the real figure is an aggregate.

The check does not trust the resampling: the written workload is read back, its prompt lengths are
the history of the tokenizer-counted text, and `workload_stats` computes both sides' figures the
same way. Figures are rows of data (`figures`), each with its tolerance, so adding one is one row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, NamedTuple

import numpy as np
import pandas as pd

from llmload.format import fmt
from llmload.models import ChatTemplate, ReusablePrefix
from llmload.workload.prefix import PromptLayout
from llmload.workload.stats import WorkloadStats
from llmload.workload.synth import (
    PrefixPool,
    SessionShape,
    SynthOptions,
    TextSynthesizer,
    draw_seconds,
    draw_tokens,
)
from llmload.workload.tokens import get_tokenizer

RELATIVE_TOLERANCE = 0.05
POINTS_TOLERANCE = 5.0
MIN_TURN_REQUESTS = 50  # a per-turn percentile of fewer requests is too noisy to judge
_QUANTILES = ("p50", "p90", "p95", "p99")


class Skeleton(NamedTuple):
    """A real session's lengths and times: each turn's new prompt tokens, its output tokens, its think time,
    and when it was sent after the session's first turn (None where the source has no times)."""

    new_tokens: list[int]
    output_tokens: list[int | None]
    think_times_s: list[float]
    at_s: list[float] | None

    def arrivals(self) -> np.ndarray:
        """Each turn's time after the session's first: as recorded, else the think times summed."""
        return np.array(self.at_s) if self.at_s is not None else np.cumsum(self.think_times_s)


def _balanced(total: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """n indexes into `total` items: each item n // total times, the rest without replacement, shuffled."""
    picked = np.concatenate([np.tile(np.arange(total), n // total), rng.choice(total, n % total, replace=False)])
    return rng.permutation(picked)


def _skeletons(table: pd.DataFrame) -> list[Skeleton]:
    """Each real session's skeleton, in the table's order of sessions."""
    by_session = table.groupby("session_id", sort=False)
    prompt = table["prompt_tokens"].to_numpy(dtype=float)
    output = table["output_tokens"].to_numpy(dtype=float)
    previous = by_session["prompt_tokens"].shift().to_numpy(dtype=float) + np.nan_to_num(
        by_session["output_tokens"].shift().to_numpy(dtype=float)
    )
    first = table["turn"].to_numpy() == 0
    new = np.maximum(np.where(first, prompt, prompt - previous), 1).astype(int)
    think = np.nan_to_num(table["think_s"].to_numpy(dtype=float)).round(3)
    arrival = table["arrival_s"].to_numpy(dtype=float)
    at = (arrival - by_session["arrival_s"].transform("first").to_numpy(dtype=float)).round(3)
    codes = pd.factorize(table["session_id"])[0]
    bounds = np.flatnonzero(np.diff(codes)) + 1
    return [
        Skeleton(
            news.tolist(),
            [None if np.isnan(o) or o < 1 else int(o) for o in outs],
            [0.0, *thinks[1:].tolist()],
            None if np.isnan(ats).any() else ats.tolist(),
        )
        for news, outs, thinks, ats in zip(
            np.split(new, bounds), np.split(output, bounds), np.split(think, bounds), np.split(at, bounds), strict=True
        )
    ]


def resampled_starts(starts: np.ndarray, n: int, rng: np.random.Generator) -> list[float | None]:
    """n start offsets whose gaps are the real starts' gaps, each taken in turn (None when a start is unknown)."""
    if np.isnan(starts).any():
        return [None] * n
    gaps = np.diff(np.sort(starts))
    chosen = gaps[_balanced(gaps.size, n - 1, rng)] if gaps.size else np.zeros(n - 1)
    return np.concatenate([[0.0], np.cumsum(chosen)]).tolist()


def like_shapes(table: pd.DataFrame, sessions: int, rng: np.random.Generator) -> list[SessionShape]:
    """`sessions` session shapes resampled from a request table's sessions (lengths and times only)."""
    real = _skeletons(table)
    starts = table.groupby("session_id", sort=False)["arrival_s"].first().to_numpy(dtype=float)
    offsets = resampled_starts(starts, sessions, rng)
    picked = [real[i] for i in rng.permutation(Resample.of_skeletons(real).pick(sessions, rng)).tolist()]
    if offsets[0] is not None:
        arrivals = [skeleton.arrivals() for skeleton in picked]
        offsets = paced(np.asarray(offsets), arrivals, request_rate(table["arrival_s"].to_numpy(dtype=float)))
    return [
        SessionShape(
            new_tokens=skeleton.new_tokens,
            output_tokens=skeleton.output_tokens,
            think_times_s=skeleton.think_times_s,
            offset_s=offset,
            at_s=skeleton.at_s,
        )
        for skeleton, offset in zip(picked, offsets, strict=True)
    ]


_PICK_QUANTILES = np.array([float(q[1:]) for q in _QUANTILES])
_PICK_GOAL = 0.4  # a pick is good enough when every figure is within this share of its tolerance
_PICK_ROUNDS = 400
_PICK_STALL = 40  # rounds in a row without a better swap that end the search
_PICK_TRIES = 16  # swaps weighed per round
_PICK_BAND = 3.0  # percentiles either side of a missed one where the sessions swapped are looked for


@dataclass(frozen=True)
class RequestFigures:
    """Per request: its unit of resampling, its session (numbered from 0), its turn index, its prompt and
    output tokens, and its think time (NaN for a first turn)."""

    units: np.ndarray
    sessions: np.ndarray
    turns: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    think: np.ndarray


class Resample:
    """Which real sessions a synthetic workload of fewer (or not a multiple as many) sessions takes.

    Every session is taken n // N times; the other n % N are a stratified sample: the sessions
    sorted by their longest prompt and cut into n % N strata of equal count, one drawn from each,
    so every band of lengths is there in proportion. A unit is a session, or a conversation (an
    agent with its subagents) where whole conversations are taken. Then, while a checked percentile of the
    figures the check compares (prompt tokens overall and by turn, output tokens, turns per session,
    think time) is off by more than `_PICK_GOAL` of its tolerance, a taken session with values on
    the wrong side of the real percentile is swapped for one on the right side, near it: a tail
    resting on a few sessions is then the real one whatever the seed."""

    def __init__(self, features: list[tuple[np.ndarray, np.ndarray]], longest: np.ndarray) -> None:
        """`features`: each checked figure's values and the unit (session, or conversation) each value
        comes with; `longest`: each unit's longest prompt, which the strata are cut by."""
        self.units = longest.size
        self.features = [(v[~np.isnan(v)], s[~np.isnan(v)]) for v, s in features if not np.isnan(v).all()]
        self.targets = [np.percentile(v, _PICK_QUANTILES) for v, _ in self.features]
        self.bands = [
            (
                np.percentile(v, np.maximum(_PICK_QUANTILES - _PICK_BAND, 0)),
                np.percentile(v, np.minimum(_PICK_QUANTILES + _PICK_BAND, 100)),
            )
            for v, _ in self.features
        ]
        self.longest = longest

    @classmethod
    def of_requests(cls, requests: RequestFigures, session_units: np.ndarray, units: int) -> Resample:
        """The figures of requests that each belong to a unit (`requests.units`), and of sessions
        (`session_units`: each session's unit, so its turn count is a value of that unit)."""
        per_turn = np.bincount(requests.turns)
        turns_per_session = np.bincount(requests.sessions).astype(float)
        longest = np.zeros(units)
        np.maximum.at(longest, requests.units, requests.prompt)
        features = [
            (requests.prompt, requests.units),
            *(
                (requests.prompt[requests.turns == t], requests.units[requests.turns == t])
                for t in np.flatnonzero(per_turn >= MIN_TURN_REQUESTS)
            ),
            (requests.output, requests.units),
            (requests.think, requests.units),
            (turns_per_session, session_units),
        ]
        return cls(features, longest)

    @classmethod
    def of_skeletons(cls, real: list[Skeleton]) -> Resample:
        """Units are the sessions; a turn's prompt is the history of the new tokens and replies, as the
        synthetic workload will have it."""
        lengths = np.array([len(skeleton.new_tokens) for skeleton in real])
        sessions = np.repeat(np.arange(len(real)), lengths)
        requests = RequestFigures(
            units=sessions,
            sessions=sessions,
            turns=np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths),
            prompt=np.concatenate(
                [np.cumsum(sk.new_tokens) + np.cumsum([0, *(o or 0 for o in sk.output_tokens[:-1])]) for sk in real]
            ).astype(float),
            output=np.array([np.nan if o is None else o for sk in real for o in sk.output_tokens], dtype=float),
            think=np.array([t if k else np.nan for sk in real for k, t in enumerate(sk.think_times_s)]),
        )
        return cls.of_requests(requests, np.arange(len(real)), len(real))

    def pick(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n unit indexes (sessions or conversations; each as many times as it is taken)."""
        counts = np.full(self.units, n // self.units)
        rest = n % self.units
        if rest:
            order = np.lexsort((rng.random(self.units), self.longest))
            bounds = np.floor(np.arange(rest + 1) * self.units / rest).astype(int)
            counts[order[bounds[:-1] + (rng.random(rest) * np.diff(bounds)).astype(int)]] += 1
            counts = self._refined(counts, n // self.units, rng)
        return np.repeat(np.arange(self.units), counts)

    def _errors(self, counts: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], float]:
        """Each checked percentile's miss as a share of its tolerance, the picked percentiles, and how far
        the picked values' shares below the real percentiles are from theirs (squares summed): a swap
        that leaves a percentile on a run of equal values still moves that share, so it tells progress."""
        found, rank_miss = [], 0.0
        for (values, sessions), target in zip(self.features, self.targets, strict=True):
            picked = np.sort(np.repeat(values, counts[sessions]))
            found.append(np.percentile(picked, _PICK_QUANTILES))
            below = np.searchsorted(picked, target, "left") / picked.size
            at_or_below = np.searchsorted(picked, target, "right") / picked.size
            share = _PICK_QUANTILES / 100
            rank_miss += float(((np.maximum(below - share, 0) + np.maximum(share - at_or_below, 0)) ** 2).sum())
        targets = np.array(self.targets)
        misses = np.abs(np.array(found) - targets) / np.maximum(np.abs(targets), 1e-9)
        return misses / RELATIVE_TOLERANCE, found, rank_miss

    def _refined(self, counts: np.ndarray, base: int, rng: np.random.Generator) -> np.ndarray:
        """Swaps while a figure misses the goal, until `_PICK_STALL` rounds in a row find none that helps."""
        errors, found, rank_miss = self._errors(counts)
        stalled = 0
        for _ in range(_PICK_ROUNDS):
            excess = np.maximum(errors - _PICK_GOAL, 0).ravel()
            if not excess.any() or stalled >= _PICK_STALL:
                break
            stalled += 1
            # a missed figure, the further off the likelier: always the worst can stall on one no swap helps
            feature, q = np.unravel_index(int(rng.choice(excess.size, p=excess / excess.sum())), errors.shape)
            outs, ins = self._swappable(counts, base, int(feature), int(q), found[feature][q])
            if not outs.size or not ins.size:
                continue
            best = (_excess(errors), rank_miss)
            for out, into in zip(rng.choice(outs, _PICK_TRIES), rng.choice(ins, _PICK_TRIES), strict=True):
                trial = counts.copy()
                trial[out] -= 1
                trial[into] += 1
                trial_errors, trial_found, trial_rank_miss = self._errors(trial)
                if (_excess(trial_errors), trial_rank_miss) < best:
                    best, stalled = (_excess(trial_errors), trial_rank_miss), 0
                    chosen = trial, trial_errors, trial_found
            if not stalled:
                counts, errors, found = chosen
                rank_miss = best[1]
        return counts

    def _swappable(
        self, counts: np.ndarray, base: int, feature: int, q: int, found: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """The taken sessions with a value on the wrong side of a missed percentile, and the others with
        one on the right side: those near it (`_PICK_BAND`) where there are, else any."""
        values, sessions = self.features[feature]
        target = self.targets[feature][q]
        near = (values >= self.bands[feature][0][q]) & (values <= self.bands[feature][1][q])
        above = found > target  # too many taken values above the real percentile
        wrong, right = (values > target, values <= target) if above else (values < target, values >= target)
        taken, left = counts[sessions] > base, counts[sessions] == base

        def near_first(mask: np.ndarray) -> np.ndarray:
            return np.unique(sessions[mask & near] if (mask & near).any() else sessions[mask])

        return near_first(wrong & taken), near_first(right & left)


def _excess(errors: np.ndarray) -> float:
    """How far a pick's misses are past the goal, squared and summed: every figure's progress counts."""
    return float((np.maximum(errors - _PICK_GOAL, 0) ** 2).sum())


def request_rate(arrivals: np.ndarray) -> float | None:
    """Requests per second as `workload_stats` counts it: gaps / first-to-last span."""
    span = float(np.nanmax(arrivals) - np.nanmin(arrivals)) if arrivals.size else 0.0
    return (arrivals.size - 1) / span if span > 0 else None


def paced(offsets: np.ndarray, arrivals: list[np.ndarray], rate: float | None) -> list[float | None]:
    """Session starts stretched (bisection on one scale) so the synthetic workload has the real request
    rate: with more or fewer sessions than the real one, its last sessions' turns weigh differently in
    the first-to-last span. `arrivals`: each session's request times from its start. Starts that are all
    at once (a set of agent traces, each on its own clock) are spread evenly where more sessions than the
    real ones would otherwise run faster."""
    if rate is None or sum(a.size for a in arrivals) < 2:
        return offsets.round(3).tolist()

    def rate_at(starts: np.ndarray) -> float:
        times = np.concatenate([start + a for start, a in zip(starts, arrivals, strict=True)])
        return request_rate(times) or float("inf")

    if not offsets.any() and rate_at(offsets) > rate:
        offsets = np.arange(offsets.size, dtype=float)
    low, high = 0.0, 1.0
    while rate_at(offsets * high) > rate and high < 1e6:  # the rate falls as the starts stretch
        low, high = high, high * 2
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if rate_at(offsets * middle) > rate else (low, middle)
    return (offsets * high).round(3).tolist()


def redraw(
    shapes: list[SessionShape], options: SynthOptions, given: set[str], rng: np.random.Generator
) -> list[SessionShape]:
    """The shapes with the parts whose distribution was given on the command line drawn from it instead."""
    out = []
    for shape in shapes:
        n = len(shape.new_tokens)
        news = draw_tokens(options.prompt_tokens, rng, n) if "prompt_tokens" in given else shape.new_tokens
        outputs: list[int | None] = (
            list(draw_tokens(options.output_tokens, rng, n)) if "output_tokens" in given else shape.output_tokens
        )
        thinks = (
            [0.0, *draw_seconds(options.think_time_s, rng, n)[1:]] if "think_time_s" in given else shape.think_times_s
        )
        recorded = None if "think_time_s" in given else shape.at_s  # redrawn pauses time the turns
        out.append(
            SessionShape(
                new_tokens=news, output_tokens=outputs, think_times_s=thinks, offset_s=shape.offset_s, at_s=recorded
            )
        )
    return out


LIKE_PREFIX_COUNT = 1
"""The aggregate figure does not tell how many prefixes there were. The first session to send a prefix cut
to a length shares nothing, and a source of short openings cuts its prefixes to many lengths, so each
prefix more loses that many first senders: on FastChat's log at 200 of its 500 sessions, 4 prefixes
gave 20.8-22.2% shared for 26.0%, and one gives 25.2-25.8%."""


_PROBE_TOKENS = 8  # the prefix length `prefix_template` measures with


@dataclass(frozen=True)
class PrefixTemplate:
    """What a chat template adds to a prefixed session's prompts, in tokens."""

    run: int  # beyond the prefix, at the start of every prompt of the session and the same in every session with it
    extra: int  # beyond the prefix, in every prompt of the session: the system message's own template


def prefix_template(tokenizer: str, template: ChatTemplate) -> PrefixTemplate:
    """Measured on prompts of one prefix (a system message) and different user texts, and without it."""
    layout = PromptLayout(tokenizer, template)
    synth = TextSynthesizer(get_tokenizer(tokenizer))
    prefix = synth.text(_PROBE_TOKENS)
    users = [synth.text(_PROBE_TOKENS) for _ in range(3)]
    first, *others = (layout.turn([("system", prefix), ("user", user)]) for user in users)
    common = min(int(np.argmin(first[: len(o)] == o[: len(first)])) for o in others)
    extra = len(first) - len(layout.turn([("user", users[0])])) - _PROBE_TOKENS
    return PrefixTemplate(run=common - _PROBE_TOKENS, extra=extra)


def like_prefixes(
    shapes: list[SessionShape],
    real: ReusablePrefix,
    *,
    real_prompt_tokens: float,
    prefix_sessions: float,
    block_size: int,
    template: PrefixTemplate,
) -> tuple[list[PrefixPool], float]:
    """One pool of shared prefixes, and the share of sessions that start with one, that give the shapes
    the real shared share.

    A session with a prefix of T tokens (cut to its first turn's new tokens less one) shares, in every
    turn, the full blocks of the T + `template.run` tokens its prompts start with, so a prefix of a
    few tokens shares a block where the template makes the run a block long, as the short openings
    a real log shares do. Its prompts also grow by `template.extra` tokens each, which the share's
    whole counts. The prompts' tokens as rendered are the real ones scaled by the shapes' over the
    real tokens. With every session prefixed, the shared tokens are non-decreasing in T: the shortest
    T that reaches the real share is found by bisection, then the share of sessions prefixed
    (`prefix_sessions` at most) is cut to what reaches it, not past it; a source that shares less
    than a block gets no pool. The first session to send each prefix shares nothing: those
    `LIKE_PREFIX_COUNT` sessions are counted out. What is not modelled, measured on FastChat's log:
    the first to send each cut of the prefix share nothing either, and the synthetic one-token first
    messages after a cut prefix are sometimes the same word, a block more; the two came out at -0.9 to
    +3.7 points over 200 and 500 sessions."""
    share = real.shared_share or 0.0
    first = np.array([shape.new_tokens[0] - 1 for shape in shapes])
    turns = np.array([len(shape.new_tokens) for shape in shapes])
    content = sum(
        sum(np.cumsum(shape.new_tokens)) + sum(np.cumsum([o or 0 for o in shape.output_tokens[:-1]]))
        for shape in shapes
    )
    rendered = real.prompt_tokens * content / real_prompt_tokens if real_prompt_tokens else 0.0
    extra = float(template.extra * turns[first > 0].sum())  # the rendered tokens all prefixed sessions add

    def shared(tokens: int) -> float:
        run = np.minimum(tokens, first)
        return float((np.where(run > 0, (run + template.run) // block_size * block_size, 0) * turns).sum())

    if not shapes or share * rendered < block_size or shared(int(first.max())) == 0:
        return [], prefix_sessions
    lost = min(LIKE_PREFIX_COUNT / max(int((first > 0).sum()), 1), 0.5)  # the first senders' share of sessions
    target = share * (rendered + extra) / (1 - lost)  # with every session prefixed
    low, high = 0, int(first.max())  # shared(low) < target <= shared(high), or high when out of reach
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if shared(middle) < target else (low, middle)
    # (p - lost) × shared(high) = share × (rendered + p × extra), p the share of sessions prefixed
    prefixed = min(1.0, (share * rendered + lost * shared(high)) / max(shared(high) - share * extra, 1.0))
    return [PrefixPool(count=LIKE_PREFIX_COUNT, tokens=high)], prefix_sessions * prefixed


# --------------------------------------------------------------------------- the side-by-side check


@dataclass(frozen=True)
class Figure:
    """One compared figure: how to read it from a workload's statistics, and how far off it may be."""

    name: str
    read: Callable[[WorkloadStats], float | None]
    tolerance: Literal["relative", "points"]  # relative: 5% of the real value; points: 5 percentage points
    digits: int = 0


@dataclass(frozen=True)
class Row:
    figure: Figure
    real: float | None
    synthetic: float | None

    @property
    def off(self) -> float | None:
        """How far off: a fraction of the real value, or points; None when the real figure is unknown."""
        if self.real is None:
            return None
        if self.synthetic is None:
            return float("inf")
        if self.figure.tolerance == "points":
            return self.synthetic - self.real
        if self.real == 0:
            return 0.0 if self.synthetic == 0 else float("inf")
        return (self.synthetic - self.real) / abs(self.real)

    @property
    def within(self) -> bool | None:
        off = self.off
        if off is None:
            return None
        return abs(off) <= (RELATIVE_TOLERANCE if self.figure.tolerance == "relative" else POINTS_TOLERANCE)


def _quantile_figures(name: str, read: Callable[[WorkloadStats], object], digits: int = 0) -> list[Figure]:
    return [
        Figure(f"{name} {q.upper()}", lambda s, q=q: getattr(read(s), q), "relative", digits)  # type: ignore[misc]
        for q in _QUANTILES
    ]


def _turn_figures(turn: int) -> list[Figure]:
    def read(stats: WorkloadStats, q: str) -> float | None:
        row = next((r for r in stats.prompt_tokens_by_turn if r.turn == turn), None)
        return None if row is None else float(getattr(row, f"prompt_tokens_{q}"))

    return [
        Figure(f"prompt tokens turn {turn} {q.upper()}", lambda s, q=q: read(s, q), "relative")  # type: ignore[misc]
        for q in _QUANTILES
    ]


def figures(real: WorkloadStats) -> list[Figure]:
    """The figures compared: per-turn rows for the real turns with at least `MIN_TURN_REQUESTS` requests."""
    turns = [r.turn for r in real.prompt_tokens_by_turn if r.requests >= MIN_TURN_REQUESTS]
    return [
        *_quantile_figures("prompt tokens", lambda s: s.prompt_tokens),
        *(f for turn in turns for f in _turn_figures(turn)),
        *_quantile_figures("output tokens", lambda s: s.output_tokens),
        *_quantile_figures("turns per session", lambda s: s.turns_per_session, 1),
        *_quantile_figures("think time s", lambda s: s.think_time_s, 2),
        Figure("arrival rate requests/s", lambda s: s.requests_per_s, "relative", 3),
        *_prefix_figures(),
    ]


def _prefix_figures() -> list[Figure]:
    """The reusable prefix share and its parts, in percent: absent (no text) on either side is not judged."""

    def percent(stats: WorkloadStats, part: str) -> float | None:
        reuse = stats.reusable_prefix
        value = None if reuse is None else getattr(reuse, part)
        return None if value is None else 100 * value

    return [
        Figure(f"reusable prefix {name} %", lambda s, part=part: percent(s, part), "points", 1)  # type: ignore[misc]
        for name, part in (("share", "share"), ("history", "history_share"), ("shared", "shared_share"))
    ]


def compare(real: WorkloadStats, synthetic: WorkloadStats) -> list[Row]:
    return [Row(f, f.read(real), f.read(synthetic)) for f in figures(real)]


def render_comparison(rows: list[Row]) -> str:
    """The side-by-side table, then which figures are off."""
    lines = ["| figure | real | synthetic | off by | within |", "|---|---:|---:|---:|:---:|"]
    for row in rows:
        off = row.off
        if off is None:
            shown = "—"
        elif row.figure.tolerance == "points":
            shown = f"{off:+.1f} pts"
        else:
            shown = "∞" if off == float("inf") else f"{100 * off:+.1f}%"
        mark = {None: "—", True: "✓", False: "✗"}[row.within]
        digits = row.figure.digits
        real, synthetic = (fmt(v, digits).replace("–", "—") for v in (row.real, row.synthetic))
        lines.append(f"| {row.figure.name} | {real} | {synthetic} | {shown} | {mark} |")
    off_rows = [row.figure.name for row in rows if row.within is False]
    lines += [
        "",
        f"Tolerance: {100 * RELATIVE_TOLERANCE:g}% of the real value ({POINTS_TOLERANCE:g} points for shares); "
        f"per-turn rows for turns with at least {MIN_TURN_REQUESTS} real requests; — : the real source does "
        "not have the figure, not judged.",
        f"{len(off_rows)} figure(s) off: {', '.join(off_rows)}"
        if off_rows
        else "Every judged figure is within tolerance.",
    ]
    return "\n".join(lines) + "\n"
