"""`vllm serve` configurations: llmload's reader (llmload/server/serve_config.py) takes a `--config`
YAML and a command line as vLLM 0.32 does, accepting what it accepts with the same values and
refusing what it refuses.

`given`: (the YAML text or None, the command line). The YAML is passed as `--vllm-config FILE`, or,
where the command line says `{config}`, only there, as `--config {config}`. A command line that
starts with `vllm serve` is read as that command reads it; any other as the api_server module reads
it. `expect`: every option set, by vLLM's dest (`max_num_seqs`), as llmload holds it (JSON values as
their text, the first served model name, `{config}` as the file's path), or {"refused": a fragment
of llmload's message}. tests/test_serve_config_vllm.py sends every case through vLLM's own parser
and asserts it accepts and refuses the same and gives the same values.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from llmload.errors import InputError
from llmload.models import ConfigValue, ServeConfig
from llmload.server.serve_config import read_serve_config
from llmload.server.vllm_options import vllm_options
from tests.conformance import Case

KIND = "vllm-args"
_PARSE = "vllm/utils/argparse_utils.py FlexibleArgumentParser.parse_args"
_CONFIG = "vllm/utils/argparse_utils.py FlexibleArgumentParser._pull_args_from_config, load_config_file"
_TYPES = "vllm/engine/arg_utils.py _compute_kwargs"

CASES: list[Case] = [
    Case("underscores-and-equals", _PARSE + " (underscores to dashes in --names)",
         (None, "--max_num_seqs=3 --max-model-len 2048 --device_memory_utilization 0.5"),
         {"max_num_seqs": 3, "max_model_len": 2048, "gpu_memory_utilization": 0.5}),
    Case("unique-prefix-abbreviates", "Python argparse allow_abbrev (vLLM keeps the default)",
         (None, "--max-model 4096 --enable-prefix"), {"max_model_len": 4096, "enable_prefix_caching": True}),
    Case("ambiguous-prefix-refused", "Python argparse allow_abbrev", (None, "--max-num 3"),
         {"refused": "ambiguous option: --max-num could match"}),
    Case("json-value", _TYPES + " (parse_dataclass, parse_type(json.loads), union_dict_and_str)",
         (None, """--compilation-config '{"cudagraph_capture_sizes": [1, 2, 4]}' """
                """--limit-mm-per-prompt '{"image": 2}' --hf-overrides '{"a": 1}' --speculative-config None"""),
         {"compilation_config": '{"cudagraph_capture_sizes": [1, 2, 4]}', "limit_mm_per_prompt": '{"image": 2}',
          "hf_overrides": '{"a": 1}', "speculative_config": None}),
    Case("dot-notation-builds-json", _PARSE + " (create_nested_dict, recursive_dict_update)",
         (None, "--compilation-config.mode 3 --compilation-config.max_cudagraph_capture_size 8K "
                "--limit-mm-per-prompt.image 2"),
         {"compilation_config": '{"mode": 3, "max_cudagraph_capture_size": 8192}',
          "limit_mm_per_prompt": '{"image": 2}'}),
    Case("dot-notation-per-spelling", _PARSE + " (dict args are keyed by the spelling, -cc apart)",
         (None, "--compilation-config.mode 3 -cc.max_cudagraph_capture_size 8K"),
         {"compilation_config": '{"max_cudagraph_capture_size": 8192}'}),
    Case("dot-notation-replaces-plain-json", _PARSE + " (dict args are passed after all others)",
         (None, """--compilation-config.mode 1 --compilation-config '{"mode": 3}'"""),
         {"compilation_config": '{"mode": 1}'}),
    Case("removed-dataclass-key-refused", "vllm/config/compilation.py CompilationConfig (level became mode)",
         (None, "--compilation-config.level 3"), {"refused": "'level' is not a key of --compilation-config"}),
    Case("optimization-level-short-forms", _PARSE + " (-O3, -O=3, -O 3)", (None, "-O3 -O=2 -O 1"),
         {"optimization_level": "1"}),
    Case("short-aliases", "vllm/engine/arg_utils.py EngineArgs.add_cli_args (-tp, -pp, -dp, -q)",
         (None, "-tp 2 -pp=2 -dp 4 -q awq"),
         {"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "data_parallel_size": 4, "quantization": "awq"}),
    Case("alias-glued-to-value-refused", "Python argparse: -tp2 is no option", (None, "-tp2"),
         {"refused": "tp2: vLLM 0.32.0 does not know this key"}),
    Case("no-forms-of-bools", "Python argparse BooleanOptionalAction; " + _PARSE,
         (None, "--no-enable_prefix_caching --enforce-eager --no-enforce-eager"),
         {"enable_prefix_caching": False, "enforce_eager": False}),
    Case("bool-with-value-refused", "Python argparse BooleanOptionalAction", (None, "--enable-prefix-caching=true"),
         {"refused": "ignored explicit argument 'true'"}),
    Case("nargs-list-and-last-wins", "Python argparse nargs='+' and store",
         (None, "--served-model-name a --served-model-name b c --max-num-seqs 3 --max-num-seqs=4"),
         {"served_model_name": "b", "max_num_seqs": 4}),
    Case("human-readable-numbers", "vllm/utils/argparse_utils.py human_readable_int, human_readable_int_or_auto",
         (None, "--max-model-len 25.6k --max-num-batched-tokens 8K --kv-cache-memory-bytes 64M"),
         {"max_model_len": 25_600, "max_num_batched_tokens": 8192, "kv_cache_memory_bytes": 64 << 20}),
    Case("auto-and-minus-one", "vllm/utils/argparse_utils.py human_readable_int_or_auto",
         (None, "--max-model-len AUTO --max-num-queued-reqs None"), {"max_model_len": -1, "max_num_queued_reqs": None}),
    Case("binary-suffix-decimals-refused", "vllm/utils/argparse_utils.py human_readable_int",
         (None, "--kv-cache-memory-bytes 2.5G"), {"refused": "Decimals are not allowed with binary suffixes like G"}),
    Case("plain-int-takes-no-suffix", _TYPES + " (only five options read human-readable ints)",
         (None, "--max-num-seqs 8K"), {"refused": "argument --max-num-seqs: invalid int value: '8K'"}),
    Case("choices", _TYPES + " (literal_to_kwargs); vllm/engine/arg_utils.py --moe-backend's reader",
         (None, "--moe-backend Triton --dtype half"), {"moe_backend": "triton", "dtype": "half"}),
    Case("choice-is-case-sensitive", _TYPES + " (literal_to_kwargs)", (None, "--dtype Half"),
         {"refused": "invalid choice: 'Half'"}),
    Case("negative-float-breaks-dot-notation", _PARSE + " (a -0.5 has a dot: read as --json-arg.key)",
         (None, "--gpu-memory-utilization 0.5 --max-model-len -1 --kv-offloading-size -0.5"),
         {"refused": "-0.5 expects a value"}),
    Case("command-line-wins-over-file", _CONFIG,
         ("model: m\nmax-model-len: 4096\nmax_num_seqs: 8\n", "vllm serve --max-model-len 2048"),
         {"model": "m", "max_model_len": 2048, "max_num_seqs": 8}),
    Case("positional-model-wins", _CONFIG + "; vllm/entrypoints/cli/serve.py ServeSubcommand.cmd",
         ("model: m\n", "vllm serve x --model y"), {"refused": "unexpected argument 'x'"}),
    Case("model-option-becomes-positional", _PARSE + " (--model moved first for vllm serve)",
         ("model: m\nenforce-eager: true\n", "vllm serve -tp 2 --model=y"),
         {"model": "y", "tensor_parallel_size": 2, "enforce_eager": True}),
    Case("serve-drops-every-false", _CONFIG + " (--no-key looked up in the top-level `vllm` parser)",
         ("model: m\nenable-prefix-caching: false\nmax-num-seqs: 4\n", "vllm serve"),
         {"model": "m", "max_num_seqs": 4}),
    Case("api-server-honours-dashed-false", _CONFIG + " (--no-key only as the file spells the key)",
         ("enable-prefix-caching: false\nenable_chunked_prefill: false\nenforce-eager: false\n", None),
         {"enable_prefix_caching": False, "enforce_eager": False}),
    Case("serve-needs-a-model", _CONFIG, ("max-num-seqs: 4\n", "vllm serve --max-model-len 512"),
         {"refused": "`vllm serve` needs a model"}),
    Case("served-name-needs-positional-model", _PARSE, (None, "vllm serve --served-model-name a"),
         {"refused": "--served-model-name needs the model as the first positional argument"}),
    Case("config-given-twice", _CONFIG + " (asserts one --config)",
         ("max-num-seqs: 4\n", "vllm serve m --config {config} --config {config}"),
         {"refused": "--config is given twice"}),
    Case("config-with-equals-is-not-read", _PARSE + " (only the word --config pulls the file in)",
         ("max-num-seqs: 4\n", "--config={config} --max-model-len 512"),
         {"config": "{config}", "max_model_len": 512}),
    Case("yaml-null-and-list", _CONFIG + " (str(value); a list as several values)",
         ("kv-cache-memory-bytes: null\nserved-model-name: [a, b]\ncudagraph_capture_sizes: []\n", None),
         {"kv_cache_memory_bytes": None, "served_model_name": "a"}),
    Case("yaml-null-for-int-refused", _CONFIG + " (str(None) is 'None')", ("max-num-seqs: null\n", None),
         {"refused": "argument --max-num-seqs: invalid int value: 'None'"}),
    Case("yaml-list-for-one-value", _CONFIG + "; the extra item is a second positional",
         ("max-model-len: [1024, 2048]\n", "vllm serve m"), {"refused": "unexpected argument '2048'"}),
    Case("yaml-mapping-is-json", _CONFIG + " (json.dumps of a mapping)",
         ("speculative-config: {method: ngram, num_speculative_tokens: 3}\nmax-model: 1k\n", None),
         {"speculative_config": '{"method": "ngram", "num_speculative_tokens": 3}', "max_model_len": 1000}),
    Case("api-server-ignores-positional-model",
         "vllm/entrypoints/launchers/api_server/entry.py main (model_tag is parsed, never used)",
         (None, "python -m vllm.entrypoints.openai.api_server m --max-num-seqs 2"),
         {"model_tag": "m", "max_num_seqs": 2}),
]  # fmt: skip


def _file(case: Case, tmp_path: Path) -> Path:
    return tmp_path / f"{case.id}.yaml"


def paths(case: Case, tmp_path: Path) -> tuple[Path | None, str | None]:
    """The case's YAML written to a file, and its command line with `{config}` as that file."""
    text, command_line = case.given
    path = None
    if text is not None:
        path = _file(case, tmp_path)
        path.write_text(text, encoding="utf-8")
    if command_line is not None and "{config}" in command_line:
        return None, command_line.replace("{config}", str(path))
    return path, command_line


