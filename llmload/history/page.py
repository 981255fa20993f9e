"""history.html: one self-contained page per history, in the style of report.html (its head, style and
chart helpers): one chart per figure over the comparable runs with each change point marked and the
segments' means drawn, the trend table, the runs with their labels, each linked to its report.html,
and the runs listed apart with why."""

from __future__ import annotations

import os
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from llmload.history.trend import FigureTrend, History, change_words, figure_text, relative_text
from llmload.report.html import ENV, P50, P99, STYLE, drawing, legend, page_start, svg_data_uri
from llmload.rundir import HTML_FILE

BETTER = "#2ca02c"


def _chart(trend: FigureTrend) -> Figure:
    """The figure over the runs, numbered from 1 as in the table of runs; each change point a line before
    the first run after it (red: worse, green: better), each segment's mean dashed."""
    fig = Figure(figsize=(10, 2.4))
    ax = fig.subplots()
    points = [(i + 1, value) for i, value in enumerate(trend.values) if value is not None]
    ax.plot(*zip(*points, strict=True), color=P50, marker="o", markersize=3, linewidth=1, label=trend.title)
    edges = [points[0][0] - 0.5, *(change.index + 0.5 for change in trend.changes), points[-1][0] + 0.5]
    means = [change.before for change in trend.changes] + [trend.changes[-1].after] if trend.changes else []
    for n, mean in enumerate(means):
        ax.hlines(mean, edges[n], edges[n + 1], color="0.45", linestyle="--", linewidth=1,
                  label="mean between change points" if n == 0 else "_nolegend_")  # fmt: skip
    for change in trend.changes:
        ax.axvline(change.index + 0.5, color=P99 if trend.worse(change) else BETTER, linewidth=1.5,
                   label=f"change at run {change.index + 1}: {100 * change.step:+.1f}%")  # fmt: skip
    ax.set_xlabel("run (oldest first, numbered as in the table of runs)")
    ax.set_ylabel(trend.unit)
    ax.set_xlim(0.5, len(trend.values) + 0.5)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    legend(ax)
    return fig


TEMPLATE = ENV.from_string("""{{ start }}
<p class="meta">{{ h.runs | length }} comparable run(s) from {{ h.runs[0].when }} to {{ h.runs[-1].when }} UTC
under {{ h.directories | join(", ") }}: workload {{ last.workload }} (#{{ last.workload_hash }}), {{ last.config }}
(#{{ last.config_hash }}), {{ last.plan }} (#{{ last.plan_hash }}).
{% if h.apart %}{{ h.apart | length }} run(s) listed apart, at the end.{% endif %}</p>
{% if changes %}<div class="verdict {{ 'fail' if worse else 'pass' }}"><strong>{{ changes | length }} change
point(s)</strong><ul>{% for title, words in changes %}<li>{{ title }}: {{ words }}</li>{% endfor %}</ul></div>
{% else %}<div class="verdict pass"><strong>No change point</strong></div>{% endif %}
<h2>Trends</h2>
<table><tr><th class="l">figure</th><th>unit</th><th>first</th><th>last</th><th>min</th><th>max</th>
<th>last vs median before</th><th>change points</th></tr>
{% for t in h.trends %}<tr><td class="l">{{ t.title }}</td><td>{{ t.unit }}</td><td>{{ fig(t.first, t.unit) }}</td>
<td>{{ fig(t.last, t.unit) }}</td><td>{{ fig(t.min, t.unit) }}</td><td>{{ fig(t.max, t.unit) }}</td>
<td>{{ rel(t.last_vs_median) }}</td><td>{{ t.changes | length or "none" }}</td></tr>
{% endfor %}</table>
{% for t, image in charts %}<h2>{{ t.title }} ({{ t.unit }})</h2>
<figure><img src="{{ image }}" alt="{{ t.title }} over the runs"></figure>
{% endfor %}
<h2>Runs</h2>
<table><tr><th>#</th><th class="l">run</th><th class="l">started (UTC)</th><th class="l">server</th>
<th class="l">GPU</th><th class="l">labels</th></tr>
{% for r in h.runs %}<tr><td>{{ loop.index }}</td>
<td class="l"><a href="{{ links[loop.index0] }}">{{ r.run_id }}</a></td><td class="l">{{ r.when }}</td>
<td class="l">{{ r.server or "not detected" }}</td><td class="l">{{ r.gpu or "–" }}</td>
<td class="l">{% for k, v in r.labels.items() %}{{ k }}={{ v }}{% if not loop.last %}, {% endif %}{% endfor %}</td></tr>
{% endfor %}</table>
{% if h.apart %}<h2>Listed apart</h2>
<table><tr><th class="l">run</th><th class="l">why</th><th class="l">reason</th></tr>
{% for r in h.apart %}<tr><td class="l">{{ r.run_id }}</td><td class="l">{{ r.kind }}</td>
<td class="msg">{{ r.reason }}</td></tr>
{% endfor %}</table>{% endif %}
</body></html>
""")


def render_page(history: History, path: Path) -> None:
    """Write history.html at `path`; each run links to its report.html relative to the page."""
    with drawing():
        charts = [(trend, svg_data_uri(_chart(trend), trend.key)) for trend in history.trends]
    changes = [(t.title, change_words(t, c)) for t in history.trends for c in t.changes]
    page = TEMPLATE.render(
        h=history, last=history.runs[-1], charts=charts, changes=changes,
        worse=any(t.worse(c) for t in history.trends for c in t.changes),
        links=[Path(os.path.relpath(Path(run.path) / HTML_FILE, path.parent.resolve())).as_posix()
               for run in history.runs],
        start=page_start("history", ", ".join(history.directories), STYLE), fig=figure_text, rel=relative_text,
    )  # fmt: skip
    path.write_text(page, encoding="utf-8")
