"""What a vLLM server says about itself: the model it serves (`/v1/models`) and its KV cache
(`vllm:cache_config_info` on `/metrics`, else the startup log), as the serving half of a profile.

vLLM exports neither its scheduler limits nor its device, so `max_num_seqs` and
`max_num_batched_tokens` come from the server's config (`--vllm-config`/`--vllm-args`, applied
afterwards), from the startup log's settings, or are vLLM's own defaults, and then say so.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from prometheus_client.parser import text_string_to_metric_families

from llmload.capacity.kv import KVLayout
from llmload.capacity.model import ModelSpec, known_models, load_model
from llmload.capacity.serving import model_reference, serve_inputs
from llmload.capacity.vllm_log import LogExplanation, explain_vllm_log
from llmload.errors import InputError
from llmload.models import DEVICE_DEFAULTS, ServeConfig

CACHE_CONFIG_INFO = "vllm:cache_config_info"
SCHEDULER_LIMITS = ("max_num_seqs", "max_num_batched_tokens")  # not exported: the log's, or the device's default


def public_url(url: str) -> str:
    """The URL without user:password, for what is printed and written."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def get_json(url: str, path: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
    """GET (or POST `body` to) `url`+`path`; the server's refusal or absence is an InputError naming the URL."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise InputError(f"{public_url(url)}{path}: HTTP {exc.code}: {detail}") from None
    except (OSError, ValueError) as exc:
        raise InputError(f"{public_url(url)}{path}: {exc}") from None


def get_text(url: str, path: str, timeout_s: float = 30.0) -> str:
    try:
        with urllib.request.urlopen(url + path, timeout=timeout_s) as response:
            return str(response.read().decode())
    except (OSError, ValueError) as exc:
        raise InputError(f"{public_url(url)}{path}: {exc}") from None


@dataclass
class ServerFacts:
    """What a server says about itself: its vLLM settings as one ServeConfig (the served model, its
    context length, KV pool and limits, `origins` saying where each came from), and what is not a
    setting: the name it serves under and the blocks its pool holds."""

    served_model: str
    serving: ServeConfig
    """Its model is a bundled model name or a config.json path (the KV geometry that sizes the pool);
    `kv_cache_memory_bytes` is what the server was given (/metrics), when it was given one."""
    num_blocks: int
    assumed: dict[str, str] = field(default_factory=dict)
    """Settings taken from vLLM's defaults, each with a note that says so."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where each figure came from: the settings' origins and the pool's block count."""


def served_model(url: str, name: str | None) -> dict[str, Any]:
    """The /v1/models card of `name`, or of the only model served."""
    cards = get_json(url, "/v1/models").get("data") or []
    if name is not None:
        card = next((c for c in cards if c.get("id") == name), None)
        if card is None:
            raise InputError(f"--model {name!r}: {public_url(url)} serves {', '.join(c.get('id', '?') for c in cards)}")
        return dict(card)
    if len(cards) != 1:
        served = ", ".join(c.get("id", "?") for c in cards) or "nothing"
        raise InputError(f"{public_url(url)} serves {served}: say which with --model")
    return dict(cards[0])


def cache_config(metrics_text: str) -> dict[str, str] | None:
    """The labels of vLLM's `vllm:cache_config_info` (block_size, num_gpu_blocks, ...), None without it."""
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == CACHE_CONFIG_INFO:
                return dict(sample.labels)
    return None


def model_of(root: str, model_config: str | None) -> str:
    """The model whose KV geometry sizes the pool: --model-config, else the served path or a bundled
    config the served name contains (`Qwen/Qwen3-8B` is `qwen3-8b`)."""
    if model_config is not None:
        if model_config not in known_models() and not Path(model_config).exists():
            raise InputError(f"--model-config {model_config!r}: no such file, nor one of {', '.join(known_models())}")
        return model_config
    try:
        return model_reference(ServeConfig(model=root))
    except InputError:
        raise InputError(
            f"the server's model {root!r} is neither a path here nor a bundled config "
            f"({', '.join(known_models())}): give --model-config path/to/config.json"
        ) from None