def vllm_argv(case: Case, tmp_path: Path) -> list[str]:
    """The argument list vLLM's own parser gets for the case (tests/vllm_parse_args.py): `serve ...`
    for a `vllm serve` command line, the options alone for the api_server."""
    path, command_line = paths(case, tmp_path)
    tokens = shlex.split(command_line or "")
    if tokens[:2] == ["vllm", "serve"]:
        tokens = tokens[1:]
    elif tokens[1:2] == ["-m"]:
        tokens = tokens[3:]
    return [*tokens, *(["--config", str(path)] if path else [])]


def read(config: ServeConfig) -> dict[str, ConfigValue]:
    """What llmload read, by vLLM's dest: every option set (explicit Nones too)."""
    options = vllm_options().options
    modelled = config.model_dump()
    return {
        key if key in modelled else options[key].dest if key in options else key: (
            modelled[key] if key in modelled else config.not_modelled[key]
        )
        for key in config.origins
    }


def expected(case: Case, tmp_path: Path) -> dict[str, Any]:
    """The case's `expect`, `{config}` as the path of its YAML file."""
    return {k: str(_file(case, tmp_path)) if v == "{config}" else v for k, v in case.expect.items()}


def check(case: Case, tmp_path: Path) -> None:
    path, command_line = paths(case, tmp_path)
    if "refused" in case.expect:
        with pytest.raises(InputError) as refused:
            read_serve_config(path, command_line)
        assert case.expect["refused"] in str(refused.value)
        return
    got, want = read(read_serve_config(path, command_line)), expected(case, tmp_path)
    assert got == want, f"llmload read {got}, not {want}"
