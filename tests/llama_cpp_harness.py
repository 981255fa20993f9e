"""Run a real llama.cpp ``llama-server`` (CPU build) for end-to-end tests.

No prebuilt llama.cpp is reachable here, but PyPI is: the ``llama-cpp-python`` sdist vendors the whole
llama.cpp tree (``vendor/llama.cpp``), so the harness downloads that sdist once, builds only the
``llama-server`` target with CMake (Release, CPU only, static libs, no OpenSSL/CURL, no web UI; ggml at -O3,
the C++ around it at -Og and partly as unity builds: ``_CMAKE_TUNING``) and installs
the binary plus llama.cpp's own HF->GGUF converter into the cache. The tiny model is the vLLM harness's
random-weight Llama (``build_tiny_model``), converted to an F32 GGUF with that converter run by the vLLM
venv's python (it has torch/transformers; ``gguf`` comes from the sdist's ``gguf-py``). The converter does
not know the tiny tokenizer's pre-tokenizer hash, so the conversion runs through a small wrapper that maps an
unknown hash to ``gpt-2`` when ``tokenizer.json`` says the pre-tokenizer is plain GPT-2 ByteLevel (which
it is): the tokens llama.cpp then produces match the HF tokenizer's exactly.

Measured on a 2-core machine: the sdist download takes about 35 s, configure 2 s, the build about 2.5 min
(``-j2``; 5 min with every file at -O3 and no unity builds); ``llama-server`` starts in well under a second.
``-c`` is the total KV context: each of the ``--parallel`` slots gets ``c / parallel`` tokens (rounded up to a
multiple of 256), and a request whose prompt does not fit its slot is refused with 400
``exceed_context_size_error``.

CLI for developers: ``python -m tests.llama_cpp_harness serve [--ctx-size N] [--parallel N] [-- extra flags]``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Unpack

from tests.server_harness import (
    CACHE_ROOT,
    SERVED_MODEL_NAME,
    HarnessOptions,
    HarnessServer,
    child_env,
    developer_cli,
    file_lock,
    tail,
)
from tests.vllm_harness import TINY_MODEL_SCRIPT, build_tiny_model, venv_python

LLAMA_CPP_PY_VERSION = "0.3.36"  # llama-cpp-python sdist; vendors llama.cpp commit 0c1e57098
CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained binary: only system libs (libgomp, libstdc++) needed
    "-DLLAMA_CURL=OFF",  # obsolete in this llama.cpp (no libcurl use any more); kept for older trees
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS model downloads needed
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # the server lives under tools/
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # no npm build ...
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # ... and no download of the web UI from Hugging Face
    "-DGGML_CCACHE=OFF",
)
# Compile less, and less hard, outside ggml (2-core `cmake --build -j2`: 298 s became 159 s).
# CMAKE_PROJECT_INCLUDE runs this after each project(); at the end of the top-level directory it sets
# -Og (after Release's -O3, so it wins) on the C++ around the kernels: the model code, the server, its JSON
# and chat templates, and the multimodal library llama-server links but a text model never calls. ggml,
# where a forward pass spends its time, stays -O3. The header-heavy libraries (nlohmann JSON in nearly
# every file) are unity builds; three sources that cannot share a translation unit stay out of them.
# Needs CMake >= 3.19 (cmake_language(DEFER)).
_CMAKE_TUNING = """\
if(CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  function(llmload_tune)
    foreach(target llama llama-common mtmd server-context llama-server-impl llama-server cpp-httplib)
      target_compile_options(${target} PRIVATE -Og)
    endforeach()
    set_target_properties(llama-common mtmd server-context llama-server-impl PROPERTIES UNITY_BUILD ON)
    set_target_properties(server-context PROPERTIES UNITY_BUILD_BATCH_SIZE 5)  # 9 files: two even halves
    # json.cpp specializes templates that other files instantiate; the helpers #error on mtmd's internals
    set(common "${CMAKE_SOURCE_DIR}/common")
    set(mtmd "${CMAKE_SOURCE_DIR}/tools/mtmd")
    set_property(SOURCE "${common}/json.cpp" DIRECTORY "${common}" PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
    set_property(SOURCE "${mtmd}/mtmd-helper.cpp" "${mtmd}/mtmd-helper-gen.cpp" DIRECTORY "${mtmd}"
                 PROPERTY SKIP_UNITY_BUILD_INCLUSION ON)
  endfunction()
  cmake_language(DEFER CALL llmload_tune)
endif()
"""
# The cache key of a build: a change of flags or tuning builds anew rather than reusing an old binary.
BUILD_KEY = hashlib.sha256("\n".join((*CMAKE_ARGS, _CMAKE_TUNING)).encode()).hexdigest()[:8]
# What the converter needs to run outside the source tree.
_CONVERTER_FILES = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")

# Runs convert_hf_to_gguf.py (argv[1] = converter dir, argv[2:] = its args) with one addition: a BPE
# tokenizer whose pre-tokenizer hash is unknown but whose tokenizer.json pre-tokenizer is plain GPT-2
# ByteLevel (regex on) is written as tokenizer.ggml.pre = "gpt-2" instead of being refused.
_CONVERT_WRAPPER = """\
import json, runpy, sys
from pathlib import Path
src = Path(sys.argv[1])
sys.path[:0] = [str(src / "gguf-py"), str(src)]
from conversion import base
_orig = base.TextModel.get_vocab_base_pre
def get_vocab_base_pre(self, tokenizer):
    try:
        return _orig(self, tokenizer)
    except NotImplementedError:
        pre = json.loads((Path(self.dir_model) / "tokenizer.json").read_text()).get("pre_tokenizer") or {}
        if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
            return "gpt-2"
        raise
base.TextModel.get_vocab_base_pre = get_vocab_base_pre
sys.argv = [str(src / "convert_hf_to_gguf.py"), *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def install_dir() -> Path:
    return CACHE_ROOT / f"llama.cpp-{LLAMA_CPP_PY_VERSION}-{BUILD_KEY}"


def server_binary() -> Path:
    return install_dir() / "bin" / "llama-server"


def converter_dir() -> Path:
    return install_dir() / "convert"


def build_log() -> Path:
    return CACHE_ROOT / f"llama.cpp-{LLAMA_CPP_PY_VERSION}-{BUILD_KEY}-build.log"


def _run_logged(cmd: Sequence[str], log: Path, *, cwd: Path | None = None) -> float:
    """Run ``cmd`` appending its output to ``log``; return seconds taken, raise with the log tail on failure."""
    t0 = time.monotonic()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        rc = subprocess.run(
            list(cmd), stdout=out, stderr=subprocess.STDOUT, cwd=cwd, stdin=subprocess.DEVNULL, check=False
        ).returncode
        elapsed = time.monotonic() - t0
        out.write(f"exit {rc} after {elapsed:.1f}s\n")
    if rc != 0:
        raise RuntimeError(f"llama.cpp build step failed ({cmd[0]}, exit {rc}); last lines of {log}:\n{tail(log)}")
    return elapsed


def _build(work: Path, dest: Path, log: Path) -> dict[str, Any]:
    """Download the sdist, build llama-server in ``work``, install into ``dest``; return build facts."""
    timings: dict[str, float] = {}
    dl = work / "dl"
    timings["download_s"] = _run_logged(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
         f"llama-cpp-python=={LLAMA_CPP_PY_VERSION}", "-d", str(dl)],
        log,
    )  # fmt: skip
    sdists = sorted(dl.glob("llama_cpp_python-*.tar.gz"))
    if len(sdists) != 1:
        raise RuntimeError(f"expected one llama-cpp-python sdist in {dl}, found {[p.name for p in sdists]}")
    t0 = time.monotonic()
    with tarfile.open(sdists[0]) as tar:
        tar.extractall(work / "src", filter="data")
    timings["extract_s"] = time.monotonic() - t0
    src = work / "src" / f"llama_cpp_python-{LLAMA_CPP_PY_VERSION}" / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").exists():
        raise RuntimeError(f"no vendored llama.cpp in the sdist (looked for {src})")
    build = work / "build"
    tuning = work / "llmload-tuning.cmake"
    tuning.write_text(_CMAKE_TUNING)
    configure = ["cmake", "-S", str(src), "-B", str(build), *CMAKE_ARGS, f"-DCMAKE_PROJECT_INCLUDE={tuning}"]
    timings["configure_s"] = _run_logged(configure, log)
    jobs = str(os.cpu_count() or 2)
    timings["build_s"] = _run_logged(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], log)

    (dest / "bin").mkdir(parents=True)
    shutil.copy2(build / "bin" / "llama-server", dest / "bin" / "llama-server")
    (dest / "convert").mkdir()
    for name in _CONVERTER_FILES:
        path = src / name
        if path.is_dir():
            shutil.copytree(path, dest / "convert" / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, dest / "convert" / name)
    version = subprocess.run(
        [str(dest / "bin" / "llama-server"), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    if version.returncode != 0:
        raise RuntimeError(f"built llama-server does not run (exit {version.returncode}): {version.stderr[-2000:]}")
    return {
        "llama_cpp_python_sdist": LLAMA_CPP_PY_VERSION,
        "version": (version.stdout + version.stderr).strip(),
        "cmake_args": list(CMAKE_ARGS),
        "cmake_project_include": _CMAKE_TUNING,
        "jobs": int(jobs),
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def ensure_llama_server() -> Path:
    """Return the ``llama-server`` binary, downloading the sdist and building it first if not yet cached."""
    dest = install_dir()
    marker = dest / ".llmload-ready"
    if marker.exists() and server_binary().exists():
        return server_binary()
    log = build_log()
    with file_lock(CACHE_ROOT / f".llama.cpp-{LLAMA_CPP_PY_VERSION}-{BUILD_KEY}.lock"):
        if marker.exists() and server_binary().exists():  # another process finished while we waited
            return server_binary()
        work = CACHE_ROOT / "build" / f"llama.cpp-{LLAMA_CPP_PY_VERSION}-{BUILD_KEY}"
        for stale in (work, dest):  # leftovers of an interrupted build
            if stale.exists():
                shutil.rmtree(stale)
        work.mkdir(parents=True)
        with log.open("a") as out:
            out.write(f"\n=== build llama-server from llama-cpp-python {LLAMA_CPP_PY_VERSION} {time.ctime()}\n")
        try:
            info = _build(work, dest, log)
        except BaseException:
            shutil.rmtree(dest, ignore_errors=True)
            raise
        (dest / "BUILD-INFO.json").write_text(json.dumps(info, indent=2) + "\n")
        with log.open("a") as out:
            out.write(f"installed {server_binary()}: {json.dumps(info)}\n")
        shutil.rmtree(work)  # ~300 MB of sources and objects
        with contextlib.suppress(OSError):  # the build/ parent, unless something else uses it
            work.parent.rmdir()
        marker.write_text(f"llama-cpp-python=={LLAMA_CPP_PY_VERSION} ready {time.strftime('%Y-%m-%dT%H:%M:%S')}\n")
    return server_binary()


def tiny_gguf_path() -> Path:
    """Cache path keyed on the recipe: the HF model's builder, the llama.cpp version and the conversion."""
    recipe = TINY_MODEL_SCRIPT.read_bytes() + LLAMA_CPP_PY_VERSION.encode() + _CONVERT_WRAPPER.encode() + b"f32"
    return CACHE_ROOT / "models" / f"tiny-llama-{hashlib.sha256(recipe).hexdigest()[:12]}.f32.gguf"


def build_tiny_gguf(dest: Path | None = None) -> Path:
    """Build (or reuse) the tiny Llama as an F32 GGUF with llama.cpp's converter; returns the file."""
    dest = dest or tiny_gguf_path()
    if dest.exists():
        return dest
    hf_model = build_tiny_model()  # also ensures the vLLM venv, whose python runs the converter
    ensure_llama_server()  # installs the converter beside the binary
    with file_lock(dest.parent / f".{dest.name}.lock"):
        if dest.exists():
            return dest
        tmp = dest.with_name(f"{dest.name}.tmp-{os.getpid()}")
        cmd = [
            str(venv_python()), "-c", _CONVERT_WRAPPER, str(converter_dir()),
            str(hf_model), "--outfile", str(tmp), "--outtype", "f32",
        ]  # fmt: skip
        proc = subprocess.run(cmd, env=child_env(), capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0 or not tmp.exists():
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"GGUF conversion failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
        tmp.rename(dest)  # atomic: readers never see a half-written file
    return dest


class LlamaServer(HarnessServer):
    """One llama.cpp `llama-server` serving `tiny-llama` (`--alias`) with its metrics on."""

    label = "llama-server"
    stop_timeout_s = 10.0
    startup_timeout_s = 60.0

    def __init__(
        self, model_path: Path, *, ctx_size: int = 4096, parallel: int = 4, **options: Unpack[HarnessOptions]
    ) -> None:
        super().__init__(model_path, **options)
        self.ctx_size = ctx_size
        self.parallel = parallel

    def install(self) -> Path:
        return ensure_llama_server()

    def env(self) -> dict[str, str]:
        """child_env() without LLAMA_ARG_* variables, which llama-server reads as flags."""
        return {k: v for k, v in child_env().items() if not k.startswith("LLAMA_ARG_")}

    def command(self) -> list[str]:
        assert self.port is not None
        return [
            str(self.program or server_binary()),
            "-m", str(self.model),
            "--alias", SERVED_MODEL_NAME,
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "-c", str(self.ctx_size),
            "--parallel", str(self.parallel),
            "--metrics",
            *self.extra_args,
        ]  # fmt: skip

    def props(self, timeout: float = 5.0) -> dict[str, Any]:
        """`GET /props`: e.g. `build_info` ("b1-0c1e570"), `total_slots`, per-slot `n_ctx`."""
        with urllib.request.urlopen(f"{self.url}/props", timeout=timeout) as resp:
            data: dict[str, Any] = json.load(resp)
        return data


def _server(args: argparse.Namespace) -> LlamaServer:
    return LlamaServer(build_tiny_gguf(), ctx_size=args.ctx_size, parallel=args.parallel, extra_args=args.extra)


def _print_built_paths() -> None:
    print(ensure_llama_server())
    print(build_tiny_gguf())


def _serve_options(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--ctx-size", type=int, default=4096)
    serve.add_argument("--parallel", type=int, default=4)


def main(argv: Sequence[str] | None = None) -> int:
    return developer_cli(
        argv,
        server="llama-server",
        flags="llama-server",
        serve_options=_serve_options,
        start=_server,
        commands={"build": ("build (or find) llama-server and the tiny GGUF, print their paths", _print_built_paths)},
    )


if __name__ == "__main__":
    sys.exit(main())
