"""The route table: every URL of the API and the handler that serves it."""

from __future__ import annotations

from typing import Any

import tornado.web

from gateway.handlers.base import NotFoundHandler, Services
from gateway.handlers.ops import HealthHandler, MetricsHandler
from gateway.handlers.runs import RunHandler, RunNotebookHandler, RunsHandler

RUN_ID = r"(run_[0-9a-f]{1,64}|[A-Za-z0-9_-]{1,100})"


def routes(services: Services) -> list[Any]:
    kw = {"services": services}
    return [
        (r"/v1/health", HealthHandler, kw),
        (r"/metrics", MetricsHandler, kw),
        (r"/v1/runs", RunsHandler, kw),
        (rf"/v1/runs/{RUN_ID}", RunHandler, kw),
        (rf"/v1/runs/{RUN_ID}/notebook", RunNotebookHandler, kw),
    ]


def make_app(services: Services) -> tornado.web.Application:
    return tornado.web.Application(
        routes(services),
        default_handler_class=NotFoundHandler,
        default_handler_args={"services": services},
        compress_response=True,
        xheaders=False,
    )
