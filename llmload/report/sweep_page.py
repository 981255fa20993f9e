"""sweep.md and sweep.html: the postmortem's table made by the tool, one row per configuration
with vLLM's startup figures, the gate's answer and the figures at it, the prediction beside the
measurement, and which configuration to ship. Both pages print the same columns (`columns`); the
reasons follow the table as sentences, one per configuration, so no cell has to hold a paragraph.
Then the Pareto frontier of every probe (llmload.report.pareto, drawn by pareto_chart): the chart, its
points, and pareto.png beside the pages for where HTML cannot go."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from llmload.format import fmt, percent
from llmload.models import ParetoPoint, SweepResult, SweepRow
from llmload.report import pareto, pareto_chart
from llmload.report.html import ENV, STYLE, page_start

MARKDOWN_FILE = "sweep.md"
HTML_FILE = "sweep.html"
NO_SLO_ADVICE = (
    "No latency SLO was given, so each answer is the highest rate the configuration keeps up with, however slow"
    " (its TTFT and E2E at that rate are beside it): give --slo-ttft-p99-ms / --slo-e2e-p99-ms for the highest"
    " rate users can live with."
)
NO_FRONTIER = "No point passed, so none is on the frontier."


def _server(row: SweepRow) -> str:
    if row.server == "started":
        return f"started in {row.startup_s:.0f} s" if row.startup_s is not None else "started"
    return {"did_not_start": "did not start", "interrupted": "interrupted", None: "not tried"}[row.server]


def _passes(row: SweepRow) -> str:
    """The interval: `9.5 – 10.5` (passes – fails), `≥ 32 (the cap)` or `none`."""
    if row.server != "started":
        return "–"
    if row.passing_qps is None:
        return "none" + (f" (fails at {row.failing_qps:g})" if row.failing_qps is not None else "")
    if row.outcome == "capped":
        return f"≥ {row.passing_qps:g} (the cap)"
    return f"{row.passing_qps:g}" + (f" – {row.failing_qps:g}" if row.failing_qps is not None else "")


def _kv(row: SweepRow) -> str:
    if row.kv_cache_tokens is None:
        return "–"
    concurrency = f", {row.max_concurrency:.2f}x" if row.max_concurrency is not None else ""
    return f"{row.kv_cache_tokens:,}{concurrency}"


def _peaks(row: SweepRow) -> str:
    return f"{percent(row.kv_cache_usage_max)} / {fmt(row.preemptions, 0)}"


def _predicted(row: SweepRow) -> str:
    if row.predicted_reason is not None:
        return "would not start"
    if row.predicted_qps is None:
        return "–"
    ratio = row.prediction_ratio
    return f"{row.predicted_qps:g}" + (f" ({ratio:.2f})" if ratio is not None else "")


COLUMNS: list[tuple[str, Callable[[SweepRow], str]]] = [
    ("server", _server),
    ("KV cache tokens, concurrency", _kv),
    ("passes – fails at, req/s", _passes),
    ("TTFT p50 / p99 ms", lambda r: f"{fmt(r.ttft_p50_ms, 0)} / {fmt(r.ttft_p99_ms, 0)}"),
    ("E2E p50 / p99 ms", lambda r: f"{fmt(r.e2e_p50_ms, 0)} / {fmt(r.e2e_p99_ms, 0)}"),
    ("output tok/s", lambda r: fmt(r.output_tokens_per_s)),
    ("goodput req/s", lambda r: fmt(r.goodput_qps, 2)),
    ("peak KV usage / preemptions", _peaks),
    ("peak GPU memory", lambda r: percent(r.gpu_memory_usage_max)),
    ("predicted req/s (measured / predicted)", _predicted),
]
SPECULATION = (
    "drafts accepted / tokens a step",
    lambda r: (
        f"{percent(r.spec_acceptance_rate)} / {fmt(r.spec_acceptance_length, 2)}"
        if r.spec_acceptance_length is not None
        else "–"
    ),
)


def columns(result: SweepResult) -> list[tuple[str, Callable[[SweepRow], str]]]:
    """The table's columns: speculation's only where a configuration speculated."""
    return COLUMNS + ([SPECULATION] if any(r.spec_acceptance_length is not None for r in result.rows) else [])


def why(row: SweepRow) -> str:
    """One sentence per configuration: why it did not start, failed, or where its boundary lies."""
    if row.server == "did_not_start":
        return f"Did not start: {row.reason}." + _capacity(row)
    if row.server != "started":
        return f"{_server(row).capitalize()}." + _capacity(row)
    parts = []
    if row.passing_qps is not None:
        at = f" (measured at {row.measured_at_qps:g} req/s)" if row.measured_at_qps is not None else ""
        parts.append(f"Passes at {row.answer}{at}")
    if row.failing_qps is not None:
        parts.append(f"fails at {row.failing_qps:g} req/s: {row.failing_reason}")
    if row.passed is False and row.passing_qps is not None:
        parts.append("below --require-qps")
    if row.predicted_reason is not None:
        parts.append(f"the simulator refused it: {row.predicted_reason}")
    parts += [f"the prediction warns: {warning}" for warning in row.prediction_warnings]
    text = "; ".join(parts) + "."
    return text[0].upper() + text[1:] + (f" {row.cache_note}" if row.cache_note else "") + _capacity(row)


def _capacity(row: SweepRow) -> str:
    return f" Capacity had said: {row.predicted_startup}." if row.predicted_startup else ""


def _varied(row: SweepRow) -> str:
    return ", ".join(f"{k}={'unset' if v is None else v}" for k, v in row.varied.items()) or "–"


def _named_by_varied(row: SweepRow) -> bool:
    """The name is the varied settings themselves (`--vary`'s names): the page need not say them twice."""
    return row.name == "-".join(f"{k}-{v}" for k, v in row.varied.items())


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


def advice(result: SweepResult) -> str | None:
    return NO_SLO_ADVICE if result.mode == "search" and not result.latency_slo else None


def _pareto_note(result: SweepResult) -> str:
    held = "probe of its search" if result.mode == "search" else "soak, at its 100% stage"
    return (
        f"Each point is one configuration at one rate (a {held}): the output tokens a second of its successful"
        " requests over the GPUs its run saw, against the tokens a second one user sees (1000 / TPOT p50). A"
        " point is on the frontier when it passed and no other that passed gives as much on both and more on one."
        " A failing point is drawn hollow and is never on it: its tokens count answers that queued into the drain,"
        f" not a rate its server kept up with. {len(result.pareto)} point(s)."
    )


def _frontier(result: SweepResult) -> tuple[list[str], list[tuple[ParetoPoint, list[str]]]]:
    """The frontier's points as table rows, the most tokens a second in all first: headers and cells."""
    headers = ["configuration @ rate", pareto.throughput_axis(result.pareto), "tok/s per user", "verdict"]
    best = sorted((p for p in result.pareto if p.on_frontier), key=lambda p: p.tokens_per_s_per_user)
    cells = [[p.label, fmt(p.output_tokens_per_s_per_gpu), fmt(p.tokens_per_s_per_user), pareto.verdict_word(p)]
             for p in best]  # fmt: skip
    return headers, list(zip(best, cells, strict=True))


def _pareto_markdown(result: SweepResult) -> list[str]:
    headers, frontier = _frontier(result)
    png = pareto.PNG_FILE
    lines = ["", "## Pareto frontier", "", f"{_pareto_note(result)} The chart alone: [{png}]({png}).", ""]
    if not frontier:
        return [*lines, NO_FRONTIER]
    lines += ["| " + " | ".join([*headers, "report"]) + " |", "|" + "---|" * (len(headers) + 1)]
    for p, cells in frontier:
        linked = [*cells, f"[report]({p.run}/report.html)"]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in linked) + " |")
    return lines


