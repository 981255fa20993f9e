"""`llmload sweep` against the embedded target sized by each configuration (`llmload sim
--vllm-config`): the ranking against the simulator's own saturation rates (ground truth computed
from its engine, not from the sweep), a configuration vLLM would refuse as a row with vLLM's
numbers, no server left behind on Ctrl-C, --resume, bad input refused before any server starts, and
the Pareto frontier of every probe (sweep.json's `pareto`, the page's chart, pareto.png)."""

from __future__ import annotations

import json
import random
import signal
import sys
from pathlib import Path

import orjson
import psutil
import pytest
import yaml

from llmload.errors import InputError
from llmload.models import ParetoPoint, SweepResult, SweepRow
from llmload.records import read_records
from llmload.report.pareto import PNG_FILE, dominates, frontier, point, throughput_axis
from llmload.report.sweep_page import render_markdown, write_pages
from llmload.server.serve_config import read_serve_config
from llmload.sim.profiles import PROFILES
from llmload.sweep.configs import expand
from llmload.sweep.run import best_config, simulator_serve
from llmload.sweep.server import read_startup
from tests.browser import CHROMIUM, inspect_page
from tests.locust_runs import (
    calibrated_as,
    fixed_output_workload,
    llmload_cli,
    llmload_command,
    running,
    small_workload,
    tiny_llama_config,
    wait_until,
)

DATA = Path(__file__).parent / "data"
OUTPUT_TOKENS = 64
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# the tiny-llama server of the real-vLLM tests: 1 KiB of KV per token, 128-token CPU blocks
def _config(directory: Path, name: str, *, seqs: int = 8, length: int = 2048, kv: str = "64M") -> Path:
    return tiny_llama_config(directory / f"{name}.yaml", length=length, kv=kv, seqs=seqs)


def _sweep_args(tmp_path: Path, *flags: str) -> tuple[str, ...]:
    return ("sweep", "--reports-dir", str(tmp_path / "reports"), "--sweep-id", "s", *flags)


