"""A distributed run's workers, as its master keeps them: which planned arrivals each owns, what
each says it sent, and, when one is lost, what went with it. Free of Locust: the glue hands it the
workers' messages and tells it which worker went missing.

Locust's master finds a worker missing when its heartbeats stop (about 4 s). The worker's records
cannot come any more, so they are written here, `lost` (error category `worker_lost`), each with
its reason: the requests its last message listed in flight (sent, their outcome unknown), and its
arrivals that no record accounts for (due after its last message, or waiting for a free user),
so that scheduled = ok + failed + unfinished + cancelled + not_sent + lost still holds, stage by
stage. With the default policy the arrivals it still owned from a short lead after the loss are
re-split among the workers left, every S-th to each, as the global sequence was split at the
start (a closed loop plans no arrival: its share of the conversations kept in flight is dealt out
the same way, `schedule.split_shares`); with `stop` the run ends and what the lost worker owned after
that is never scheduled, as every worker's plan after a stop.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from llmload.models import FleetWorker, RequestRecord, Stage
from llmload.recordlog import lost_record
from llmload.schedule import ArrivalPlan, SlotShare, split_shares, stage_at

OnWorkerLoss = Literal["resplit", "stop"]
ON_WORKER_LOSS: tuple[str, ...] = ("resplit", "stop")
RESPLIT_LEAD_S = 0.5  # the master's message reaches the workers before the first arrival they take over
MATCH_TOLERANCE_S = 1e-5  # a record's scheduled time against its planned offset (float round trips)


@dataclass
class WorkerLedger:
    """One worker: the plan positions it owns (in time order), which of them a record accounts for,
    the conversation slots it keeps in a closed loop, and what its last message said."""

    index: int
    node_id: str
    positions: np.ndarray
    recorded: np.ndarray  # bool, parallel to positions
    slots: list[SlotShare]
    address: str = ""
    heard_at: float = 0.0  # run offset of its last message
    in_flight: list[list[Any]] = field(default_factory=list)  # [seq or -1, scheduled, sent, session, turn]
    sent_reported: int = 0
    cpu_max: float = 0.0
    adopted: int = 0
    lost_at: float | None = None
    noticed_at: float | None = None
    lost_in_flight: int = 0
    lost_not_sent: int = 0
    taken_over_at: float | None = None
    handed_over: int = 0
    refused: str | None = None

    @property
    def active(self) -> bool:
        return self.lost_at is None and self.refused is None

    @property
    def name(self) -> str:
        return f"worker {self.index}" + (f" ({self.address})" if self.address else "")


@dataclass(frozen=True)
class Handover:
    """What one remaining worker takes over from a lost one: its planned arrivals by plan position, or in
    a closed loop its conversation slots."""

    positions: list[int]
    slots: list[SlotShare]


@dataclass(frozen=True)
class Loss:
    """What the master does about a lost worker: the records it writes, what it hands each remaining
    worker (by node id), and the line it says."""

    records: list[RequestRecord]
    handed_over: dict[str, Handover]
    line: str


class Fleet:
    """The master's ledger of its workers (worker k of N starts with the plan's keys k mod N)."""

    def __init__(
        self, plan: ArrivalPlan, stages: Sequence[Stage], run_id: str, started_at: float, node_ids: Sequence[str]
    ) -> None:
        self.plan = plan
        self.stages = list(stages)
        self.run_id = run_id
        self.started_at = started_at
        self.trace = plan.trace_starts is not None
        self.closed_loop = self.stages[-1].sessions is not None
        count = len(node_ids)
        self.workers = {
            node: WorkerLedger(i, node, positions, np.zeros(len(positions), dtype=bool), [(i, 0, 1)])
            for i, node in enumerate(node_ids)
            for positions in [plan.owned(i, count)]
        }

    def heard(self, node_id: str, data: dict[str, Any], at: float) -> WorkerLedger | None:
        """A worker's message noted (run offset `at`); None when it is no member or already lost."""
        ledger = self.workers.get(node_id)
        if ledger is None or ledger.lost_at is not None:
            return None
        ledger.heard_at = at
        ledger.in_flight = data["in_flight"]
        ledger.sent_reported = data["sent_total"]
        ledger.cpu_max = max(ledger.cpu_max, data["cpu"])
        ledger.address = data.get("address") or ledger.address
        return ledger

    def note_records(self, ledger: WorkerLedger, records: Iterable[RequestRecord]) -> None:
        """Mark the arrivals these records account for (every record in rate modes; a session's first
        turn in trace mode), found by their scheduled time."""
        offsets = [r.scheduled_at - self.started_at for r in records if not self.trace or r.turn == 0]
        self._mark(ledger, np.asarray(offsets, dtype=float))

    def _mark(self, ledger: WorkerLedger, offsets: np.ndarray) -> None:
        if not len(offsets) or not len(ledger.positions):
            return
        times = self.plan.offsets[ledger.positions]
        at = np.clip(np.searchsorted(times, offsets - MATCH_TOLERANCE_S), 0, len(times) - 1)
        matched = np.abs(times[at] - offsets) <= MATCH_TOLERANCE_S
        ledger.recorded[at[matched]] = True

    def refuse(self, node_id: str, reason: str, address: str) -> WorkerLedger | None:
        """The worker sends nothing (it cannot reach the target): why, kept for the report."""
        ledger = self.workers.get(node_id)
        if ledger is not None:
            ledger.refused, ledger.address = reason, address
        return ledger

    def lose(self, node_id: str, now: float, policy: OnWorkerLoss) -> Loss:
        """The worker is gone (noticed at run offset `now`): its in-flight requests and its unaccounted
        arrivals become `lost` records; with `resplit`, what it owned from `now` + a lead goes to the
        workers left."""
        ledger = self.workers[node_id]
        ledger.lost_at, ledger.noticed_at = ledger.heard_at, now
        end = self.stages[-1].end_s
        others = [w for w in sorted(self.workers.values(), key=lambda w: w.index) if w.active]
        cut = min(now + RESPLIT_LEAD_S, end) if policy == "resplit" and others else min(now, end)
        if policy == "stop" and now >= end:
            cut = end
        records = [self._in_flight_record(ledger, row) for row in ledger.in_flight]
        ledger.lost_in_flight = len(records)
        times = self.plan.offsets[ledger.positions]
        unaccounted = ~ledger.recorded & (times < cut)
        for position in ledger.positions[unaccounted]:
            records.append(self._not_sent_record(ledger, int(position)))
        ledger.lost_not_sent = int(unaccounted.sum())
        ledger.recorded[unaccounted] = True
        handed: dict[str, Handover] = {}
        resplit = policy == "resplit" and others
        rest = ledger.positions[times >= cut] if resplit else ledger.positions[:0]
        if len(rest):
            ledger.taken_over_at = cut
            for p, other in enumerate(others):
                share = rest[p :: len(others)]
                other.positions = np.concatenate([other.positions, share])
                order = np.argsort(other.positions, kind="stable")
                other.positions = other.positions[order]
                other.recorded = np.concatenate([other.recorded, np.zeros(len(share), dtype=bool)])[order]
                other.adopted += len(share)
                handed[other.node_id] = Handover(share.tolist(), [])
        elif resplit and self.closed_loop and now < end:
            ledger.taken_over_at = cut
            for other, slots in zip(others, split_shares(ledger.slots, len(others)), strict=True):
                other.slots += slots
                handed[other.node_id] = Handover([], slots)
        ledger.positions, ledger.recorded = ledger.positions[times < cut], ledger.recorded[times < cut]
        ledger.handed_over = len(rest)
        line = lost_line(_kept(ledger))
        return Loss(records, handed, f"{line}; --on-worker-loss stop: the run ends" if policy == "stop" else line)

    def _offset_stage(self, offset: float) -> str:
        return stage_at(self.stages, offset).name

    def _in_flight_record(self, ledger: WorkerLedger, row: list[Any]) -> RequestRecord:
        seq, scheduled, sent, session_id, turn = row
        if seq >= 0:
            at = np.searchsorted(ledger.positions, seq)
            if at < len(ledger.positions) and ledger.positions[at] == seq:
                ledger.recorded[at] = True
        assert ledger.lost_at is not None
        return lost_record(
            run_id=self.run_id, worker=ledger.index, stage=self._offset_stage(scheduled), session_id=session_id,
            turn=turn, scheduled_at=self.started_at + scheduled, sent_at=self.started_at + sent,
            reason=f"in flight on {ledger.name} when it was lost at +{ledger.lost_at:.1f} s: its outcome is unknown",
        )  # fmt: skip

    def _not_sent_record(self, ledger: WorkerLedger, position: int) -> RequestRecord:
        offset = float(self.plan.offsets[position])
        assert ledger.lost_at is not None
        return lost_record(
            run_id=self.run_id, worker=ledger.index, stage=self._offset_stage(offset), session_id="", turn=0,
            scheduled_at=self.started_at + offset, sent_at=None,
            reason=f"due on {ledger.name}, which was lost at +{ledger.lost_at:.1f} s: never sent",
        )  # fmt: skip

    def report(self) -> list[FleetWorker]:
        """What run.json keeps of each worker."""
        return [_kept(w) for w in sorted(self.workers.values(), key=lambda w: w.index)]