def read_facts(url: str, *, model_name: str | None, model_config: str | None, vllm_log: Path | None) -> ServerFacts:
    """The server's model, context length and KV pool (/v1/models, /metrics, else the startup log)."""
    card = served_model(url, model_name)
    sources = {"max_model_len": "/v1/models"}
    log = None
    if vllm_log is not None:
        try:
            log = explain_vllm_log(vllm_log.read_text(encoding="utf-8", errors="replace"), source=str(vllm_log))
        except OSError as exc:
            raise InputError(f"--vllm-log {vllm_log}: cannot read: {exc.strerror}") from None
    logged = log.serve_config() if log is not None else ServeConfig()
    on_cpu = log is not None and log.on_cpu
    pool = _kv_pool(url, log, logged, DEVICE_DEFAULTS["cpu" if on_cpu else "gpu"].block_size)
    sources |= dict.fromkeys(("block_size", "num_blocks", "enable_prefix_caching"), pool.source)
    limits, assumed = {}, {}
    for key in SCHEDULER_LIMITS:
        value = getattr(logged, key)
        if value is not None:
            limits[key], sources[key] = value, logged.origins[key]
            continue
        limits[key] = getattr(DEVICE_DEFAULTS["cpu" if on_cpu else "gpu"], key)
        sources[key] = "vLLM's default"
        assumed[key] = (
            f"{key} {limits[key]}: vLLM's default for {'the CPU backend' if on_cpu else 'GPUs under 70 GiB'}; "
            "the server does not export it (give --vllm-config or --vllm-args if it was set)"
        )
    serving = ServeConfig(
        model=model_of(str(card.get("root") or card["id"]), model_config),
        served_model_name=str(card["id"]),
        max_model_len=int(card["max_model_len"]),
        block_size=pool.block_size,
        enable_prefix_caching=pool.prefix_caching,
        kv_cache_dtype=pool.kv_cache_dtype,
        kv_cache_memory_bytes=pool.kv_cache_memory_bytes,
        tensor_parallel_size=logged.tensor_parallel_size,
        pipeline_parallel_size=logged.pipeline_parallel_size,
        origins={k: v for k, v in sources.items() if k in ServeConfig.model_fields},
        **limits,
    )
    return ServerFacts(
        served_model=str(card["id"]), serving=serving, num_blocks=pool.num_blocks, assumed=assumed, sources=sources
    )


@dataclass(frozen=True)
class KvPool:
    """The server's KV pool and where it was read."""

    block_size: int
    num_blocks: int
    prefix_caching: bool
    kv_cache_dtype: str
    kv_cache_memory_bytes: int | None
    source: str


def _kv_pool(url: str, log: LogExplanation | None, logged: ServeConfig, default_block_size: int) -> KvPool:
    """The pool from /metrics' cache_config_info, else from the startup log's KV cache line and settings."""
    info = cache_config(get_text(url, "/metrics"))
    if info is not None and info.get("num_gpu_blocks", "None") != "None":
        given = info.get("kv_cache_memory_bytes", "None")
        return KvPool(
            block_size=int(info["block_size"]),
            num_blocks=int(info["num_gpu_blocks"]),
            prefix_caching=info.get("enable_prefix_caching", "True") == "True",
            kv_cache_dtype=info.get("cache_dtype", "auto"),
            kv_cache_memory_bytes=int(given) if given.isdigit() else None,
            source=f"/metrics {CACHE_CONFIG_INFO}",
        )
    if log is not None and any(f.kind == "kv_size_disagrees" for f in log.findings):
        raise InputError(
            f"--vllm-log {log.source}: its KV cache size line is one KV-cache group's share (a hybrid model), not"
            f" the pool, and {public_url(url)}/metrics has no {CACHE_CONFIG_INFO} with num_gpu_blocks: give a"
            " server whose /metrics exports it"
        )
    if log is not None and (found := [f for f in log.findings if f.kind == "kv_cache_size"]):
        block_size = logged.block_size or default_block_size
        return KvPool(
            block_size=block_size,
            num_blocks=int(found[-1].values["tokens"]) // block_size,
            prefix_caching=logged.enable_prefix_caching is not False,
            kv_cache_dtype=logged.kv_cache_dtype or "auto",
            kv_cache_memory_bytes=logged.kv_cache_memory_bytes,
            source=f"--vllm-log {log.source}",
        )
    raise InputError(
        f"{public_url(url)}/metrics has no {CACHE_CONFIG_INFO} with num_gpu_blocks (vLLM before 0.6?): "
        "give the server's startup log with --vllm-log, which says how many tokens its KV cache holds"
    )


def _layout(facts: ServerFacts, spec: ModelSpec, dtype: str) -> KVLayout:
    """The server's KV layout were its model run in `dtype` (its dtype settings checked as capacity checks them)."""
    return serve_inputs(facts.serving.model_copy(update={"dtype": dtype})).layout(spec)


def sized_serving(facts: ServerFacts) -> ServeConfig:
    """The server's settings with the model dtype and the KV memory (as --kv-cache-memory-bytes) with
    which `plan_capacity` allocates exactly the server's blocks: when the server was given its KV
    memory, the dtype whose bytes per block divide it into that many blocks (vLLM's `--dtype` is not
    exported), else `auto`."""
    spec = load_model(str(facts.serving.model))
    given = facts.serving.kv_cache_memory_bytes
    sized = {"dtype": "auto", "kv_cache_memory_bytes": facts.num_blocks * _layout(facts, spec, "auto").bytes_per_block}
    if given is not None:
        for candidate in ("auto", spec.dtype, "bfloat16", "float16", "float32"):
            if given // _layout(facts, spec, candidate).bytes_per_block == facts.num_blocks:
                sized = {"dtype": candidate, "kv_cache_memory_bytes": given}
                break
    return facts.serving.model_copy(update=sized)