def _sweep(tmp_path: Path, *flags: str, timeout: float = 600) -> tuple[int, str]:
    proc = llmload_cli(*_sweep_args(tmp_path, *flags), timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def _servers_of(tmp_path: Path) -> list[psutil.Process]:
    """Processes whose command line names a config under tmp_path: the sweep's servers."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(part.startswith(str(tmp_path)) and part.endswith("/config.yaml") for part in cmdline):
            found.append(proc)
    return found


# --------------------------------------------------------------------------- configurations


def test_vary_makes_the_product_over_the_base_and_names_each(tmp_path: Path) -> None:
    base = _config(tmp_path, "base")
    configs = expand(base, ["max_model_len=1024,2048", "max-num-seqs=4,16"], [])
    assert [c.name for c in configs] == [
        "max-model-len-1024_max-num-seqs-4", "max-model-len-1024_max-num-seqs-16",
        "max-model-len-2048_max-num-seqs-4", "max-model-len-2048_max-num-seqs-16",
    ]  # fmt: skip
    first = configs[0]
    assert first.varied == {"max-model-len": 1024, "max-num-seqs": 4}
    # the varied key replaces the base's, however either spells it
    assert first.settings["max-model-len"] == 1024 and "max_model_len" not in first.settings
    assert first.settings["kv-cache-memory-bytes"] == "64M"
    written = first.write(tmp_path / "out")
    assert "max-num-seqs: 4" in written.read_text()


def test_configs_files_name_their_rows_and_what_differs(tmp_path: Path) -> None:
    files = [_config(tmp_path, "small", seqs=1), _config(tmp_path, "large", seqs=4, kv="128M")]
    configs = expand(None, [], files)
    assert [c.name for c in configs] == ["small", "large"]
    assert configs[1].varied == {"kv-cache-memory-bytes": "128M", "max-num-seqs": 4}


def test_speculative_config_is_varied_as_a_yaml_list_and_null_leaves_it_unset(tmp_path: Path) -> None:
    """A speculative-config is a mapping, whose commas --vary's V1,V2 would split: its values come as a
    YAML list, null for vLLM's default (no speculation). The file holds the mapping, the row its JSON text
    (what vLLM's --config hands its parser); --configs files that differ in it validate as rows too."""
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    spec, plain = expand(
        _config(tmp_path, "base"), ["speculative-config=[{method: ngram, num_speculative_tokens: 3}, null]"], []
    )
    assert [spec.name, plain.name] == [
        "speculative-config-method-ngram-num-speculative-tokens-3",
        "speculative-config-unset",
    ]
    assert spec.varied == {"speculative-config": json.dumps(ngram)} and plain.varied == {"speculative-config": None}
    assert spec.settings["speculative-config"] == ngram and "speculative-config" not in plain.settings
    read = read_serve_config(spec.write(tmp_path / "spec"))
    assert read.not_modelled == {"speculative-config": json.dumps(ngram)}
    assert "speculative" not in plain.write(tmp_path / "plain").read_text()
    files = [_config(tmp_path, "plain"), tmp_path / "spec.yaml"]
    files[1].write_text(files[0].read_text() + "speculative-config:\n  method: ngram\n  num_speculative_tokens: 3\n")
    rows = [SweepRow(name=c.name, varied=c.varied) for c in expand(None, [], files)]
    assert [r.varied for r in rows] == [{"speculative-config": None}, {"speculative-config": json.dumps(ngram)}]
    with pytest.raises(InputError, match="not a YAML list"):
        expand(_config(tmp_path, "base"), ["speculative-config=[{method: ngram"], [])


def test_the_sweep_table_shows_speculation_only_where_a_configuration_speculated() -> None:
    plain = SweepRow(name="plain", varied={"speculative-config": None}, server="started", passing_qps=4.0)
    spec = plain.model_copy(update={"name": "ngram", "spec_acceptance_rate": 0.62, "spec_acceptance_length": 2.86})
    header = "drafts accepted / tokens a step"
    result = SweepResult(sweep_id="s", mode="search", serve="vllm serve", workload="w.yaml", started_at=0, rows=[plain])
    assert header not in render_markdown(result)
    table = render_markdown(result.model_copy(update={"rows": [plain, spec]}))
    lines = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| ")}
    assert header in lines["| configuration"] and lines["| ngram"].endswith("| 62% / 2.86 |"), table
    assert lines["| plain"].startswith("| plain | speculative-config=unset |") and lines["| plain"].endswith("| – |")


@pytest.mark.parametrize(
    ("vary", "message"),
    [
        ("max-num-seq=4,8", "did you mean max-num-seqs"),
        ("max-num-seqs", "give KEY=V1,V2"),
        ("max-num-seqs=4,4", "given twice"),
    ],
)
def test_a_bad_vary_is_refused(tmp_path: Path, vary: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        expand(_config(tmp_path, "base"), [vary], [])


def test_bad_input_exits_2_before_any_server_starts(tmp_path: Path) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("model: org/tiny-llama\nmax-num-seqz: 4\n")
    serve = simulator_serve()
    code, output = _sweep(tmp_path, "--serve", serve, "--configs", str(typo), "--max-qps", "4")
    assert code == 2 and f"{typo}:2: max-num-seqz" in output and "did you mean max-num-seqs" in output, output
    code, output = _sweep(tmp_path, "--serve", "vllm serve --config {config}", "--vllm-config", str(typo))
    assert code == 2, output
    base = _config(tmp_path, "base")
    code, output = _sweep(tmp_path, "--serve", "vllm serve", "--vllm-config", str(base), "--max-qps", "4")
    assert code == 2 and "lacks {config} and {port}" in output, output
    code, output = _sweep(tmp_path, "--serve", serve, "--vllm-config", str(base))
    assert code == 2 and "--max-qps" in output, output
    code, output = _sweep(tmp_path, "--serve", serve, "--vllm-config", str(base), "--max-qps", "4", "--first-session=3")
    assert code == 2 and "--first-session is set by the sweep's search for every run it starts" in output, output
    assert not (tmp_path / "reports" / "s" / "base" / "server.log").exists()


# --------------------------------------------------------------------------- startup and the answer


def test_a_refusal_in_the_log_is_the_rows_reason_in_vllms_numbers() -> None:
    log = (DATA / "vllm-logs" / "cpu-1mib-len4096-too-long.log").read_text()
    startup = read_startup(log, started=False, seconds=30.0, fallback="exited with code 1")
    assert startup.reason is not None and "4,096-token request needs" in startup.reason, startup.reason
    assert "the longest that fits is" in startup.reason
    healthy = read_startup((DATA / "vllm-logs" / "cpu-64mib-len2048.log").read_text(), started=True, seconds=40)
    assert (healthy.kv_cache_tokens, healthy.max_concurrency, healthy.concurrency_tokens) == (65_536, 32.0, 2048)
    assert healthy.reason is None
    # a death the explainer does not know: the last exception line, else what the sweep saw
    assert read_startup("boom\nRuntimeError: no GPU\n", started=False, seconds=1).reason == "RuntimeError: no GPU"
    assert read_startup("", started=False, seconds=1, fallback="exited with code 3").reason == "exited with code 3"


def test_a_server_that_dies_at_start_without_an_error_line_gives_its_logs_last_lines() -> None:
    log = "starting\n\n  reading config  \nusage: serve [--port PORT]\nserve: error: unrecognized arguments: --foo\n\n"
    startup = read_startup(log, started=False, seconds=1, fallback="exited with code 2 before /health answered")
    assert startup.reason == (
        "exited with code 2 before /health answered; its log ends: reading config | usage: serve [--port PORT]"
        " | serve: error: unrecognized arguments: --foo"
    )


def test_a_sweep_row_says_what_its_dead_servers_log_said(tmp_path: Path) -> None:
    dies = f"{sys.executable} -c \"import sys; print('bad flag --foo'); sys.exit(2)\" {{config}} {{port}}"
    code, output = _sweep(
        tmp_path, "--serve", dies, "--vllm-config", str(_config(tmp_path, "base")), "--max-qps", "4",
        "--workload", str(small_workload(tmp_path)),
    )  # fmt: skip
    [row] = orjson.loads((tmp_path / "reports" / "s" / "sweep.json").read_bytes())["rows"]
    assert code == 1 and row["server"] == "did_not_start", output[-3000:]
    assert row["reason"] == "exited with code 2 before /health answered; its log ends: bad flag --foo"
    assert "its log ends: bad flag --foo" in output


def test_the_best_passes_the_highest_rate_and_ties_go_to_less_memory() -> None:
    def row(name: str, qps: float | None, gib: float) -> SweepRow:
        return SweepRow(name=name, varied={}, server="started", passing_qps=qps, passed=qps is not None,
                        kv_cache_gib=gib)  # fmt: skip

    rows = [row("a", 4, 1.0), row("b", 6, 2.0), row("c", 6, 0.5), row("d", None, 0.1)]
    best, why = best_config(rows, "search")
    assert best == "c" and why is not None and "tied with b" in why and "0.5 GiB" in why
    best, why = best_config(rows[:2], "search")
    assert best == "b" and why == "passes at 6 req/s, the highest (next: a at 4 req/s)"
    refused = SweepRow(name="e", varied={}, server="did_not_start", passing_qps=None)
    assert best_config([refused, rows[3]], "search") == (None, None)
    # equal figures are never called "less memory"; a search capped at --max-qps says so
    same = [row("f", 6, 1.0), row("g", 6, 1.0)]
    best, why = best_config(same, "search")
    assert best == "f" and why is not None and "less memory" not in why and "nothing measured tells them apart" in why
    capped = [row("h", 32, 1.0).model_copy(update={"outcome": "capped"}), row("i", 8, 1.0)]
    assert best_config(capped, "search") == (
        "h",
        "keeps up with ≥ 32 req/s (the cap, --max-qps), the highest probed (next: i at 8 req/s)",
    )


# --------------------------------------------------------------------------- the Pareto frontier


def _point(name: str, per_gpu: float, per_user: float, *, passed: bool | None = True) -> ParetoPoint:
    return ParetoPoint(configuration=name, qps=1, run=name, output_tokens_per_s_per_gpu=per_gpu, gpu_count=1,
                       tokens_per_s_per_user=per_user, passed=passed)  # fmt: skip


def test_the_frontier_is_the_passing_points_no_other_passing_point_beats_on_both_axes() -> None:
    points = [
        _point("most-in-all", 100, 50),
        _point("its-twin", 100, 50),  # equal to it: neither beats the other, both are on it
        _point("beaten", 60, 70),  # "middle" gives more on both
        _point("fastest-user", 40, 120),
        _point("middle", 70, 80),
        _point("level-in-all", 40, 100),  # as much in all as "fastest-user", less per user
        _point("level-per-user", 90, 50),  # as much per user as "most-in-all", less in all
        # a failing or unjudged probe is never on it, nor pushes a passing one off: its tokens count
        # answers that queued into the drain
        _point("overloaded", 200, 60, passed=False),
        _point("unjudged", 50, 200, passed=None),
    ]
    marked = frontier(points)
    assert [p.configuration for p in marked] == [p.configuration for p in points]  # in their order
    on = [p.configuration for p in marked if p.on_frontier]
    assert on == ["most-in-all", "its-twin", "fastest-user", "middle"]
    assert frontier([]) == [] and [p.on_frontier for p in frontier(points[:1])] == [True]
    assert not any(p.on_frontier for p in frontier(points[-2:]))


def test_every_passing_point_off_the_frontier_is_beaten_by_one_on_it_and_none_on_it_by_another() -> None:
    rng = random.Random(38)
    for _ in range(300):
        # figures from a few values each, so ties on one axis and on both are common
        points = [
            _point(str(k), rng.randint(0, 6), rng.randint(0, 6), passed=rng.choice([True, True, False, None]))
            for k in range(rng.randint(1, 25))
        ]
        marked = frontier(points)
        on = [p for p in marked if p.on_frontier]
        assert all(p.passed for p in on) and bool(on) == any(p.passed for p in points), points
        assert all(any(dominates(f, p) for f in on) for p in marked if p.passed and not p.on_frontier), points
        assert not any(dominates(a, b) for a in on for b in on), points


def test_a_point_is_per_gpu_where_its_run_saw_gpus_and_per_server_where_it_saw_none() -> None:
    two = point(configuration="tp2", qps=4, run="tp2/soak", output_tokens_per_s=900.0, tpot_p50_ms=20.0,
                gpu_count=2, passed=True)  # fmt: skip
    cpu = point(configuration="cpu", qps=4, run="cpu/soak", output_tokens_per_s=300.0, tpot_p50_ms=50.0,
                gpu_count=None, passed=None)  # fmt: skip
    assert two is not None and (two.output_tokens_per_s_per_gpu, two.tokens_per_s_per_user) == (450.0, 50.0)
    assert cpu is not None and (cpu.output_tokens_per_s_per_gpu, cpu.tokens_per_s_per_user) == (300.0, 20.0)
    assert throughput_axis([two]) == "output tok/s per GPU"
    assert throughput_axis([cpu]) == "output tok/s per server (no GPU seen)"
    assert throughput_axis([two, cpu]) == "output tok/s per GPU (per server where no GPU was seen)"
    # no answer succeeded, or none streamed a second token: no figure, no point
    no_tpot = point(configuration="x", qps=4, run="x", output_tokens_per_s=0.0, tpot_p50_ms=None, gpu_count=None,
                    passed=False)  # fmt: skip
    assert no_tpot is None


@pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} not installed (apt-get install -y chromium)")
def test_the_sweep_page_fits_its_page_and_reads_its_reasons_as_sentences(tmp_path: Path) -> None:
    """Six configurations with long verdict lines, as a real sweep writes them: in headless Chromium
    at 1280 px the table fits the page (no sideways scroll), no row is taller than two lines, and the
    reasons follow as sentences; the verdict line names the cap as a lower bound. The Pareto chart of
    their probes loads (the page's policy lets in data: images only), its frontier's table fits too,
    and pareto.png is beside the page."""
    reason = (
        "keeping up: in flight grew from 1.59 to 6.3 during the hold (mean of its first and last 1.66667 s windows);"
        " 100 requests completed in it against 106 sent (10.00 vs 10.60 req/s); trend +5.65 requests in flight over"
        " the 10 s hold (and 3 more check(s))"
    )
    rows = [
        SweepRow(name=f"max-num-seqs-{seqs}-max-model-len-{length}", varied={"max-num-seqs": seqs,
                 "max-model-len": length}, server="started", startup_s=33, kv_cache_tokens=65_536,
                 max_concurrency=32.0, outcome="capped" if seqs == 16 else "found", passing_qps=4.0 * seqs,
                 failing_qps=None if seqs == 16 else 4.5 * seqs, failing_reason=None if seqs == 16 else reason,
                 passed=True, measured_at_qps=4.0 * seqs, output_tokens_per_s=1234.5, ttft_p50_ms=25,
                 ttft_p99_ms=1400, e2e_p50_ms=310, e2e_p99_ms=2900, kv_cache_usage_max=0.93, preemptions=12,
                 predicted_qps=4.2 * seqs, predicted_passed=True,
                 reports=[f"c{seqs}/search/probe-0{k}-4qps/report.html" for k in range(1, 9)])
        for seqs in (1, 2, 4, 8, 16) for length in (2048,)
    ]  # fmt: skip
    rows.append(SweepRow(name="too-long", varied={"max-model-len": 8192}, server="did_not_start", reason=(
        "one 8,192-token request needs 5.62 GiB of KV per GPU, more than the 4.5 GiB available; the longest that"
        " fits is 3,968 tokens"), predicted_startup="refuses to start: To serve at least one request ..."))  # fmt: skip
    result = SweepResult(sweep_id="s", mode="search", serve="vllm serve --config {config} --port {port}",
                         workload="workloads/chat-multiturn.yaml", started_at=0, rows=rows)  # fmt: skip
    result.best, result.best_why = best_config(rows, "search")
    # each configuration's probes: tokens in all grow with the rate up to its saturation, each user's slow down
    probes = [
        point(configuration=row.name, qps=qps, run=f"{row.name}/search/probe-01-{qps:g}qps",
              output_tokens_per_s=64.0 * min(qps, row.failing_qps or qps), tpot_p50_ms=4.0 + qps / 2,
              gpu_count=None, passed=qps <= (row.passing_qps or 0))
        for row in rows[:-1] for qps in (2.0, 8.0, 24.0, 64.0)
    ]  # fmt: skip
    result.pareto = frontier([p for p in probes if p is not None])
    write_pages(result, tmp_path)
    page = inspect_page(tmp_path / "sweep.html", screenshot=tmp_path / "sweep.png")
    assert page.errors == [], page.errors
    assert page.page_width <= page.viewport_width, (page.page_width, page.viewport_width)
    table, frontier_table = page.tables
    assert table["right"] <= page.viewport_width and frontier_table["right"] <= page.viewport_width
    (chart,) = [image for image in page.images if image["alt"] == "Pareto frontier"]
    assert chart["complete"] and chart["width"] > 0 and chart["shown"] > 0, chart
    assert len(frontier_table["row_heights"]) == 1 + sum(p.on_frontier for p in result.pareto)
    assert "output tok/s per server (no GPU seen)" in page.text and f"The chart alone: {PNG_FILE}." in page.text
    png = tmp_path / PNG_FILE
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 10_000
    assert max(table["row_heights"]) < 3 * min(table["row_heights"][1:]) and max(table["row_heights"]) < 90, table
    assert "Ship max-num-seqs-16-max-model-len-2048: keeps up with ≥ 64 req/s (the cap, --max-qps)" in page.text
    assert "≥ 64 (the cap)" in page.text and "passes at 64 req/s" not in page.text.lower()
    assert "give --slo-ttft-p99-ms / --slo-e2e-p99-ms" in page.text
    assert f"Passes at 16 req/s (measured at 16 req/s); fails at 18 req/s: {reason}" in page.text
    assert "Did not start: one 8,192-token request needs" in page.text


def test_a_predicted_sweep_ranks_configurations_as_the_engine_saturates(tmp_path: Path) -> None:
    """--predict-only: no server, the embedded target sized by each file. Each configuration's
    passing rate lies near the simulator's saturation rate for its max-num-seqs (computed from its
    step timing), so the ranking is the engine's; the file vLLM would refuse is a row with vLLM's numbers.
    The profile is the built-in one as if calibrated up to 4,000 KV tokens a step: four 2,048-token
    sequences reach past that, and that row says its prediction is extrapolated. Every probe is a point
    of the Pareto frontier with its run's own figures, and pareto.png is beside the pages. At --resolution
    0.5 each search stops after one bisection (5, 10, 7.5 req/s for one sequence, about 5 its saturation;
    5, 10, 20, 15 for four, about 17): at 0.3 they also probed 6.25 and 17.5 req/s, 24% and 3% over
    their saturation, where a 6 s hold is too short to tell and the probe is held again, longer."""
    workload = fixed_output_workload(tmp_path, OUTPUT_TOKENS)
    profile = tmp_path / "calibrated.yaml"
    calibrated = calibrated_as(PROFILES["vllm-cpu-tiny"], [(2, 1936, 64)])
    profile.write_text(yaml.safe_dump(calibrated.model_dump(mode="json")))
    files = [
        _config(tmp_path, "one-seq", seqs=1),
        _config(tmp_path, "four-seqs", seqs=4),
        _config(tmp_path, "too-long", length=8192, kv="4M"),
    ]
    code, output = _sweep(
        tmp_path, "--predict-only", "--profile", str(profile), "--configs", *map(str, files),
        "--workload", str(workload), "--start-qps", "5", "--max-qps", "20", "--resolution", "0.5", "--repeats", "1",
        "--probe-duration", "6s", "--probe-warmup", "2s", "--arrival", "constant", "--metrics-interval", "0.5",
        "--require-qps", "10",
    )  # fmt: skip
    assert code == 0, output[-4000:]
    where = tmp_path / "reports" / "s" / "predicted"
    result = orjson.loads((where / "sweep.json").read_bytes())
    rows = {row["name"]: row for row in result["rows"]}
    assert result["predicted"] is True and list(rows) == ["one-seq", "four-seqs", "too-long"]
    timing = PROFILES["vllm-cpu-tiny"].timing
    for name, seqs in (("one-seq", 1), ("four-seqs", 4)):
        row = rows[name]
        probe = where / name / "search" / "probe-01-5qps"
        prompt = float(read_records(probe / "requests.jsonl").prompt_tokens.mean())
        truth = timing.saturation_qps(seqs, prompt, OUTPUT_TOKENS)
        assert row["server"] == "started" and row["kv_cache_tokens"] == 65_536, row
        assert 0.7 * truth <= row["passing_qps"] <= 1.15 * truth, (name, row["passing_qps"], truth, output[-3000:])
        assert row["failing_qps"] > row["passing_qps"] and row["output_tokens_per_s"] > 0
        for link in row["reports"]:
            assert (where / link).is_file(), link
    assert rows["one-seq"]["passed"] is False  # below --require-qps 10
    assert rows["one-seq"]["prediction_warnings"] == []  # one 2,048-token sequence: within the 4,000 measured
    (extrapolated,) = rows["four-seqs"]["prediction_warnings"]
    assert "holding up to 4,000 KV tokens; this configuration's steps can hold 8,192 (2.0x)" in extrapolated
    assert result["best"] == "four-seqs" and "passes at" in result["best_why"]
    refused = rows["too-long"]
    assert refused["server"] == "did_not_start" and refused["passing_qps"] is None
    assert "8,192-token request needs" in refused["reason"] and "the longest that fits is" in refused["reason"]
    assert refused["predicted_startup"].startswith("refuses to start: To serve at least one request")
    page, table = (where / "sweep.html").read_text(), (where / "sweep.md").read_text()
    assert "Ship four-seqs" in table and "did not start" in table and "8,192-token request needs" in page
    assert f"the prediction warns: {extrapolated}" in table
    # the Pareto frontier: one point per probe of each configuration that started, each with its hold's
    # figures as its run's summary.json gives them (no GPU on the simulator: tok/s per server)
    points = result["pareto"]
    for name in ("one-seq", "four-seqs"):
        probes = orjson.loads((where / name / "search" / "search.json").read_bytes())["probes"]
        mine = [p for p in points if p["configuration"] == name]
        assert [(p["run"], p["qps"], p["passed"]) for p in mine] == [
            (f"{name}/search/{probe['run_id']}", probe["qps"], probe["passed"]) for probe in probes
        ], (mine, probes)
        for p in mine:
            summary = orjson.loads((where / p["run"] / "summary.json").read_bytes())
            hold, gpus = summary["stages"][-1], (summary.get("cost") or {}).get("gpu_count")
            assert p["gpu_count"] == gpus, p
            assert p["output_tokens_per_s_per_gpu"] == hold["output_tokens_per_s"] / (gpus or 1), (p, hold)
            assert p["tokens_per_s_per_user"] == pytest.approx(1000 / hold["tpot_p50_ms"]), (p, hold)
    assert {p["configuration"] for p in points} == {"one-seq", "four-seqs"}  # none for the refused file
    assert any(p["on_frontier"] for p in points)
    png = where / "pareto.png"
    assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 0
    assert "## Pareto frontier" in table and "output tok/s per server (no GPU seen)" in table
    assert 'alt="Pareto frontier"' in page and 'href="pareto.png"' in page
    assert not (tmp_path / "reports" / "s" / "sweep.json").exists()  # no server was swept
    assert not _servers_of(tmp_path)


def test_soak_mode_passes_the_configuration_that_holds_150_percent(tmp_path: Path) -> None:
    """Target 8 req/s, so 12 at 150%: one running sequence saturates near 5 req/s, four near 17."""
    code, output = _sweep(
        tmp_path, "--serve", simulator_serve("--profile", "vllm-cpu-tiny"),
        "--vllm-config", str(_config(tmp_path, "base")),
        "--vary", "max-num-seqs=1,4", "--mode", "soak", "--target-qps", "8", "--ramp-stage-duration", "2s",
        "--soak-duration", "6s", "--workload", str(fixed_output_workload(tmp_path, OUTPUT_TOKENS)),
        "--arrival", "constant", "--slo-ttft-p99-ms", "1000",
    )  # fmt: skip
    assert code == 0, output[-3000:]
    result = orjson.loads((tmp_path / "reports" / "s" / "sweep.json").read_bytes())
    one, four = result["rows"]
    assert one["passed"] is False and any("p99 TTFT SLO" in r for r in one["verdict_reasons"]), one
    assert four["passed"] is True and four["passing_qps"] == 8 and four["measured_at_qps"] == 8
    assert result["best"] == "max-num-seqs-4" and result["best_why"].startswith("passes the soak at the target")
    assert (tmp_path / "reports" / "s" / four["reports"][0]).is_file()
    # one Pareto point per configuration: its soak at the target's rate (the 100% stage), judged by the soak
    points = {p["configuration"]: p for p in result["pareto"]}
    assert list(points) == ["max-num-seqs-1", "max-num-seqs-4"]
    for row in (one, four):
        summary = orjson.loads((tmp_path / "reports" / "s" / row["name"] / "soak" / "summary.json").read_bytes())
        (target,) = [stage for stage in summary["stages"] if stage["name"] == "100%"]
        mine = points[row["name"]]
        assert (mine["run"], mine["qps"], mine["passed"]) == (f"{row['name']}/soak", 8, row["passed"])
        assert mine["tokens_per_s_per_user"] == pytest.approx(1000 / target["tpot_p50_ms"])
    assert (tmp_path / "reports" / "s" / "pareto.png").is_file()


def test_ctrl_c_leaves_no_server_and_resume_finishes_the_rest(tmp_path: Path) -> None:
    base = _config(tmp_path, "base")
    flags = (
        "--serve", simulator_serve("--profile", "vllm-cpu-tiny", "--ttft-ms", "10", "--itl-ms", "2"),
        "--vllm-config", str(base),
        "--vary", "max-num-seqs=2,4", "--workload", str(small_workload(tmp_path)), "--start-qps", "2",
        "--max-qps", "2", "--repeats", "1", "--probe-warmup", "0", "--probe-duration", "8s",
    )  # fmt: skip
    sweep = tmp_path / "reports" / "s"
    second = sweep / "max-num-seqs-4" / "search" / "probe-01-2qps" / "requests.jsonl"
    with running(llmload_command(*_sweep_args(tmp_path, *flags))) as proc:
        wait_until(second.exists, 180, "the second configuration's probe never started")
        servers = _servers_of(tmp_path)
        assert len(servers) == 1  # the first configuration's server was stopped when its search ended
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "interrupted" in output, output[-3000:]
    assert not any(s.is_running() and s.status() != psutil.STATUS_ZOMBIE for s in servers)
    assert not _servers_of(tmp_path)
    result = orjson.loads((sweep / "sweep.json").read_bytes())
    assert result["interrupted"] is True and [r["name"] for r in result["rows"]] == ["max-num-seqs-2"]
    assert result["pareto"] and {p["configuration"] for p in result["pareto"]} == {"max-num-seqs-2"}
    done = (sweep / "max-num-seqs-2" / "row.json").stat().st_mtime_ns
    # the same 8 s probes: a 4 s one at 2 req/s holds 8 requests, too few to judge keeping up, and
    # was held again for 32 s
    code, output = _sweep(tmp_path, *flags, "--resume")
    assert code == 0, output[-3000:]
    assert "max-num-seqs-2: starting" not in output and "max-num-seqs-4: starting" in output
    assert (sweep / "max-num-seqs-2" / "row.json").stat().st_mtime_ns == done
    result = orjson.loads((sweep / "sweep.json").read_bytes())
    assert [r["passing_qps"] for r in result["rows"]] == [2, 2] and result["interrupted"] is False
    assert list((sweep / "max-num-seqs-4").glob("search-interrupted-*"))  # the cut attempt is kept aside
    # the Pareto points of the configuration done before the Ctrl-C are read back from its search, and
    # none come from the cut attempt
    runs = {p["run"].rsplit("/", 1)[0] for p in result["pareto"]}
    assert runs == {"max-num-seqs-2/search", "max-num-seqs-4/search"}, result["pareto"]
    assert not _servers_of(tmp_path)
