"""Installed, not checked out: the wheel built from this checkout, installed in a fresh venv, runs the
demo from an empty directory (the locustfile and the sample workload are package data), and `llmload
run --help` lists llmload's flags with Locust's. Offline and in seconds: the wheel is built with this
venv's setuptools and installed without its dependencies, which the new venv reads from this one."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import orjson

from tests.locust_runs import REPO


def _run(*command: str | Path, cwd: Path, timeout: float = 120) -> str:
    """Its output; without PYTHONPATH, so the installed venv never sees this checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    assert proc.returncode == 0, (command, proc.stdout[-3000:], proc.stderr[-3000:])
    return proc.stdout


def test_the_wheel_installed_in_a_fresh_venv_runs_the_demo_from_an_empty_directory(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: an in-tree build/ would carry modules deleted since
    shutil.copytree(REPO / "llmload", source / "llmload", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source)
    _run(
        sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", tmp_path, ".", cwd=source
    )
    [wheel] = tmp_path.glob("llmload-*.whl")
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = Path(_run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).strip())
    (purelib / "dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")  # after its own packages
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel, cwd=tmp_path
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    llmload = venv / "bin" / "llmload"

    locustfile = Path(_run(llmload, "locustfile", cwd=empty).strip())
    assert locustfile.is_relative_to(purelib) and locustfile.is_file()
    assert "--target-qps" in _run(llmload, "run", "--help", cwd=empty)
    assert "vllm-cpu-tiny" in _run(llmload, "sim", "--help", cwd=empty)  # the built-in profiles: package data
    output = _run(llmload, "demo", "--duration", "4", "--warmup", "0", cwd=empty)
    [run_dir] = (empty / "reports").iterdir()
    assert (run_dir / "report.html").is_file(), output
    manifest = orjson.loads((run_dir / "run.json").read_bytes())
    assert Path(manifest["workload"]).is_relative_to(purelib)  # the packaged sample, its absolute path
    assert "0 failed" in output, output