def render_markdown(result: SweepResult) -> str:
    shown = columns(result)
    headers = ["configuration", "varied", *(name for name, _ in shown)]
    lines = [f"# llmload sweep {result.sweep_id}", "", f"**{_headline(result)}**", "", _scope(result), ""]
    note = advice(result)
    if note:
        lines += [note, ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for row in result.rows:
        cells = [row.name, _varied(row), *(cell(row) for _, cell in shown)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    lines += ["", "## Why", ""]
    lines += [f"- **{row.name}**: {why(row)}" for row in result.rows]
    if result.pareto:
        lines += _pareto_markdown(result)
    lines += ["", "## Reports", ""]
    for row in result.rows:
        links = ", ".join(f"[{Path(r).parent.name}]({r})" for r in row.reports) or "none"
        lines.append(f"- **{row.name}**: {links}")
    if result.interrupted:
        lines += ["", "_Interrupted: `--resume` goes on with the configurations not done._"]
    return "\n".join(lines) + "\n"


SWEEP_STYLE = """table.sweep { width: 100%; font-size: .9em; }
table.sweep th { font-size: .85em; vertical-align: bottom; }
table.sweep th, table.sweep td { padding: .25em .45em; } table.sweep td { white-space: nowrap; }
table.sweep td.name { white-space: normal; min-width: 12em; overflow-wrap: anywhere; }
table.sweep td.reports { white-space: normal; max-width: 7em; }
table.sweep .varied { display: block; color: #555; font-size: .85em; }
tr.best td { background: #f1faf3; } ul.why li { margin: .35em 0; }
"""
TEMPLATE = ENV.from_string("""{{ start }}
<p class="meta">{{ scope }} Served by <code>{{ r.serve }}</code>.</p>
<div class="verdict {{ 'pass' if r.best else 'fail' }}"><strong>{{ headline }}</strong>{% if advice
%}<p>{{ advice }}</p>{% endif %}</div>
{% if r.interrupted %}<div class="warn">Interrupted: <code>--resume</code> goes on with the configurations not
done.</div>{% endif %}
<h2>Configurations</h2>
<table class="sweep"><tr><th class="l">configuration</th>{% for h in headers %}<th>{{ h }}</th>{% endfor
%}<th class="l">reports</th></tr>
{% for row, cells, why in rows %}<tr{% if row.name == r.best %} class="best"{% endif %}><td class="l name"><b>{{
row.name }}</b>{% if row.name == r.best %} (best){% endif %}{% if not named_by_varied(row) %}<span class="varied">{{
varied(row) }}</span>{% endif %}</td>{% for c
in cells %}<td>{{ c }}</td>{% endfor %}<td class="l reports">{% for link in row.reports
%}<a href="{{ link }}">{{ loop.index }}</a> {% else %}–{% endfor %}</td></tr>
{% endfor %}</table>
{% if r.rows | selectattr("predicted_qps") | list %}<p class="meta">Measured / predicted: the passing rate found on
the server over the one the simulator found for the same configuration; 1.00 is a perfect prediction.</p>{% endif %}
<h2>Why</h2>
<ul class="why">{% for row, cells, why in rows %}<li><b>{{ row.name }}</b>: {{ why }}</li>{% endfor %}</ul>
{% if chart %}<h2>Pareto frontier</h2>
<figure><img src="{{ chart }}" alt="Pareto frontier"></figure>
<p class="meta">{{ pareto_note }} The chart alone: <a href="{{ png }}">{{ png }}</a>.</p>
{% if frontier %}<table><tr>{% for h in pareto_headers %}<th{% if loop.first %} class="l"{% endif %}>{{ h }}</th>{%
endfor %}<th class="l">report</th></tr>
{% for p, cells in frontier %}<tr>{% for c in cells %}<td{% if loop.first %} class="l"{% endif %}>{{ c }}</td>{%
endfor %}<td class="l"><a href="{{ p.run }}/report.html">report</a></td></tr>
{% endfor %}</table>{% else %}<p class="note">{{ no_frontier }}</p>{% endif %}{% endif %}
</body></html>
""")


def write_pages(result: SweepResult, directory: Path) -> None:
    """sweep.md, sweep.html and, once a point has its figures, pareto.png."""
    (directory / MARKDOWN_FILE).write_text(render_markdown(result), encoding="utf-8")
    shown = columns(result)
    rows = [(row, [cell(row) for _, cell in shown], why(row)) for row in result.rows]
    pareto_headers, frontier = _frontier(result)
    page = TEMPLATE.render(
        r=result, rows=rows, headers=[h for h, _ in shown], headline=_headline(result), scope=_scope(result),
        advice=advice(result), varied=_varied, named_by_varied=_named_by_varied,
        start=page_start("sweep", result.sweep_id, STYLE + SWEEP_STYLE),
        chart=pareto_chart.chart_uri(result.pareto, result.sweep_id), pareto_note=_pareto_note(result),
        pareto_headers=pareto_headers, frontier=frontier, png=pareto.PNG_FILE, no_frontier=NO_FRONTIER,
    )  # fmt: skip
    (directory / HTML_FILE).write_text(page, encoding="utf-8")
    if result.pareto:
        title = f"llmload sweep {result.sweep_id}: the Pareto frontier"
        pareto_chart.write_png(result.pareto, directory / pareto.PNG_FILE, title)
