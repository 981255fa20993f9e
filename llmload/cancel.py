"""Streams cut on purpose, as users who close a tab do: `--cancel-share 0.05 --cancel-after
tokens:lognormal:median=32,sigma=0.6` (or `seconds:2`).

Which requests are cut, and where, is drawn from each one's session id and turn (`session_split.pick`,
and a generator seeded by the same hash), so every worker and every rerun cuts the same requests at the
same place. A cut request is `abandoned`: no failure of the server, never judged. What is judged is
whether the server let go of what they held: once the run's last request has ended, it must run and queue
nothing within `RELEASE_LIMIT_S`, and its KV-cache usage must be back where it was before the run
(`ServerRelease`; the verdict's "release" check). A server that generates on for a client that left
holds its slot and KV blocks for the rest of the answer, and fails it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from llmload.errors import InputError
from llmload.models import CancelNote, CutAftermath, ServerRelease, Summary
from llmload.session_split import pick
from llmload.workload.distributions import Distribution, parse_distribution

if TYPE_CHECKING:  # pandas only types aftermath's frame: Locust's start imports this module (llmload.client)
    import pandas as pd

CUT_UNITS = ("tokens", "seconds")
RELEASE_LIMIT_S = 3.0  # after the run's last request: a server that aborts on disconnect is idle by then
RELEASE_KV_TOLERANCE = 0.02  # of the KV cache, above its usage before the run: a block or two in flight
HELD_EXCESS = 1.0  # the median of the server's running + waiting above the run's own in flight that fails it


@dataclass(frozen=True)
class Cut:
    """Where one stream is cut: after this many output tokens, or this many seconds from its send."""

    tokens: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class CancelPlan:
    share: float
    unit: Literal["tokens", "seconds"]
    after: Distribution
    text: str  # --cancel-after as given

    @classmethod
    def parse(cls, share: float, after: str | None) -> CancelPlan | None:
        """From --cancel-share and --cancel-after; None when nothing is cut, InputError for a half plan."""
        if not share:
            if after:
                raise InputError("--cancel-after needs --cancel-share, the share of requests to cut (e.g. 0.05)")
            return None
        if not after:
            raise InputError("--cancel-share needs --cancel-after tokens:DISTRIBUTION or seconds:DISTRIBUTION")
        unit, _, distribution = after.partition(":")
        if unit not in CUT_UNITS:
            raise InputError(
                f"--cancel-after {after!r}: give tokens:DISTRIBUTION or seconds:DISTRIBUTION (e.g. tokens:32,"
                " seconds:lognormal:median=2,sigma=0.5)"
            )
        return cls(
            share,
            "tokens" if unit == "tokens" else "seconds",
            parse_distribution(distribution, "--cancel-after"),
            after,
        )

    def note(self) -> CancelNote:
        return CancelNote(share=self.share, after=self.text)

    def cut_for(self, session_id: str, turn: int) -> Cut | None:
        """Where this request is cut, or None (most are not)."""
        key = f"{session_id}#{turn}"
        if pick(key, "cancel", [self.share, 1 - self.share]) != 0:
            return None
        seed = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8, person=b"cancel-after").digest())
        value = float(self.after.draw(np.random.default_rng(seed), 1)[0])
        return Cut(tokens=max(1, round(value))) if self.unit == "tokens" else Cut(seconds=max(0.0, value))


def held_excess(
    sample_t: np.ndarray, running: np.ndarray, waiting: np.ndarray, sent_at: np.ndarray, finished_at: np.ndarray
) -> float | None:
    """The median, over the server's samples taken while the run had requests in flight, of the requests it
    ran or queued beyond those (all times unix seconds; NaN: unknown). A server that serves this run alone
    and aborts a stream whose client left never runs more than the run has in flight (its count lags,
    never leads); one that generates on for cut streams runs more, by the cut streams it still holds.
    None without such samples."""
    sent = np.sort(sent_at[np.isfinite(sent_at)])
    finished = np.sort(finished_at[np.isfinite(sent_at) & np.isfinite(finished_at)])
    known = np.isfinite(sample_t) & np.isfinite(running)
    t = sample_t[known]
    in_flight = np.searchsorted(sent, t, side="right") - np.searchsorted(finished, t, side="right")
    held = running[known] + np.nan_to_num(waiting[known])
    busy = in_flight > 0
    return float(np.median(held[busy] - in_flight[busy])) if busy.any() else None


def aftermath(judged: pd.DataFrame) -> CutAftermath | None:
    """The judged stages' successful requests sent within an E2E p50 after a cut (a cut stream would
    have run on for about that long), against the rest; None when the run cut nothing or none succeeded."""
    cuts = np.sort(judged.finished_at[(judged.status == "abandoned").to_numpy(dtype=bool)].dropna().to_numpy())
    ok = judged.loc[(judged.status == "ok").to_numpy(dtype=bool), ["sent_at", "ttft_ms", "tpot_ms", "e2e_ms"]]
    if not len(cuts) or ok.empty:
        return None
    window_s = float(ok.e2e_ms.median()) / 1000
    sent = ok.sent_at.to_numpy()
    follows = np.searchsorted(cuts, sent, side="left") > np.searchsorted(cuts, sent - window_s, side="left")
    after, rest = ok[follows], ok[~follows]

    def p50(rows: pd.DataFrame, column: str) -> float | None:
        values = rows[column].dropna()
        return float(values.median()) if len(values) else None

    return CutAftermath(
        window_s=window_s, after=len(after), rest=len(rest),
        ttft_p50_after_ms=p50(after, "ttft_ms"), ttft_p50_rest_ms=p50(rest, "ttft_ms"),
        tpot_p50_after_ms=p50(after, "tpot_ms"), tpot_p50_rest_ms=p50(rest, "tpot_ms"),
    )  # fmt: skip


def released(running: float | None, waiting: float | None, kv_before: float | None, kv_after: float | None) -> bool:
    """Nothing running or queued, and the KV cache back where it was (when both usages are known)."""
    idle = (running or 0.0) + (waiting or 0.0) == 0
    kv_back = kv_before is None or kv_after is None or kv_after <= kv_before + RELEASE_KV_TOLERANCE
    return idle and kv_back


def cut_line(summary: Summary) -> str | None:
    """What the plan cut, whether the server let go, and whether the requests after a cut were slower,
    for the reports; None for a run that cut nothing."""
    note, release, after = summary.cancel, summary.server_release, summary.cut_aftermath
    if note is None:
        return None
    told = f" After the run, {release_line(release)}." if release is not None else ""
    return (
        f"Cut by the plan: {summary.requests.abandoned} streams (--cancel-share {note.share:g}, --cancel-after"
        f" {note.after}), as users who close a tab: not failures, never judged.{told}"
        f"{aftermath_line(after) if after is not None else ''}"
    )


def aftermath_line(after: CutAftermath) -> str:
    """The requests sent after a cut against the rest, as sentences that follow cut_line's: their TTFT
    and TPOT p50; "" when neither group has them."""

    def versus(name: str, mine: float | None, theirs: float | None) -> str | None:
        if mine is None or theirs is None:
            return None
        change = f" ({mine / theirs - 1:+.0%})" if theirs > 0 else ""
        return f"{name} p50 {mine:,.1f} ms against {theirs:,.1f} ms{change}"

    figures = [
        line
        for line in (
            versus("TTFT", after.ttft_p50_after_ms, after.ttft_p50_rest_ms),
            versus("TPOT", after.tpot_p50_after_ms, after.tpot_p50_rest_ms),
        )
        if line is not None
    ]
    if not figures:
        return ""
    return (
        f" The {after.after} requests sent within {after.window_s:.1f} s after a cut (an E2E p50) against the other"
        f" {after.rest}: {', '.join(figures)}."
    )


def release_line(release: ServerRelease) -> str:
    """The release as a sentence, for the verdict and the report."""
    kv = (
        f"; KV-cache usage {release.kv_cache_usage_before:.1%} before the run, {release.kv_cache_usage_after:.1%} after"
        if release.kv_cache_usage_before is not None and release.kv_cache_usage_after is not None
        else ""
    )
    if release.released is None:
        return "the server exports no running count: whether it let go of cut streams is not known"
    state = f"{release.running or 0:g} running and {release.waiting or 0:g} waiting"
    if release.released:
        return f"the server let go of what the requests held: {state} within {release.waited_s:.1f} s of the last{kv}"
    return (
        f"the server still held requests {release.waited_s:.1f} s after the run's last one ended: {state}{kv};"
        " a stream whose client went away must free its slot and KV blocks"
    )
