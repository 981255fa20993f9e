"""search.html: one self-contained page per search, as report.html is per run: latency and goodput
against the probed rate, the probes' Pareto frontier (llmload.report.pareto), each probe's verdict
with its reason, and a link to each probe's report."""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from llmload.models import SearchResult
from llmload.report import pareto, pareto_chart
from llmload.report.html import ENV, P50, P99, STYLE, drawing, legend, page_start, svg_data_uri

PASS_COLOR, FAIL_COLOR = "#2ca02c", P99


def _chart(result: SearchResult) -> Figure | None:
    probes = [p for p in result.judged() if p.ttft_p99_ms is not None or p.achieved_qps is not None]
    if not probes:
        return None
    fig = Figure(figsize=(10, 5.6))
    latency_ax, rate_ax = fig.subplots(2, 1, sharex=True)
    for name, attribute, color in (("TTFT p50", "ttft_p50_ms", P50), ("TTFT p99", "ttft_p99_ms", P99),
                                   ("E2E p99", "e2e_p99_ms", "0.35")):  # fmt: skip
        points = sorted((p.qps, getattr(p, attribute)) for p in probes if getattr(p, attribute) is not None)
        latency_ax.plot(*zip(*points, strict=True), color=color, marker="o", linewidth=1, label=name)
    latency_ax.set_yscale("log")
    latency_ax.set_ylabel("ms (hold, successful requests)")
    rates = [p.qps for p in probes]
    rate_ax.plot([0, max(rates)], [0, max(rates)], color="0.8", linestyle="--", label="target")
    for name, attribute, marker in (("achieved", "achieved_qps", "o"), ("goodput", "goodput_qps", "s")):
        chosen = [p for p in probes if getattr(p, attribute) is not None]
        if not chosen:
            continue
        colors = [PASS_COLOR if p.passed else FAIL_COLOR for p in chosen]
        rate_ax.scatter([p.qps for p in chosen], [getattr(p, attribute) for p in chosen], c=colors, marker=marker,
                        label=f"{name} (green: pass, red: fail)")  # fmt: skip
    rate_ax.set_ylabel("req/s in the hold")
    rate_ax.set_xlabel("probed rate (req/s)")
    rate_ax.set_ylim(bottom=0)
    for ax in (latency_ax, rate_ax):
        if result.passing_qps is not None and result.failing_qps is not None:
            ax.axvspan(result.passing_qps, result.failing_qps, color="#e6a700", alpha=0.2, linewidth=0)
        for probe in probes:
            ax.axvline(probe.qps, color=PASS_COLOR if probe.passed else FAIL_COLOR, alpha=0.25, linewidth=1)
        legend(ax)
    return fig