def _kept(w: WorkerLedger) -> FleetWorker:
    return FleetWorker(
        index=w.index, host=w.address or w.node_id.rsplit("_", 1)[0], sent_reported=w.sent_reported,
        cpu_max_percent=w.cpu_max, adopted=w.adopted, lost_at_s=w.lost_at, noticed_at_s=w.noticed_at,
        lost_in_flight=w.lost_in_flight, lost_not_sent=w.lost_not_sent, taken_over_at_s=w.taken_over_at,
        handed_over=w.handed_over, handed_over_slots=w.taken_over_at is not None and not w.handed_over,
        refused=w.refused,
    )  # fmt: skip


def worker_name(w: FleetWorker) -> str:
    return f"worker {w.index} ({w.host})"


def lost_line(w: FleetWorker) -> str:
    """A lost worker in words, the same on the console, in the LLM tab and in the report."""
    assert w.lost_at_s is not None and w.noticed_at_s is not None
    line = (
        f"{worker_name(w)} lost at +{w.lost_at_s:.0f} s (no heartbeat; noticed at +{w.noticed_at_s:.0f} s):"
        f" {w.lost_in_flight} requests in flight lost; its share of the arrivals after that was not sent:"
        f" {w.lost_not_sent}"
    )
    if w.taken_over_at_s is None:
        return line
    taken = "share of the conversations in flight" if w.handed_over_slots else f"{w.handed_over} later arrivals"
    return f"{line}; the other workers took over its {taken} from +{w.taken_over_at_s:.1f} s"
