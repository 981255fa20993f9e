"""Servers whose capacity is known exactly, for measuring the gates' error rates.

A gate is trusted when its error rates are known: how often it fails a healthy server and how often it
passes an overloaded one. Real servers have no exact capacity; these do. Each turns arrival times into
when every request got its first token and finished, as a client would see it:

- `FifoServer`: `slots` requests served at once, first come first served, each in TTFT + tokens × ITL.
- `BatchServer`: continuous batching as the embedded engine runs it: up to `max_num_seqs` requests
  decode together, one token each per step, and a step takes `step_s + step_per_seq_s` × the batch, so
  a fuller batch is slower per request and faster in total.
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Literal

import numpy as np

LengthShape = Literal["fixed", "lognormal", "pareto"]


@dataclass(frozen=True)
class Lengths:
    """Answer lengths in tokens: fixed, lognormal with `sigma`, or Pareto (heavy-tailed, shape 2.2,
    capped at 20× the mean); every shape has the mean `mean_tokens`."""

    shape: LengthShape
    mean_tokens: float
    sigma: float = 0.5

    def draw(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.shape == "fixed":
            values = np.full(n, self.mean_tokens)
        elif self.shape == "lognormal":
            values = rng.lognormal(np.log(self.mean_tokens) - self.sigma**2 / 2, self.sigma, n)
        else:
            alpha = 2.2
            values = np.minimum(
                (rng.pareto(alpha, n) + 1) * self.mean_tokens * (alpha - 1) / alpha, 20 * self.mean_tokens
            )
            values *= self.mean_tokens / self.truncated_pareto_mean(alpha)
        return np.maximum(np.round(values), 1)

    def truncated_pareto_mean(self, alpha: float) -> float:
        """The mean of the capped Pareto before rescaling, so the rescaled one has `mean_tokens`."""
        scale = self.mean_tokens * (alpha - 1) / alpha
        cap = 20 * self.mean_tokens
        # E[min(X, cap)] for a Pareto with minimum `scale`: the integral of its survival function up to cap
        return scale + scale**alpha * (scale ** (1 - alpha) - cap ** (1 - alpha)) / (alpha - 1)

    @property
    def label(self) -> str:
        return {"fixed": "fixed", "lognormal": f"lognormal σ {self.sigma:g}", "pareto": "heavy-tailed"}[self.shape]


@dataclass(frozen=True)
class Served:
    """What the client saw of each request, in seconds on the arrivals' clock."""

    first_token: np.ndarray
    finished: np.ndarray
    tokens: np.ndarray


@dataclass(frozen=True)
class FifoServer:
    """`slots` requests at once, first come first served; a request takes `ttft_s` to its first token
    once it holds a slot, then `itl_s` per further token."""

    slots: int
    ttft_s: float
    itl_s: float
    lengths: Lengths

    @property
    def mean_answer_s(self) -> float:
        return self.ttft_s + (self.lengths.mean_tokens - 1) * self.itl_s

    @property
    def capacity_qps(self) -> float:
        return self.slots / self.mean_answer_s

    @property
    def label(self) -> str:
        return f"FIFO {self.slots} slot(s), {self.mean_answer_s:.3g} s answers ({self.lengths.label})"

    def service_times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self.ttft_s + (self.lengths.draw(n, rng) - 1) * self.itl_s

    def serve(self, arrivals: np.ndarray, rng: np.random.Generator) -> Served:
        tokens = self.lengths.draw(len(arrivals), rng)
        service = self.ttft_s + (tokens - 1) * self.itl_s
        start = np.empty(len(arrivals))
        if self.slots == 1:
            free = 0.0
            for i, (t, s) in enumerate(zip(arrivals.tolist(), service.tolist(), strict=True)):
                begin = t if t > free else free
                start[i] = begin
                free = begin + s
        else:
            slots = [0.0] * self.slots
            for i, (t, s) in enumerate(zip(arrivals.tolist(), service.tolist(), strict=True)):
                free = slots[0]
                begin = t if t > free else free
                start[i] = begin
                heapq.heapreplace(slots, begin + s)
        return Served(start + self.ttft_s, start + service, tokens)


@dataclass(frozen=True)
class BatchServer:
    """Continuous batching: up to `max_num_seqs` requests decode together, one token each per step of
    `step_s + step_per_seq_s × batch`; arrivals beyond the batch wait in order. A request's first token
    comes with its first step."""

    max_num_seqs: int
    step_s: float
    step_per_seq_s: float
    lengths: Lengths

    @property
    def capacity_qps(self) -> float:
        """Full batches back to back: max_num_seqs tokens per step."""
        full_step = self.step_s + self.step_per_seq_s * self.max_num_seqs
        return self.max_num_seqs / full_step / self.lengths.mean_tokens

    @property
    def mean_answer_s(self) -> float:
        """At a full batch."""
        return self.lengths.mean_tokens * (self.step_s + self.step_per_seq_s * self.max_num_seqs)

    def service_times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """At a full batch."""
        return self.lengths.draw(n, rng) * (self.step_s + self.step_per_seq_s * self.max_num_seqs)

    @property
    def label(self) -> str:
        return f"batch of {self.max_num_seqs}, {self.mean_answer_s:.3g} s answers ({self.lengths.label})"

    def serve(self, arrivals: np.ndarray, rng: np.random.Generator) -> Served:
        """Event by event: between two events every running request advances by the same number of
        steps, at the step time of the batch it is in."""
        n = len(arrivals)
        tokens = self.lengths.draw(n, rng)
        first, finished = np.full(n, np.nan), np.full(n, np.nan)
        remaining = np.zeros(self.max_num_seqs)  # steps left, per batch slot
        owner = np.full(self.max_num_seqs, -1)
        done_steps = np.zeros(self.max_num_seqs)
        now, nxt, running = 0.0, 0, 0
        waiting: deque[int] = deque()
        while nxt < n or running or waiting:
            step = self.step_s + self.step_per_seq_s * running
            busy = owner >= 0
            to_finish = float(remaining[busy].min()) * step if running else np.inf
            to_arrival = arrivals[nxt] - now if nxt < n else np.inf
            dt = min(to_finish, to_arrival)
            if running:
                steps = dt / step
                # a request's first token comes when its first step ends
                newly = busy & (done_steps < 1) & (done_steps + steps >= 1 - 1e-9)
                for slot in np.flatnonzero(newly):
                    first[owner[slot]] = now + (1 - done_steps[slot]) * step
                remaining[busy] -= steps
                done_steps[busy] += steps
            now += dt
            if to_arrival <= to_finish:
                waiting.append(nxt)
                nxt += 1
            ended = busy & (remaining <= 1e-9)
            for slot in np.flatnonzero(ended):
                finished[owner[slot]] = now
                owner[slot] = -1
                running -= 1
            while waiting and running < self.max_num_seqs:
                free = int(np.flatnonzero(owner < 0)[0])
                request = waiting.popleft()
                owner[free] = request
                remaining[free], done_steps[free] = tokens[request], 0.0
                running += 1
        return Served(first, finished, tokens)


Server = FifoServer | BatchServer
