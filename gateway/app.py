"""The route table: every URL of the API and the handler that serves it."""

from __future__ import annotations

from typing import Any

import tornado.web

from gateway.handlers.base import NotFoundHandler, Services
from gateway.handlers.environment import EnvironmentHandler
from gateway.handlers.notebooks import NotebookRunHandler
from gateway.handlers.openapi import OpenAPIHandler
from gateway.handlers.ops import HealthHandler, MetricsHandler
from gateway.handlers.page import PageHandler, StaticHandler
from gateway.handlers.runs import RunHandler, RunNotebookHandler, RunsHandler
from gateway.handlers.snapshots import SnapshotHandler, SnapshotsHandler
from gateway.handlers.stream import StreamHandler
from gateway.handlers.tools import (
    CodeExecToolHandler,
    CodeRunToolHandler,
    RunPythonToolHandler,
)
from gateway.handlers.uploads import UploadsHandler
from gateway.handlers.usage import UsageHandler
from gateway.models.common import RUN_ID_PATTERN

RUN_ID = RUN_ID_PATTERN


def routes(services: Services) -> list[Any]:
    kw = {"services": services}
    return [
        (r"/v1/health", HealthHandler, kw),
        (r"/v1/environment", EnvironmentHandler, kw),
        (r"/metrics", MetricsHandler, kw),
        (r"/openapi.json", OpenAPIHandler, kw),
        (r"/v1/runs", RunsHandler, kw),
        (rf"/v1/runs/{RUN_ID}", RunHandler, kw),
        (rf"/v1/runs/{RUN_ID}/notebook", RunNotebookHandler, kw),
        (r"/v1/notebooks/run", NotebookRunHandler, kw),
        (r"/v1/snapshots", SnapshotsHandler, kw),
        (r"/v1/usage", UsageHandler, kw),
        (r"/v1/snapshots/(snap_[A-Za-z0-9_-]{16,64})", SnapshotHandler, kw),
        (r"/v1/uploads", UploadsHandler, kw),
        (r"/v1/tools/code_run", CodeRunToolHandler, kw),
        (r"/v1/tools/run_python", RunPythonToolHandler, kw),
        (r"/v1/tools/code_exec", CodeExecToolHandler, kw),
        (r"/v1/stream", StreamHandler, kw),
        (r"/", PageHandler, kw),
        (r"/static/(.*)", StaticHandler, kw),
    ]


def make_app(services: Services) -> tornado.web.Application:
    return tornado.web.Application(
        routes(services),
        default_handler_class=NotFoundHandler,
        default_handler_args={"services": services},
        # gzip is applied by the handlers (gateway/handlers/encode.py), large answers in the
        # heavy-work pool: tornado's own transform compressed every answer on the event loop
        compress_response=False,
        xheaders=False,
    )