TEMPLATE = ENV.from_string("""{{ start }}
<p class="meta">Target {{ r.host }}, workload {{ r.workload }}, rates up to {{ r.max_qps | fmt(2) }} req/s,
{{ r.probe_s | fmt(0) }} s holds, the answer passed {{ r.repeats }} probe(s){% if r.goodput_slo %}, goodput SLO
{{ r.goodput_slo.describe() }}{% endif %}; {{ r.probes | length }} probe(s).{% if r.cache_note %}
{{ r.cache_note }}{% endif %}</p>
<div class="verdict {{ 'pass' if ok else 'fail' }}"><strong>{{ r.answer }}</strong><ul><li>{{ r.conclusion }}</li>
{% if r.latency_note %}<li>{{ r.latency_note }}</li>{% endif %}
{% if r.confirmed is not none %}<li>Confirming soak at the rate found: {{ 'PASS' if r.confirmed else 'FAIL' }}</li>
{% endif %}
{% if r.required_qps is not none %}<li>Required: {{ r.required_qps | fmt(2) }} req/s</li>{% endif %}</ul></div>
{% if r.outcome == "interrupted" %}<div class="warn">Interrupted: this page holds what the search had learned.</div>
{% endif %}
<h2>Latency and goodput against rate</h2>
{% if chart %}<figure><img src="{{ chart }}" alt="latency and goodput against rate"></figure>
<p class="meta">Shaded: the boundary interval, between the highest passing and the lowest failing rate.</p>
{% else %}<p class="note">No probe finished yet.</p>{% endif %}
{% if pareto_chart %}<h2>Pareto frontier</h2>
<figure><img src="{{ pareto_chart }}" alt="Pareto frontier"></figure>
<p class="meta">Each probe's hold: the output tokens a second of its successful requests ({{ pareto_axis }}) against
the tokens a second one user sees (1000 / TPOT p50); hollow: failed or not judged, never on the frontier (its tokens
count answers that queued into the drain). {% if frontier %}On the frontier (it passed, and no other probe that passed
gives as much on both and more on one): {{ frontier | join(", ") }} req/s.{% else %}No probe passed yet, so none is on
the frontier.{% endif %}</p>{% endif %}
<h2>Probes</h2>
<table><tr><th>#</th><th>rate req/s</th><th>hold s</th><th class="l">verdict</th><th>sent</th><th>unfinished</th>
<th>achieved</th><th>goodput</th><th>TTFT p50 / p99 ms</th><th>E2E p50 / p99 ms</th><th class="l">report</th></tr>
{% for p in r.probes %}<tr><td>{{ loop.index }}</td><td>{{ p.qps | fmt(2) }}</td>
<td>{{ (p.hold_s or r.probe_s) | fmt(0) }}</td>
<td class="l">{% if p.passed is none %}not judged{% elif p.passed %}PASS{% elif p.inconclusive or p.too_short
%}INCONCLUSIVE{% else %}<b>FAIL</b>{% endif %}{% if p.confirm %} (confirming soak){% endif %}{% if p.too_short
%} (held longer next){% endif %}</td>
<td>{{ p.sent | fmt(0) }}</td><td>{% if p.unfinished %}<b>{{ p.unfinished }}</b>{% else %}{{ p.unfinished | fmt(0)
}}{% endif %}</td><td>{{ p.achieved_qps | fmt(2) }}</td><td>{{ p.goodput_qps | fmt(2) }}</td>
<td>{{ p.ttft_p50_ms | fmt(0) }} / {{ p.ttft_p99_ms | fmt(0) }}</td><td>{{ p.e2e_p50_ms | fmt(0) }} /
{{ p.e2e_p99_ms | fmt(0) }}</td><td class="l"><a href="{{ p.run_id }}/report.html">{{ p.run_id }}</a></td></tr>
{% endfor %}</table>
<p class="meta">Sent: requests of the hold the server is judged on; unfinished: of those, still running when the
drain after the hold ended (each counts as a failure).</p>
{% if r.probes | selectattr("failed_checks") | list %}<h2>Why probes failed</h2>
<ul>{% for p in r.probes if p.failed_checks %}<li><b>{{ p.run_id }}</b> at {{ p.qps | fmt(2) }} req/s:<ul>{% for line
in p.failed_checks %}<li>{{ line }}</li>{% endfor %}</ul></li>{% endfor %}</ul>{% endif %}
</body></html>
""")


def render_page(result: SearchResult, path: Path) -> None:
    with drawing():
        figure = _chart(result)
        chart = svg_data_uri(figure, result.search_id) if figure is not None else None
    points = pareto.frontier(pareto.search_points(result, None))
    frontier = sorted({p.qps for p in points if p.on_frontier})
    ok = result.passing_qps is not None and result.confirmed is not False
    page = TEMPLATE.render(
        r=result, chart=chart, ok=ok, start=page_start("search", result.search_id, STYLE),
        pareto_chart=pareto_chart.chart_uri(points, result.search_id),
        pareto_axis=pareto.throughput_axis(points), frontier=[f"{qps:g}" for qps in frontier],
    )  # fmt: skip
    path.write_text(page, encoding="utf-8")
