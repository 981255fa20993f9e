"""Where people watch a run live: an LLM tab in Locust's web UI and a Prometheus endpoint. Both
show the current run's `LiveStats` (llmload.live), and outlive a run: the web UI may start another."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import orjson
from flask import Response, request
from locust.web import WebUI
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import Metric

from llmload.live import LLM_TAB, LLM_TABLE, LiveStats

CurrentLive = Callable[[], LiveStats | None]  # the running (or last) run's live statistics, if any


class _LiveRegistry(CollectorRegistry):
    def __init__(self, current: CurrentLive) -> None:
        super().__init__(auto_describe=False)
        self._current = current

    def collect(self) -> Iterator[Metric]:
        live = self._current()
        if live is not None:
            yield from live.registry.collect()


def serve_prometheus(port: int, current: CurrentLive) -> None:
    """The live metrics on :port/metrics (OSError when the port is taken)."""
    start_http_server(port, addr="0.0.0.0", registry=_LiveRegistry(current))


def add_llm_tab(web_ui: WebUI, current: CurrentLive) -> None:
    """The LLM tab: its table rows ride along with the UI's stats polling."""
    web_ui.template_args["extended_tabs"] = [LLM_TAB]
    web_ui.template_args["extended_tables"] = [LLM_TABLE]
    assert web_ui.app is not None

    @web_ui.app.after_request
    def _with_llm_rows(response: Response) -> Response:
        live = current()
        if request.path == "/stats/requests" and response.is_json and live is not None:
            data = response.get_json()
            data["extended_stats"] = [{"key": LLM_TAB["key"], "data": live.tab_rows()}]
            response.set_data(orjson.dumps(data))
        return response
