"""`/` and `/static/{name}`: the small browser front end (an HTML page that runs code over
`/v1/stream`) and its scripts and styles."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors

SCHEMAS: dict[str, Schema] = {}

_PUBLIC = (
    "Public (the page holds no data): it asks for the token when the gateway has tokens and "
    "sends it only in the WebSocket handshake. Sent with a strict Content-Security-Policy "
    "(scripts and styles from this gateway only, nothing may frame it)."
)

PATHS: dict[str, Schema] = {
    "/": {
        "get": {
            "operationId": "page",
            "tags": ["stream"],
            "summary": "A browser page to run code and watch its output live",
            "description": _PUBLIC,
            "security": [],
            "responses": {
                "200": {
                    "description": "The page.",
                    "content": {"text/html": {"schema": {"type": "string"}}},
                },
                **errors(404),
            },
        }
    },
    "/static/{name}": {
        "get": {
            "operationId": "pageFile",
            "tags": ["stream"],
            "summary": "The page's scripts, styles and images",
            "description": _PUBLIC,
            "security": [],
            "parameters": [
                {
                    "name": "name",
                    "in": "path",
                    "required": True,
                    "description": "a file of the page, e.g. `app.js`, `style.css`",
                    "schema": {"type": "string"},
                }
            ],
            "responses": {
                "200": {
                    "description": "The file.",
                    "content": {
                        "text/html": {"schema": {"type": "string"}},
                        "text/javascript": {"schema": {"type": "string"}},
                        "text/css": {"schema": {"type": "string"}},
                        "image/svg+xml": {"schema": {"type": "string"}},
                        "image/png": {"schema": {"type": "string", "format": "binary"}},
                        "image/x-icon": {"schema": {"type": "string", "format": "binary"}},
                        "text/plain": {"schema": {"type": "string"}},
                        "application/json": {"schema": {}},
                    },
                },
                **errors(404),
            },
        }
    },
}
