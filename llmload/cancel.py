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
from typing import Literal

import numpy as np

from llmload.errors import InputError
from llmload.models import CancelNote, ServerRelease
from llmload.session_split import pick
from llmload.workload.distributions import Distribution, parse_distribution

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


def released(running: float | None, waiting: float | None, kv_before: float | None, kv_after: float | None) -> bool:
    """Nothing running or queued, and the KV cache back where it was (when both usages are known)."""
    idle = (running or 0.0) + (waiting or 0.0) == 0
    kv_back = kv_before is None or kv_after is None or kv_after <= kv_before + RELEASE_KV_TOLERANCE
    return idle and kv_back


def cut_line(note: CancelNote, abandoned: int, release: ServerRelease | None) -> str:
    """What the plan cut, and whether the server let go, for the reports."""
    told = f" After the run, {release_line(release)}." if release is not None else ""
    return (
        f"Cut by the plan: {abandoned} streams (--cancel-share {note.share:g}, --cancel-after {note.after}), as users"
        f" who close a tab: not failures, never judged.{told}"
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
