"""Derive and verify max_model_len with vLLM's own code, inside vLLM's venv: JSON in, JSON out.

stdin: a JSON list of cases, each {"config": a config.json dict, "max_model_len": int or None,
"disable_sliding_window": bool, "allow_long": bool}; stdout: for each, {"max_model_len": what vLLM
resolves} or {"refused": the ValueError's text}. Each config is written to a directory and loaded
with vLLM's get_config (transformers' config class, vLLM's RoPE patches), then passed, as
ModelConfig.__post_init__ and get_and_verify_max_len do (vllm/config/model.py), through
`_get_and_verify_max_len` with the model's ModelArchConfigConvertor's derived length; the tokenizer's
model_max_length (pooling models only) and sentence-transformers' encoder config are not given, as
llmload reads neither. tests/test_capacity_max_len.py compares llmload's derivation with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import types
from pathlib import Path
from typing import Any


def _verify(case: dict[str, Any], directory: Path) -> dict[str, Any]:
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import get_config, get_hf_text_config
    from vllm.transformers_utils.model_arch_config_convertor import (
        MODEL_ARCH_CONFIG_CONVERTORS,
        ModelArchConfigConvertorBase,
    )

    (directory / "config.json").write_text(json.dumps(case["config"]), encoding="utf-8")
    hf_config = get_config(str(directory), trust_remote_code=False)
    text_config = get_hf_text_config(hf_config)
    convertor = MODEL_ARCH_CONFIG_CONVERTORS.get(hf_config.model_type, ModelArchConfigConvertorBase)
    arch = types.SimpleNamespace(
        derived_max_model_len_and_key=convertor(hf_config, text_config).derive_max_model_len_and_key()
    )
    disable_sliding_window = bool(case.get("disable_sliding_window"))
    sliding_window = getattr(text_config, "sliding_window", None)
    if sliding_window == 0:  # ModelConfig.__post_init__: 0 means no sliding window
        disable_sliding_window, sliding_window = True, None
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1" if case.get("allow_long") else "0"
    try:
        length = _get_and_verify_max_len(
            hf_config=text_config,
            model_arch_config=arch,
            tokenizer_config=None,
            max_model_len=case.get("max_model_len"),
            disable_sliding_window=disable_sliding_window,
            sliding_window=sliding_window,
        )
    except ValueError as exc:
        return {"refused": str(exc)}
    return {"max_model_len": length}


def main() -> None:
    cases: list[dict[str, Any]] = json.load(sys.stdin)
    answers = []
    out = sys.stdout
    with contextlib.redirect_stdout(sys.stderr), tempfile.TemporaryDirectory() as tmp:  # vLLM logs to stdout
        for i, case in enumerate(cases):
            directory = Path(tmp) / str(i)
            directory.mkdir()
            try:
                answers.append(_verify(case, directory))
            except Exception as exc:  # a config vLLM cannot load: its error, for the test to show
                answers.append({"load_error": f"{type(exc).__name__}: {exc}"})
    json.dump(answers, out)


if __name__ == "__main__":
    main()
