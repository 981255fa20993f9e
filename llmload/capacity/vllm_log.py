"""The startup-log explainer: vLLM's KV-cache lines and errors, what they mean, what to change."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, Field, ValidationError

from llmload.capacity.kv import GIB, blocks_for
from llmload.errors import InputError, validation_message
from llmload.models import DEVICE_DEFAULTS, ServeConfig

LogKind = Literal[
    "kv_cache_size",
    "max_concurrency",
    "available_kv_memory",
    "model_loading",
    "kv_memory_set",
    "max_len_too_long",
    "max_len_over_kv_tokens",
    "auto_fit",
    "no_cache_memory",
    "node_memory",
    "device_memory",
]
FAILURE_KINDS = frozenset(
    {"max_len_too_long", "max_len_over_kv_tokens", "no_cache_memory", "node_memory", "device_memory"}
)  # what stops vLLM at startup
LogValue = int | float | str
SERVE_SETTINGS = frozenset(ServeConfig.model_fields) - {"not_modelled", "origins"}


class LogFinding(BaseModel):
    line_no: int
    kind: LogKind
    text: str = Field(description="the message, without the logger prefix")
    values: dict[str, LogValue]
    meaning: str


class LogExplanation(BaseModel):
    source: str
    findings: list[LogFinding]
    settings: dict[str, LogValue] = Field(description="from 'non-default args' / the engine config line")
    on_cpu: bool = Field(default=False, description="the server ran vLLM's CPU backend")
    failed: bool = Field(description="the log shows a KV-cache startup failure")
    implied_bytes_per_token: float | None = None
    implied_bytes_per_token_basis: str | None = None
    advice: list[str] = Field(default_factory=list)

    def serve_config(self) -> ServeConfig:
        """The logged settings ServeConfig models, typed, each one's origin the log; a value vLLM
        would not have logged (the log edited by hand) is an InputError naming the log."""
        given = {key: value for key, value in self.settings.items() if key in SERVE_SETTINGS}
        try:
            return ServeConfig.model_validate({**given, "origins": dict.fromkeys(given, f"--vllm-log {self.source}")})
        except ValidationError as exc:
            raise InputError(f"{self.source}: {validation_message(exc)}") from None


def _num(text: str) -> int | float:
    text = text.replace(",", "")
    return float(text) if "." in text else int(text)


@dataclass(frozen=True)
class _Pattern:
    kind: LogKind
    regex: re.Pattern[str]
    meaning: Callable[[dict[str, LogValue]], str]


_N = r"[\d,]+(?:\.\d+)?"
_PATTERNS = (
    _Pattern(
        "kv_cache_size",
        re.compile(rf"(?P<pool>[A-Z]+(?: \+ host)?) KV cache size: (?P<tokens>{_N}) tokens"),
        lambda v: (
            f"the {v['pool']} KV cache holds {v['tokens']:,} tokens; vLLM prints concurrency × max_model_len, "
            "which is blocks × block_size when max_model_len is a block multiple"
        ),
    ),
    _Pattern(
        "max_concurrency",
        re.compile(rf"Maximum concurrency for (?P<request_tokens>{_N}) tokens per request: (?P<concurrency>{_N})x"),
        lambda v: (
            f"{v['concurrency']:.2f}x requests of {v['request_tokens']:,} tokens fit at once, counted in whole blocks "
            f"(blocks ÷ ⌈{v['request_tokens']:,} / block_size⌉); shorter requests fit more"
        ),
    ),
    _Pattern(
        "available_kv_memory",
        re.compile(rf"Available KV cache memory: (?P<available_kv_gib>{_N}) ?GiB"),
        lambda v: f"{v['available_kv_gib']} GiB per GPU is left for KV after weights, activation peak and CUDA graphs",
    ),
    _Pattern(
        "model_loading",
        re.compile(rf"Model loading took (?P<weights_gib>{_N}) ?GiB"),
        lambda v: f"the weights take {v['weights_gib']} GiB per GPU",
    ),
    _Pattern(
        "kv_memory_set",
        re.compile(
            rf"(?P<how>Explicitly|Auto) set \((?P<kv_set_gib>{_N})/(?P<node_total_gib>{_N})\) GiB for KV cache "
            r"on node (?P<node>\d+)"
        ),
        lambda v: (
            f"{str(v['how']).lower()} set {v['kv_set_gib']} GiB (of {v['node_total_gib']} GiB on NUMA node "
            f"{v['node']}) for the KV cache"
        ),
    ),
    _Pattern(
        "max_len_too_long",
        re.compile(
            rf"max seq len \((?P<max_model_len>\d+)\), \((?P<needed_gib>{_N}) GiB KV cache is needed, which is "
            rf"larger than the available KV cache memory \((?P<available_gib>{_N}) GiB\)"
            r"(?:.*?estimated maximum model length is (?P<estimated_max_len>\d+))?"
        ),
        lambda v: (
            f"one {v['max_model_len']:,}-token request needs {v['needed_gib']} GiB of KV per GPU, more than the "
            f"{v['available_gib']} GiB available, so vLLM refuses to start"
            + (f"; the longest that fits is {v['estimated_max_len']:,}" if "estimated_max_len" in v else "")
        ),
    ),
    _Pattern(
        "max_len_over_kv_tokens",
        re.compile(
            r"max seq len \((?P<max_model_len>\d+)\) is larger than the maximum number of tokens that can be "
            r"stored in KV cache \((?P<kv_tokens>\d+)\)"
        ),
        lambda v: (
            f"max_model_len {v['max_model_len']:,} exceeds the {v['kv_tokens']:,} tokens the KV cache holds, "
            "so vLLM refuses to start"
        ),
    ),
    _Pattern(
        "auto_fit",
        re.compile(r"Auto-fit max_model_len: reduced from (?P<derived_max_len>\d+) to (?P<max_model_len>\d+)"),
        lambda v: (
            f"--max-model-len -1 chose {v['max_model_len']:,}, the longest that fits (the model allows "
            f"{v['derived_max_len']:,})"
        ),
    ),
    _Pattern(
        "no_cache_memory",
        re.compile(r"No available memory for the cache blocks"),
        lambda v: "after weights and activations nothing (or at most the one reserved null block) is left for KV",
    ),
    _Pattern(
        "node_memory",
        re.compile(
            rf"Available memory on node (?P<node>\d+) \((?P<node_free_gib>{_N})/(?P<node_total_gib>{_N}) GiB\) on "
            rf"(?:startup|kv cache allocation) is less than (?:desired CPU memory utilization "
            rf"\((?P<utilization>{_N}), (?P<requested_gib>{_N}) GiB\)|requested memory for kv "
            rf"\((?P<requested_kv_gib>{_N}))"
        ),
        lambda v: (
            f"NUMA node {v['node']} has {v['node_free_gib']} of {v['node_total_gib']} GiB free, less than vLLM "
            + (
                f"asks for (utilization {v['utilization']} = {v['requested_gib']} GiB)"
                if "utilization" in v
                else f"needs for the KV cache ({v['requested_kv_gib']} GiB)"
            )
        ),
    ),
    _Pattern(
        "device_memory",
        re.compile(
            rf"Free memory on device (?:\S+ )?\((?P<free_gib>{_N})/(?P<total_gib>{_N}) GiB\) on startup is less "
            rf"than desired GPU memory utilization \((?P<utilization>{_N}), (?P<requested_gib>{_N}) GiB\)"
        ),
        lambda v: (
            f"only {v['free_gib']} of {v['total_gib']} GiB is free on the GPU, less than utilization "
            f"{v['utilization']} asks for ({v['requested_gib']} GiB): another process holds GPU memory"
        ),
    ),
)
_SETTINGS_LINE = re.compile(r"non-default args:|Initializing a V1 LLM engine")
_SETTING = re.compile(
    r"(?<![\w])['\"]?(?P<key>max_model_len|max_seq_len|kv_cache_memory_bytes|gpu_memory_utilization|"
    r"tensor_parallel_size|pipeline_parallel_size|kv_cache_dtype|block_size|device_config|max_num_seqs|"
    r"max_num_batched_tokens|enable_prefix_caching)['\"]?\s*[:=]\s*['\"]?(?P<value>[\w.]+)"
)
_MESSAGE_START = re.compile(r"^.*?\] (?:\w+Error: )?|^\w+Error: ")


def _settings(lines: Iterable[str]) -> dict[str, LogValue]:
    found: dict[str, LogValue] = {}
    for line in lines:
        if _SETTINGS_LINE.search(line):
            for m in _SETTING.finditer(line):
                key = "max_model_len" if m["key"] == "max_seq_len" else m["key"]
                value = m["value"]
                found.setdefault(key, _num(value) if re.fullmatch(r"[\d.]+", value) else value)
    return found


def _implied_bytes_per_token(
    facts: dict[str, LogValue], settings: dict[str, LogValue], block_size: int
) -> tuple[float | None, str | None]:
    """KV bytes per token (per GPU) from whichever numbers the log gives, most exact first."""
    kv_bytes = settings.get("kv_cache_memory_bytes")
    tokens, length = facts.get("tokens"), facts.get("request_tokens")
    physical = None
    if isinstance(tokens, int) and isinstance(length, int):
        # vLLM logs int(num_blocks / ceil(L / block_size) × L): invert it to whole blocks.
        per_request = blocks_for(length, block_size)
        physical = -(-tokens * per_request // length) * block_size
    elif isinstance(tokens, int):
        physical = tokens
    if isinstance(kv_bytes, int) and physical:
        return (
            kv_bytes / physical,
            f"kv_cache_memory_bytes {kv_bytes:,} / {physical:,} tokens ({block_size}-token blocks)",
        )
    available = facts.get("available_kv_gib")
    if isinstance(available, float) and physical:
        return available * GIB / physical, f"Available KV cache memory {available} GiB / {physical:,} tokens (±0.5%)"
    estimated = facts.get("estimated_max_len")
    if isinstance(kv_bytes, int) and isinstance(estimated, int):
        total = estimated + block_size  # the estimate leaves out the null block
        return (
            kv_bytes / total,
            f"kv_cache_memory_bytes {kv_bytes:,} / ({estimated:,} + one {block_size}-token null block)",
        )
    kv_tokens = facts.get("kv_tokens")
    if isinstance(kv_bytes, int) and isinstance(kv_tokens, int):
        return kv_bytes / kv_tokens, f"kv_cache_memory_bytes {kv_bytes:,} / {kv_tokens:,} KV tokens"
    needed, length = facts.get("needed_gib"), facts.get("max_model_len")
    if isinstance(needed, float) and needed > 0 and isinstance(length, int):
        rounded = blocks_for(length, block_size) * block_size
        return needed * GIB / rounded, f"{needed} GiB needed / {rounded:,} tokens (±0.5%)"
    return None, None


def _log_advice(
    facts: dict[str, LogValue], kinds: set[str], settings: dict[str, LogValue], bpt: float | None, block_size: int
) -> list[str]:
    advice: list[str] = []
    kv_dtype = str(settings.get("kv_cache_dtype", "auto"))
    tp = settings.get("tensor_parallel_size")
    tp = tp if isinstance(tp, int) else 1
    estimated = facts.get("estimated_max_len") or facts.get("kv_tokens")
    if isinstance(estimated, int) and estimated > 0:
        limit = estimated // block_size * block_size
        advice.append(f"Lower --max-model-len to {limit:,} or less (the longest that fits this KV memory).")
    length = facts.get("max_model_len")
    if kinds & {"max_len_too_long", "max_len_over_kv_tokens"} and isinstance(length, int):
        if "kv_cache_memory_bytes" in settings and bpt:
            blocks = blocks_for(length, block_size) + 1  # + vLLM's null block
            need = math.ceil(blocks * block_size * bpt)
            advice.append(
                f"Or raise --kv-cache-memory-bytes to at least {need:,} ({blocks} blocks of {block_size} tokens: "
                f"{length:,} tokens plus the null block)."
            )
        else:
            advice.append("Or give KV more memory: raise --gpu-memory-utilization, or free memory on the GPU.")
    if kinds & {"max_len_too_long", "max_len_over_kv_tokens"}:
        if not kv_dtype.startswith("fp8"):
            advice.append("--kv-cache-dtype fp8 halves bytes per token, doubling the tokens that fit.")
        advice.append(
            f"--tensor-parallel-size {2 * tp} splits KV heads and weights over twice the GPUs "
            "(not the KV of MLA models, which every rank stores whole)."
        )
    if "no_cache_memory" in kinds:
        advice.append(
            "Weights and activations use all of gpu_memory_utilization × memory: raise --gpu-memory-utilization, "
            "use a quantized checkpoint or more GPUs; on CPU, --kv-cache-memory-bytes must exceed one block "
            f"({block_size} tokens × bytes per token), which vLLM keeps as the null block."
        )
    for kind, free, total in (
        ("node_memory", "node_free_gib", "node_total_gib"),
        ("device_memory", "free_gib", "total_gib"),
    ):
        if kind in kinds and isinstance(facts.get(free), float) and isinstance(facts.get(total), float):
            ceiling = float(facts[free]) / float(facts[total])
            advice.append(
                f"Lower --gpu-memory-utilization below {ceiling:.2f} (free / total), or set --kv-cache-memory-bytes "
                "explicitly (CPU: VLLM_CPU_KVCACHE_SPACE); on CPU the flag is the share of the NUMA node's RAM."
            )
    if not kinds & FAILURE_KINDS and isinstance(facts.get("tokens"), int):
        advice.append(
            f"Concurrency is quoted for full-length requests; for your workload's P99 request it is about "
            f"{facts['tokens']:,} / P99 tokens: `llmload capacity --model-config ... --request-tokens P99`."
        )
    return advice


def explain_vllm_log(text: str, *, source: str = "<log>") -> LogExplanation:
    """Find vLLM's KV-cache lines and errors in a startup log; say what they mean and what to change."""
    lines = text.splitlines()
    findings: list[LogFinding] = []
    seen: set[tuple[str, str]] = set()
    facts: dict[str, LogValue] = {}
    for line_no, line in enumerate(lines, 1):
        for pattern in _PATTERNS:
            m = pattern.regex.search(line)
            if m is None:
                continue
            values: dict[str, LogValue] = {
                k: v if k in ("pool", "how") else _num(v) for k, v in m.groupdict().items() if v is not None
            }
            message = _MESSAGE_START.sub("", line, count=1).strip()
            if (pattern.kind, message) in seen:  # errors are printed twice: engine traceback, then re-raised
                continue
            seen.add((pattern.kind, message))
            findings.append(
                LogFinding(
                    line_no=line_no, kind=pattern.kind, text=message, values=values, meaning=pattern.meaning(values)
                )
            )
            facts.update(values)
    settings = _settings(lines)
    kinds: set[str] = {f.kind for f in findings}
    cpu = (
        "CPU" in str(facts.get("pool", ""))
        or "cpu" in str(settings.get("device_config", ""))
        or bool(kinds & {"kv_memory_set", "node_memory"})
    )
    logged_block_size = settings.get("block_size")
    default_block_size = DEVICE_DEFAULTS["cpu" if cpu else "gpu"].block_size
    block_size = logged_block_size if isinstance(logged_block_size, int) else default_block_size
    bpt, basis = _implied_bytes_per_token(facts, settings, block_size)
    return LogExplanation(
        source=source,
        findings=findings,
        settings=settings,
        on_cpu=cpu,
        failed=bool(kinds & FAILURE_KINDS),
        implied_bytes_per_token=bpt,
        implied_bytes_per_token_basis=basis,
        advice=_log_advice(facts, kinds, settings, bpt, block_size),
    )
