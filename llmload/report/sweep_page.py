"""sweep.md and sweep.html: the postmortem's table made by the tool, one row per configuration
with vLLM's startup figures, the gate's answer and the figures at it, the prediction beside the
measurement, and which configuration to ship. Both pages print the same columns (COLUMNS)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmload.format import fmt, percent
from llmload.models import SweepResult, SweepRow
from llmload.report.html import ENV, STYLE

MARKDOWN_FILE = "sweep.md"
HTML_FILE = "sweep.html"


def _server(row: SweepRow) -> str:
    if row.server == "started":
        return f"started in {row.startup_s:.0f} s" if row.startup_s is not None else "started"
    return {"did_not_start": "did not start", "interrupted": "interrupted", None: "not tried"}[row.server]


def _passes(row: SweepRow) -> str:
    if row.server != "started":
        return "–"
    if row.passing_qps is None:
        return "none"
    return f"{row.passing_qps:g}" + (f" – {row.failing_qps:g}" if row.failing_qps is not None else "+")


def _ratio(row: SweepRow) -> str:
    ratio = row.prediction_ratio
    return "–" if ratio is None else f"{ratio:.2f}"


def _predicted(row: SweepRow) -> str:
    if row.predicted_reason is not None:
        return "would not start"
    return "–" if row.predicted_qps is None else f"{row.predicted_qps:g}"


COLUMNS: list[tuple[str, Callable[[SweepRow], str]]] = [
    ("server", _server),
    ("KV cache tokens", lambda r: "–" if r.kv_cache_tokens is None else f"{r.kv_cache_tokens:,}"),
    ("max concurrency", lambda r: "–" if r.max_concurrency is None else f"{r.max_concurrency:.2f}x"),
    ("passes at req/s (– fails at)", _passes),
    ("measured at req/s", lambda r: fmt(r.measured_at_qps, 2)),
    ("output tok/s", lambda r: fmt(r.output_tokens_per_s)),
    ("TTFT p50 / p99 ms", lambda r: f"{fmt(r.ttft_p50_ms, 0)} / {fmt(r.ttft_p99_ms, 0)}"),
    ("E2E p50 / p99 ms", lambda r: f"{fmt(r.e2e_p50_ms, 0)} / {fmt(r.e2e_p99_ms, 0)}"),
    ("goodput req/s", lambda r: fmt(r.goodput_qps, 2)),
    ("peak KV usage", lambda r: percent(r.kv_cache_usage_max)),
    ("preemptions", lambda r: fmt(r.preemptions, 0)),
    ("peak GPU memory", lambda r: percent(r.gpu_memory_usage_max)),
    ("predicted req/s", _predicted),
    ("measured / predicted", _ratio),
]


def why(row: SweepRow) -> str:
    """One line per configuration: why it did not start, failed, or where its boundary lies."""
    if row.server == "did_not_start":
        return f"did not start: {row.reason}. Capacity had said: {row.predicted_startup}."
    if row.server != "started":
        return f"{_server(row)}. Capacity had said: {row.predicted_startup}."
    parts = [f"fails at {row.failing_qps:g} req/s: {row.failing_reason}" if row.failing_qps is not None else ""]
    if row.passed is False and row.passing_qps is not None:
        parts.append("below --require-qps")
    if row.predicted_reason is not None:
        parts.append(f"the simulator refused it: {row.predicted_reason}")
    parts += [f"the prediction warns: {warning}" for warning in row.prediction_warnings]
    parts.append(f"capacity had said: {row.predicted_startup}")
    return "; ".join(p for p in parts if p) + "."


def _varied(row: SweepRow) -> str:
    return ", ".join(f"{k}={v}" for k, v in row.varied.items()) or "–"


def _headline(result: SweepResult) -> str:
    if result.best is None:
        return "No configuration passes" + (f" at {result.required_qps:g} req/s." if result.required_qps else ".")
    return f"Ship {result.best}: {result.best_why}."


def _scope(result: SweepResult) -> str:
    gate = (
        "the highest rate that passes the soak verdict"
        if result.mode == "search"
        else f"the 150% soak at {fmt(result.target_qps, 2) if result.target_qps else 'the workload'}'s target"
    )
    what = "the embedded target sized by each configuration (a prediction)" if result.predicted else "the server"
    return f"{len(result.rows)} configuration(s), {what}, judged by {gate}; workload {result.workload}."


def render_markdown(result: SweepResult) -> str:
    headers = ["configuration", "varied", *(name for name, _ in COLUMNS)]
    lines = [
        f"# llmload sweep {result.sweep_id}",
        "",
        f"**{_headline(result)}**",
        "",
        _scope(result),
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    for row in result.rows:
        cells = [row.name, _varied(row), *(cell(row) for _, cell in COLUMNS)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## Why", ""]
    lines += [f"- **{row.name}**: {why(row)}" for row in result.rows]
    lines += ["", "## Reports", ""]
    for row in result.rows:
        links = ", ".join(f"[{Path(r).parent.name}]({r})" for r in row.reports) or "none"
        lines.append(f"- **{row.name}**: {links}")
    if result.interrupted:
        lines += ["", "_Interrupted: `--resume` goes on with the configurations not done._"]
    return "\n".join(lines) + "\n"


TEMPLATE = ENV.from_string("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>llmload sweep {{ r.sweep_id }}</title>
<style>
{{ style | safe }}</style></head><body>
<h1>llmload sweep <code>{{ r.sweep_id }}</code></h1>
<p class="meta">{{ scope }} Served by <code>{{ r.serve }}</code>.</p>
<div class="verdict {{ 'pass' if r.best else 'fail' }}"><strong>{{ headline }}</strong></div>
{% if r.interrupted %}<div class="warn">Interrupted: <code>--resume</code> goes on with the configurations not
done.</div>{% endif %}
<h2>Configurations</h2>
<table><tr><th class="l">configuration</th><th class="l">varied</th>{% for h in headers %}<th>{{ h }}</th>{% endfor
%}<th class="l">why</th><th class="l">reports</th></tr>
{% for row, cells, why in rows %}<tr{% if row.name == r.best %} class="best"{% endif %}><td class="l"><b>{{ row.name
}}</b>{% if row.name == r.best %} (best){% endif %}</td><td class="l">{{ varied(row) }}</td>{% for c in cells
%}<td>{{ c }}</td>{% endfor %}<td class="msg">{{ why }}</td><td class="l">{% for link in row.reports
%}<a href="{{ link }}">{{ loop.index }}</a> {% else %}–{% endfor %}</td></tr>
{% endfor %}</table>
{% if r.rows | selectattr("predicted_qps") | list %}<p class="meta">Measured / predicted: the passing rate found on
the server over the one the simulator found for the same configuration; 1.00 is a perfect prediction.</p>{% endif %}
</body></html>
""")


def write_pages(result: SweepResult, directory: Path) -> None:
    (directory / MARKDOWN_FILE).write_text(render_markdown(result), encoding="utf-8")
    rows = [(row, [cell(row) for _, cell in COLUMNS], why(row)) for row in result.rows]
    page = TEMPLATE.render(
        r=result, rows=rows, headers=[h for h, _ in COLUMNS], headline=_headline(result), scope=_scope(result),
        varied=_varied, style=STYLE,
    )  # fmt: skip
    (directory / HTML_FILE).write_text(page, encoding="utf-8")
