"""Operations: `/v1/health` (public), `/metrics` (Prometheus text) and `/openapi.json`."""

from __future__ import annotations

from gateway.openapi.common import Schema, errors, json_body, ref

SCHEMAS: dict[str, Schema] = {
    "Health": {
        "type": "object",
        "required": ["status", "backend", "kernels", "version"],
        "additionalProperties": False,
        "properties": {
            "status": {
                "enum": ["ok", "draining"],
                "description": "`draining` after SIGTERM: running runs finish, new ones get 429",
            },
            "backend": {"enum": ["docker", "local"]},
            "kernels": {
                "type": "object",
                "required": ["running", "pooled"],
                "additionalProperties": False,
                "properties": {
                    "running": {"type": "integer", "minimum": 0},
                    "pooled": {
                        "type": "integer",
                        "minimum": 0,
                        "description": "started kernels waiting, never used (0 without a pool)",
                    },
                },
            },
            "pools": {
                "type": "object",
                "description": "the warm pool of each kernel (`ipykernel`, `bash`, `deno`)",
                "additionalProperties": {
                    "type": "object",
                    "required": ["size", "ready", "starting", "hits", "misses"],
                    "additionalProperties": False,
                    "properties": {
                        name: {"type": "integer", "minimum": 0, "description": text}
                        for name, text in (
                            ("size", "kernels kept ready (0: the pool is off)"),
                            ("ready", "kernels ready now, never used"),
                            ("starting", "kernels being started to refill the pool"),
                            ("hits", "runs that took a ready kernel"),
                            ("misses", "runs that started a kernel of their own"),
                        )
                    },
                },
            },
            "version": {"type": "string"},
        },
    },
}

PATHS: dict[str, Schema] = {
    "/v1/health": {
        "get": {
            "operationId": "health",
            "tags": ["operations"],
            "summary": "Is the gateway up",
            "description": "Public: no token needed.",
            "security": [],
            "responses": {"200": json_body(ref("Health"), "The gateway's state."), **errors()},
        }
    },
    "/metrics": {
        "get": {
            "operationId": "metrics",
            "tags": ["operations"],
            "summary": "Prometheus metrics",
            "description": (
                "Runs by status and language, run duration and kernel start duration "
                "histograms, pool size, queue length, runs in progress."
            ),
            "responses": {
                "200": {
                    "description": "Prometheus text exposition format 0.0.4.",
                    "content": {"text/plain": {"schema": {"type": "string"}}},
                },
                **errors(401),
            },
        }
    },
    "/openapi.json": {
        "get": {
            "operationId": "openapi",
            "tags": ["operations"],
            "summary": "This document",
            "description": "Public: no token needed.",
            "security": [],
            "responses": {
                "200": json_body({"type": "object"}, "The OpenAPI 3.1 document."),
                **errors(),
            },
        }
    },
}
