"""The server's prefix cache emptied before a run, where its kind offers that (kinds.yaml `cache_reset`).

A search's probes and a sweep's configurations run one after another on one server: without a reset,
each rides on the prefixes the one before left cached and looks faster than a cold server is
(vLLM's own sweep resets before each run too). Asked with `--reset-prefix-cache`; run.json says
whether it was done and how, or why not.
"""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Sequence

import orjson

from llmload.access import Access
from llmload.models import PrefixCacheReset
from llmload.server.detect import base_url
from llmload.server.kinds import ServerKind

TRIES = 5  # vLLM refuses while blocks are held: the requests the last run left may still be finishing
WAIT_S = 1.0
TIMEOUT_S = 10.0


def _succeeded(body: bytes) -> bool:
    """vLLM answers `{"success": bool}`; SGLang a line of text (its refusal is an HTTP 400)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return True
    return not isinstance(answer, dict) or bool(answer.get("success", True))


def reset_prefix_cache(url: str, access: Access, server: ServerKind) -> PrefixCacheReset:
    """POST the kind's reset, tried again while the server refuses because blocks are still held."""
    if server.cache_reset is None:
        return PrefixCacheReset(reset=False, how=f"{server.label} has no prefix-cache reset llmload knows of")
    request = f"POST {server.cache_reset}"
    for _ in range(TRIES):
        try:
            with access.open(base_url(url) + server.cache_reset, timeout=TIMEOUT_S, data=b"", method="POST") as answer:
                done = _succeeded(answer.read())
        except urllib.error.HTTPError as exc:
            if exc.code != 400:  # 404/405: not offered; 401/403: not allowed
                note = f" ({server.cache_reset_note})" if server.cache_reset_note and exc.code in (404, 405) else ""
                return PrefixCacheReset(reset=False, how=f"{request} answered HTTP {exc.code}{note}")
            done = False
        except OSError as exc:
            return PrefixCacheReset(reset=False, how=f"{request} failed: {exc}")
        if done:
            return PrefixCacheReset(reset=True, how=request)
        time.sleep(WAIT_S)
    return PrefixCacheReset(reset=False, how=f"{request} was refused {TRIES} times: requests still held cached blocks")


def reset_prefix_caches(urls: Sequence[str], access: Access, server: ServerKind) -> PrefixCacheReset:
    """Each replica's prefix cache: emptied when every one was, else the first refusal, naming its replica."""
    resets = [reset_prefix_cache(url, access, server) for url in urls]
    refused = next(((url, reset) for url, reset in zip(urls, resets, strict=True) if not reset.reset), None)
    if refused is None:
        return resets[0]
    url, reset = refused
    return reset if len(urls) == 1 else reset.model_copy(update={"how": f"{url}: {reset.how}"})
