"""`llmload sim calibrate`: fit a simulator profile to a running vLLM server (llmload.calibrate).

Single requests of growing prompts time the prefill, batches of concurrent streams at several
context lengths time the decode step, all by the server's own /metrics; a steady stream of
chats sharing system prompts, in windows between the later rounds, measures how much longer
steps take under steady arrivals; all within --duration. The KV pool comes from /metrics (or
--vllm-log). The profile written to -o holds the fitted timing and the points behind it (R²,
residuals); `llmload sim --profile FILE.yaml` then stands in for that server, and
`--vllm-config` on top tries settings it never ran.
Run it while nothing else uses the server. Exit code 1 when the fit is poor (the profile is
written all the same, and says so).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from llmload.server.arguments import add_serving_arguments

HELP = "fit a profile to a running vLLM server: `llmload sim calibrate --host URL -o profile.yaml`"


def _duration(text: str) -> float:
    from llmload.schedule import parse_duration

    return parse_duration(text)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--host", required=True, help="the vLLM server's base URL, e.g. http://10.0.0.5:8000")
    add("-o", "--output", type=Path, required=True, metavar="FILE.yaml", help="where to write the profile")
    add("--force", action="store_true", help="overwrite --output if it exists")
    add("--model", default=None, help="served model name (default: the only one the server serves)")
    add("--duration", type=_duration, default=120.0, help="measuring time, e.g. 90s, 3m (default: 2m)")
    add(
        "--steady-load", type=_duration, default=None, metavar="DURATION",
        help="of --duration, the steady-arrival point's time (default: a quarter; 0 skips it)",
    )  # fmt: skip
    add("--name", default=None, help="the profile's name (default: MODEL-calibrated)")
    add("--max-streams", type=int, default=64, help="most concurrent streams in one probe (default: %(default)s)")
    add("--output-tokens", type=int, default=64, help="tokens each decode stream generates (default: %(default)s)")
    add(
        "--model-config", metavar="NAME|PATH", default=None,
        help="the model's config.json (or a bundled name) when the server's model path is not on this machine",
    )  # fmt: skip
    add_serving_arguments(parser, "the server's vLLM settings it does not export (max-num-seqs, TP, dtype, ...)")
    add("--vllm-log", type=Path, metavar="FILE", help="the server's startup log: KV size when /metrics lacks it")


def run(args: argparse.Namespace) -> int:
    """0: written, a good fit; 1: written, a poor fit; InputError for bad flags or an unusable server."""
    import yaml

    from llmload.calibrate.render import render_fit
    from llmload.calibrate.run import CalibrationSettings, calibrate
    from llmload.errors import InputError
    from llmload.server.arguments import serving_config
    from llmload.server.detect import require_calibrating_server

    if args.output.exists() and not args.force:
        raise InputError(f"--output {args.output} exists: give --force to replace it, or another file")
    for flag, value in (("--max-streams", args.max_streams), ("--output-tokens", args.output_tokens)):
        if value < 1:
            raise InputError(f"{flag} must be at least 1, got {value}")
    if args.steady_load is not None and not 0 <= args.steady_load < args.duration:
        raise InputError(f"--steady-load {args.steady_load:g} s must be at least 0 and shorter than --duration")
    serving = serving_config(args)
    settings = CalibrationSettings(
        budget_s=args.duration,
        steady_load_s=args.steady_load,
        max_streams=args.max_streams,
        output_tokens=args.output_tokens,
        model_name=args.model,
        model_config=args.model_config,
        serve=serving if serving.origins else None,
        vllm_log=args.vllm_log,
        name=args.name,
    )
    require_calibrating_server(args.host)
    print(f"llmload sim calibrate: measuring {args.host} for {args.duration:g} s ...", flush=True)
    result = calibrate(args.host, settings, progress=lambda line: print(f"  {line}", flush=True))
    header = f"# {result.profile.calibration}\n# use: llmload sim --profile {args.output}\n"
    body = yaml.safe_dump(result.profile.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
    try:
        args.output.write_text(header + body, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"--output {args.output}: cannot write: {exc.strerror}") from None
    print(render_fit(result.profile, result.measured.facts.sources))
    print(f"profile: {args.output}")
    assert result.profile.fit is not None
    return 1 if result.profile.fit.poor else 0
