"""llmload's flags on Locust's command line, and the plan they make (llmload.plan)."""

from __future__ import annotations

from typing import Any

from locust import events

from llmload.fleet import ON_WORKER_LOSS
from llmload.gates.criteria import add_criteria_arguments
from llmload.gates.locust_run import LocustRun
from llmload.plan import PlanFlags
from llmload.schedule import parse_duration
from llmload.server.kinds import kinds


@events.init_command_line_parser.add_listener
def add_arguments(parser: Any) -> None:
    """llmload's flags on Locust's parser, by what they decide: the plan, the requests, the access, the run."""
    for action in parser._actions:  # Locust's own --host, which llmload reads as one replica or several
        if "--host" in action.option_strings:
            action.help = (
                "the target's base URL, e.g. http://127.0.0.1:8000 (default: the embedded target); several replicas"
                " as URL,URL or @FILE (one URL a line): each session stays on one"
            )
    group = parser.add_argument_group("llmload", "open-loop replay of an LLM workload")
    _add_plan_arguments(group)
    _add_request_arguments(group)
    _add_access_arguments(parser)
    _add_run_arguments(group)


def _add_plan_arguments(group: Any) -> None:
    """What is sent when: the workload, the stages, arrivals, limits and the goodput SLO (PlanFlags)."""
    PlanFlags.add_arguments(group, [field for field in PlanFlags.model_fields if field not in PlanFlags.PER_REQUEST])


def _add_request_arguments(group: Any) -> None:
    """What each request asks for and carries: the models, cut streams, prices, headers, the server's kind."""
    group.add_argument(
        "--model", action="append", default=[], metavar="NAME[:WEIGHT]",
        help="served model name (default: the workload's, else /v1/models); repeated with weights, each session asks"
        " for one of them (a LoRA adapter too) in proportion, e.g. --model base:0.7 --model support-lora:0.3",
    )  # fmt: skip
    PlanFlags.add_arguments(group, PlanFlags.PER_REQUEST)
    group.add_argument(
        "--session-header", default=None, metavar="NAME",
        help="send each session's id in this header, for a router that keeps a session on one replica"
        " (e.g. x-session-id); several replicas are --host URL,URL or --host @FILE",
    )  # fmt: skip
    group.add_argument(
        "--server-kind", default=None, choices=list(kinds()),
        help="the kind of server (default: found by probing it): what its requests carry, how its streams end,"
        " which metrics it exports (llmload/server/kinds.yaml)",
    )  # fmt: skip
    group.add_argument(
        "--extra-body", default=None, metavar="JSON",
        help='fields of your own added to every request, e.g. \'{"top_k": 20}\' (never dropped)',
    )  # fmt: skip


def _add_access_arguments(parser: Any) -> None:
    """How every connection to the target is made: its key, headers and TLS (llmload.access)."""
    parser.add_argument(  # on the parser itself: only Locust's parser knows is_secret
        "--api-key", default="", env_var="LLMLOAD_API_KEY", is_secret=True,
        help="bearer token, also from $LLMLOAD_API_KEY (never recorded)",
    )  # fmt: skip
    access = parser.add_argument_group("llmload: access", "how every connection to the target is made (llmload.access)")
    access.add_argument(
        "--header", action="append", default=[], metavar="'NAME: VALUE'",
        help="a header sent with every request to the target, e.g. a gateway's tenant header; repeatable; its value"
        " is never recorded",
    )  # fmt: skip
    access.add_argument(
        "--ca-cert",
        default=None,
        metavar="FILE",
        help="PEM CA certificate(s) an https target is verified against, beside the system's",
    )
    access.add_argument(
        "--client-cert",
        default=None,
        metavar="FILE",
        help="PEM client certificate (mutual TLS); its key inside or in --client-key",
    )
    access.add_argument("--client-key", default=None, metavar="FILE", help="PEM private key of --client-cert")
    access.add_argument(
        "--insecure", action="store_true",
        help="do not verify the target's certificate (said on the console and in the report)",
    )  # fmt: skip


def _add_run_arguments(group: Any) -> None:
    """Where the run goes and what it watches: its directory, verdict, metrics and distributed workers."""
    LocustRun.add_arguments(group, LocustRun.RUN_FLAGS)
    add_criteria_arguments(group)
    group.add_argument(
        "--metrics-interval", type=parse_duration, default=1.0, help="time between /metrics scrapes, > 0 (1s)"
    )
    group.add_argument(
        "--gpu-metrics",
        metavar="URL",
        default=None,
        env_var="LLMLOAD_GPU_METRICS",
        help="an NVIDIA DCGM exporter's /metrics: GPU memory and utilisation into server.jsonl (default: nvidia-smi"
        " when the target runs on this machine, else none)",
    )
    group.add_argument(
        "--prometheus-port", type=int, default=None, help="serve live llmload metrics for Prometheus on this port"
    )
    group.add_argument(
        "--on-worker-loss", choices=ON_WORKER_LOSS, default="resplit",
        help="a distributed run's worker lost mid-run: the others take over its arrivals (resplit), or the run"
        " ends with exit code 2 (stop); either way what it had in flight is recorded as lost",
    )  # fmt: skip
