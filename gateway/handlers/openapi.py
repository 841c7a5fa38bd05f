"""`GET /openapi.json`: the OpenAPI 3.1 document of the API (public)."""

from __future__ import annotations

import functools
import json

from gateway.handlers.base import BaseHandler
from gateway.openapi import build_document


@functools.cache
def document_text() -> str:
    return json.dumps(build_document(), ensure_ascii=False)


class OpenAPIHandler(BaseHandler):
    public = True

    def get(self) -> None:
        self.set_header("Cache-Control", "no-cache")
        self.finish(document_text())
