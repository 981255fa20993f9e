"""Bad input is refused before any load is sent: exit code 2, one clear line naming the flag, file,
line or host, never a traceback. One row per case: the command, its input, the exit code and a
fragment of what it must say. Every command is a real child process (`llmload ...`, or Locust with
loadtests/chat.py); they run a few at a time, so the table takes seconds, not minutes."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmload.rundir import RECORDS_FILE
from tests.locust_runs import LOCUSTFILE, REPO, llmload_command
from tests.test_report_html import synthetic_run

LOGS = REPO / "tests" / "data" / "logs"
WORKLOAD = REPO / "workloads" / "chat-multiturn.yaml"
PARALLEL = 4  # children at once: each is mostly interpreter start-up
CHILD_TIMEOUT_S = 60


@dataclass(frozen=True)
class Case:
    """One bad input. `argv` and `says` may name `{dir}` (the scratch directory with the inputs
    below), `{closed}` (a loopback port where nothing listens) and `{busy}` (one that is taken)."""

    id: str
    argv: tuple[str, ...]
    says: str
    code: int = 2


def locust(*flags: str, workload: str = str(WORKLOAD), host: str = "http://127.0.0.1:{closed}") -> tuple[str, ...]:
    """A headless Locust run; its target is a closed port, so a flag that was not refused says so."""
    return (
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--workload", workload, "--reports-dir", "{dir}/reports", "--host", host, *flags,
    )  # fmt: skip


def llmload(*args: str) -> tuple[str, ...]:
    return tuple(llmload_command(*args))


def build(log: str, *flags: str, output: str = "{dir}/w.yaml") -> tuple[str, ...]:
    """`llmload workload build` of one log into `output`."""
    return llmload("workload", "build", log, "-o", output, *flags)


OUT_OF_RANGE = (
    "--stage-duration", "0", "--hold-duration", "-5", "--target-qps", "0", "--timeout-total", "0",
    "--history-turns", "0", "--first-session", "-1",
)  # fmt: skip

CASES = [
    # the plan's flags, each out of its range (llmload.plan.PlanFlags), on Locust's command line
    Case("burstiness-0", locust("--burstiness", "0"), "--burstiness: Input should be greater than 0"),
    Case("burstiness-gamma", locust("--arrival", "gamma", "--burstiness", "-1"), "--burstiness: Input should be"),
    Case("drain-timeout", locust("--drain-timeout", "-1"), "--drain-timeout: Input should be greater than or equal"),
    Case(  # two at once, both named
        "seed-and-max-users",
        locust("--max-users", "0", "--seed", "-1"),
        "--seed: Input should be greater than or equal to 0; --max-users: Input should be greater than 0",
    ),
    Case("time-scale-trace", locust("--time-scale", "0", "--arrival", "trace"), "--time-scale: Input should be"),
    Case(  # several at once: each is named, in one line (one Locust start instead of six)
        "plan-ranges",
        locust(*OUT_OF_RANGE),
        "--target-qps: Input should be greater than 0; --stage-duration: Input should be greater than 0;"
        " --hold-duration: Input should be greater than 0; --first-session: Input should be greater than or equal to"
        " 0; --history-turns: Input should be greater than 0; --timeout-total: Input should be greater than 0",
    ),
    Case("stages", locust("--stages", "abc"), "--stages wants comma-separated percents like 25,50,100,150"),
    Case("metrics-interval", locust("--metrics-interval", "0"), "argument --metrics-interval: not a duration: '0'"),
    Case("warmup", locust("--warmup", "-5"), "argument --warmup: not a duration: '-5'"),
    Case("goodput-slo", locust("--goodput-slo", "fast"), "--goodput-slo 'fast': expected METRIC=MS"),
    Case("label", locust("--label", "bad"), "--label 'bad': expected KEY=VALUE"),
    Case("extra-body", locust("--extra-body", "[1]"), "--extra-body: not a JSON object: a list"),
    # how the target is reached (llmload.access)
    Case(
        "ca-cert-missing", locust("--ca-cert", "{dir}/no-such-ca.pem"), "--ca-cert {dir}/no-such-ca.pem: no such file"
    ),
    Case("ca-cert-not-pem", locust("--ca-cert", "{dir}/notes.txt"), "--ca-cert {dir}/notes.txt: not a PEM"),
    Case("client-key-alone", locust("--client-key", "{dir}/key.pem"), "--client-key needs --client-cert"),
    Case(
        "model-weight-zero", locust("--model", "base:0"), "--model 'base:0': give NAME or NAME:WEIGHT, a weight above 0"
    ),
    Case("model-twice", locust("--model", "base", "--model", "base:2"), "--model: each model once"),
    Case("header-without-colon", locust("--header", "X-Tenant"), "--header 'X-Tenant': give 'Name: value'"),
    Case("insecure-and-ca", locust("--insecure", "--ca-cert", "{dir}/notes.txt"), "--insecure verifies nothing"),
    # streams cut on purpose (llmload.cancel)
    Case("cancel-share-alone", locust("--cancel-share", "0.1"), "--cancel-share needs --cancel-after tokens:"),
    Case("cancel-share-one", locust("--cancel-share", "1", "--cancel-after", "tokens:4"), "--cancel-share: Input"),
    Case(
        "cancel-after-unit", locust("--cancel-share", "0.1", "--cancel-after", "4"), "--cancel-after '4': give tokens"
    ),
    # the replicas (llmload.replicas)
    Case("host-twice", locust("--host", "http://127.0.0.1:9"), "--host given more than once: give the replicas in one"),
    Case("hosts-file-missing", locust(host="@{dir}/no-hosts.txt"), "--host @{dir}/no-hosts.txt: No such file"),
    Case(
        "hosts-file-bad-line",
        locust(host="@{dir}/hosts.txt"),
        "--host @{dir}/hosts.txt line 3: replica-b:8000 is not a URL: give http://HOST:PORT",
    ),
    Case("replica-twice", locust(host="http://127.0.0.1:9,http://127.0.0.1:9/"), "--host: each replica once"),
    Case(  # each replica is checked before any request
        "second-replica-unreachable",
        locust(host="http://127.0.0.1:{busy},http://127.0.0.1:{closed}"),
        "nothing answers at http://127.0.0.1:{closed}: connection refused",
    ),
    # the target and the workload
    Case(  # with --model, as the issue found it: the host is still checked before any request
        "unreachable-host", locust("--model", "m"), "nothing answers at http://127.0.0.1:{closed}: connection refused"
    ),
    Case(
        "host-not-a-url",
        locust(host="localhost:{closed}"),
        "--host localhost:{closed} is not a URL: give http://HOST:PORT",
    ),
    Case(
        "log-as-workload",
        locust(workload=str(LOGS / "openai.jsonl")),
        f"{LOGS / 'openai.jsonl'}: this is an OpenAI JSONL log, not a workload: `llmload workload build",
    ),
    Case(
        "workload-typo",
        locust(workload="{dir}/typo.yaml"),
        "{dir}/typo.yaml:21: history_turn: unknown key; did you mean history_turns?",
    ),
    Case(
        "unbounded-turn",
        locust(workload="{dir}/unbounded.yaml"),
        "unbounded.sessions.jsonl:1: turns.0: a turn needs output_tokens or max_tokens",
    ),
    # the soak passes its flags to the same checks: 2 is bad input, never FAIL
    Case(
        "soak-burstiness",
        llmload("soak", "--burstiness", "0", "--host", "http://127.0.0.1:{closed}", "--reports-dir", "{dir}/reports"),
        "--burstiness: Input should be greater than 0",
    ),
    Case("soak-duration", llmload("soak", "--duration", "0"), "argument --duration: not a duration: '0'"),
    Case("demo-duration", llmload("demo", "--duration", "0"), "argument --duration: not a duration: '0'"),
    # the embedded target
    Case(
        "sim-port-in-use",
        llmload("sim", "--port", "{busy}"),
        "cannot listen on 127.0.0.1:{busy} (--host, --port): address already in use",
    ),
    Case("sim-ttft", llmload("sim", "--ttft-ms", "-1"), "--ttft-ms: Input should be greater than or equal to 0"),
    # request logs
    Case("build-empty", build("{dir}/empty.jsonl"), "empty.jsonl: empty"),
    Case(
        "build-tokenizer-config-broken",
        build(str(LOGS / "openai.jsonl"), "--tokenizer", "hf:{dir}/tokenizer"),
        "{dir}/tokenizer/tokenizer_config.json: not valid JSON",
    ),
    Case(
        "build-empty-azure",
        build("{dir}/empty.jsonl", "--format", "azure-trace"),
        "empty.jsonl: empty",
    ),
    Case(
        "build-missing-column",
        build("{dir}/no-generated.csv"),
        "no-generated.csv:1: no column GeneratedTokens (it has TIMESTAMP, ContextTokens)",
    ),
    Case(
        "build-bad-value",
        build("{dir}/bad-value.csv"),
        "bad-value.csv:7: GeneratedTokens 'abc' is not a whole number",
    ),
    Case(
        "build-short-row",
        build("{dir}/short-row.csv"),
        "short-row.csv:3: 2 column(s), not 3",
    ),
    Case(
        "build-no-replies",
        build("{dir}/asked.json"),
        "3 of 3 requests in {dir}/asked.json have no output length",
    ),
    Case(
        "build-output-tokens",
        build("{dir}/asked.json", "--output-tokens", "bogus:1"),
        "--output-tokens 'bogus:1': unknown distribution 'bogus'",
    ),
    Case(
        "build-session-gap",
        build(str(LOGS / "openai.jsonl"), "--session-gap", "0"),
        "argument --session-gap: must be positive, not 0",
    ),
    Case(
        "build-unwritable",
        build(str(LOGS / "openai.jsonl"), output="{dir}/notes.txt/w.yaml"),
        "{dir}/notes.txt/w.yaml: cannot write: ",
    ),
    Case(
        "synth-unwritable",
        llmload("workload", "synth", "-o", "{dir}/notes.txt/s.yaml", "--sessions", "2"),
        "{dir}/notes.txt/s.yaml: cannot write: ",
    ),
    Case(
        "build-seed",
        build("{dir}/asked.json", "--output-tokens", "9", "--seed", "-1"),
        "--seed: Input should be greater than or equal to 0",
    ),
    Case(
        "synth-seed",
        llmload("workload", "synth", "-o", "{dir}/s.yaml", "--seed", "-1"),
        "--seed: Input should be greater than or equal to 0",
    ),
    Case(
        "build-no-file",
        build("{dir}/missing.jsonl"),
        "missing.jsonl: no such file",
    ),
    Case(
        "build-unknown-format",
        build("{dir}/notes.txt"),
        "notes.txt: cannot tell the log format; use --format",
    ),
    Case(
        "build-broken-json",
        build("{dir}/broken.jsonl"),
        "broken.jsonl:1: first line is not a JSON object; use --format",
    ),
    # workload files
    Case("stats-empty", llmload("workload", "stats", "{dir}/empty.jsonl"), "empty.jsonl: empty"),
    Case(
        "stats-typo",
        llmload("workload", "stats", "{dir}/typo.yaml"),
        "typo.yaml:21: history_turn: unknown key; did you mean history_turns?",
    ),
    Case(
        "stats-nested-typo",
        llmload("workload", "stats", "{dir}/nested-typo.yaml"),
        "nested-typo.yaml:3: source.format: Field required; source.formt: unknown key; did you mean source.format?",
    ),
    Case("stats-empty-yaml", llmload("workload", "stats", "{dir}/empty.yaml"), "empty.yaml: empty"),
    Case(
        "stats-not-yaml",
        llmload("workload", "stats", "{dir}/broken.yaml"),
        "broken.yaml:3:9: not valid YAML: while parsing a flow sequence: expected ',' or ']', but got ':'",
    ),
    Case(
        "synth-target-qps",
        llmload("workload", "synth", "-o", "{dir}/s.yaml", "--target-qps", "-1"),
        "--target-qps: Input should be greater than 0",
    ),
    Case(
        "stats-max-tokens",
        llmload("workload", "stats", str(WORKLOAD), "--max-tokens", "0"),
        "argument --max-tokens: must be positive, not 0",
    ),
    Case(
        "synth-distribution",
        llmload("workload", "synth", "-o", "{dir}/s.yaml", "--output-tokens", "normal:mean=300,sd=-1"),
        "sd: Input should be greater than or equal to 0",
    ),
    Case(
        "synth-like-no-replies",
        llmload("workload", "synth", "--like", "{dir}/asked.json", "-o", "{dir}/s.yaml"),
        "3 of 3 requests in {dir}/asked.json have no known output length",
    ),
    Case(
        "capacity-log-as-workload",
        llmload(
            "capacity",
            "--model-config",
            "llama-3.1-8b",
            "--gpu",
            "h100-80gb",
            "--target-qps",
            "2",
            "--workload",
            str(LOGS / "openai.jsonl"),
        ),
        "this is an OpenAI JSONL log, not a workload",
    ),
    Case(
        "capacity-config-not-an-object",
        llmload("capacity", "--hf-config", "{dir}/list.json", "--gpu", "h100-80gb"),
        "{dir}/list.json: not a JSON object: a list",
    ),
    # run directories
    Case("report-not-a-run", llmload("report", "{dir}"), "is not a run directory (no run.json)"),
    Case("compare-not-a-run", llmload("compare", "{dir}", "{dir}"), "is not a run directory (no run.json)"),
    Case(
        "history-no-runs",
        llmload("history", "{dir}/tokenizer"),
        "no finished run (a directory with run.json and summary.json) under {dir}/tokenizer",
    ),
    Case(
        "compare-history-none-comparable",
        llmload("compare", "--baseline", "history:{dir}/tokenizer", "{dir}/cut"),
        "0 run(s) under {dir}/tokenizer comparable with {dir}/cut",
    ),
    Case(
        "report-cut-off",
        llmload("report", "{dir}/cut"),
        f"warning: {RECORDS_FILE} line 2 is cut off (1 complete record kept)",
        code=0,
    ),
]


def _inputs(directory: Path) -> None:
    """The files the cases read."""
    (directory / "empty.jsonl").write_bytes(b"")
    (directory / "notes.txt").write_text("dear diary\n")
    (directory / "hosts.txt").write_text("# the replicas\nhttp://127.0.0.1:9\nreplica-b:8000\n")
    (directory / "empty.yaml").write_bytes(b"")
    (directory / "broken.yaml").write_text("version: 1\nname: [a\nsessions: x\n")
    (directory / "broken.jsonl").write_text('{"messages": [\n')
    (directory / "list.json").write_text("[1]\n")
    (directory / "tokenizer").mkdir()
    (directory / "tokenizer" / "tokenizer.json").write_bytes((LOGS / "tiny-tokenizer" / "tokenizer.json").read_bytes())
    (directory / "tokenizer" / "tokenizer_config.json").write_text('{"bos_token": "<s>",\n')
    (directory / "no-generated.csv").write_text("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46.6805900,374\n")
    rows = [f"2023-11-16 18:15:4{i}.0000000,374,{44 if i < 5 else 'abc'}" for i in range(6)]
    (directory / "bad-value.csv").write_text("\n".join(["TIMESTAMP,ContextTokens,GeneratedTokens", *rows]) + "\n")
    (directory / "short-row.csv").write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n2023-11-16 18:15:47,879\n"
    )
    asked = [{"id": f"identity_{i}", "conversations": [{"from": "human", "value": f"question {i}"}]} for i in range(3)]
    (directory / "asked.json").write_text(json.dumps(asked))
    typo = WORKLOAD.read_text().replace("chat-multiturn.sessions.jsonl", str(WORKLOAD.with_suffix(".sessions.jsonl")))
    lines = typo.splitlines()
    lines.insert(20, "history_turn: 3")  # line 21
    (directory / "typo.yaml").write_text("\n".join(lines) + "\n")
    (directory / "nested-typo.yaml").write_text(typo.replace("  format: synthetic-chat", "  formt: synthetic-chat"))
    (directory / "unbounded.yaml").write_text("version: 1\nname: unbounded\nsessions: unbounded.sessions.jsonl\n")
    turn = {"messages": [{"role": "user", "content": "write me a novel"}]}
    (directory / "unbounded.sessions.jsonl").write_text(json.dumps({"id": "s0", "turns": [turn]}) + "\n")
    cut = synthetic_run(directory / "cut", 2, failed_every=0, server=False)
    records = (cut / RECORDS_FILE).read_bytes()
    (cut / RECORDS_FILE).write_bytes(records[: records.index(b"\n") + 1 + 40])  # the second record half written


@dataclass(frozen=True)
class Outcomes:
    names: dict[str, str]  # what a case's `argv` and `says` are formatted with
    results: dict[str, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Outcomes]:
    """Every case run once, a few at a time."""
    directory = tmp_path_factory.mktemp("bad-input")
    _inputs(directory)
    with socket.socket() as busy, socket.socket() as closed:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        names = {"dir": str(directory), "busy": str(busy.getsockname()[1]), "closed": str(closed.getsockname()[1])}

        def run(case: Case) -> subprocess.CompletedProcess[str]:
            argv = [part.format(**names) for part in case.argv]
            return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False)

        with ThreadPoolExecutor(PARALLEL) as pool:
            yield Outcomes(names, dict(zip([c.id for c in CASES], pool.map(run, CASES), strict=True)))


def test_the_table_holds_at_least_30_refusals() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    assert sum(c.code == 2 for c in CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_in_one_clear_line(case: Case, outcomes: Outcomes) -> None:
    result = outcomes.results[case.id]
    output = result.stdout + result.stderr
    said = case.says.format(**outcomes.names)
    assert result.returncode == case.code, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert any(said in line for line in output.splitlines()), f"{said!r} not in:\n{output[-3000:]}"
    if case.code == 2 and case.argv[:3] == tuple(llmload_command())[:3] and case.argv[3] != "soak":
        # llmload's own commands say that line only (argparse's refusals come after their usage lines)
        lines = result.stderr.strip().splitlines()
        assert not result.stdout and ("argument --" in said or len(lines) == 1), output
