"""The served models a run asks for, and each one's share of its sessions (`--model a:0.7 --model b:0.3`).

A session keeps one model for all its turns (a LoRA adapter's prefix cache is its own, as a
conversation's history is), drawn by `session_split.pick`: every worker of a distributed run, and
every rerun of a workload, splits the sessions the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from llmload.errors import InputError
from llmload.models import ModelShare
from llmload.session_split import pick


def parse_model(text: str) -> ModelShare:
    """`NAME` or `NAME:WEIGHT`; a tail that is no number belongs to the name (Ollama's `llama3:8b`)."""
    name, colon, tail = text.rpartition(":")
    try:
        weight = float(tail) if colon else None
    except ValueError:
        weight = None
    if weight is None:
        name, weight = text, 1.0
    if not name or weight <= 0:
        raise InputError(f"--model {text!r}: give NAME or NAME:WEIGHT, a weight above 0")
    return ModelShare(name=name, weight=weight)


@dataclass(frozen=True)
class ModelMix:
    """The models of a run, weights normalised to shares of sessions."""

    shares: tuple[ModelShare, ...]

    def __post_init__(self) -> None:
        names = [share.name for share in self.shares]
        if not names or len(set(names)) < len(names):
            raise InputError(f"--model: each model once, at least one (given: {', '.join(names) or 'none'})")

    @classmethod
    def of(cls, texts: list[str]) -> ModelMix:
        return cls(tuple(parse_model(text) for text in texts))

    @classmethod
    def single(cls, name: str) -> ModelMix:
        return cls((ModelShare(name=name),))

    @property
    def primary(self) -> str:
        """The model most sessions ask for (the first of the heaviest): run.json's `model`."""
        return max(self.shares, key=lambda share: share.weight).name

    def normalised(self) -> list[ModelShare]:
        total = sum(share.weight for share in self.shares)
        return [ModelShare(name=share.name, weight=share.weight / total) for share in self.shares]

    def for_turn(self, session_id: str, rank: int | None = None) -> str:
        """A ranked turn's model is the rank-th (modulo: an agentic trace's main model the first, its
        others the next ones); any other's is its session's, drawn by weight."""
        if rank is not None:
            return self.shares[rank % len(self.shares)].name
        return self.shares[pick(session_id, "model", [share.weight for share in self.shares])].name
