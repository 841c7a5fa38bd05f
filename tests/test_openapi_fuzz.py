"""A bounded schemathesis run against the real gateway: no 5xx, and every error in the API's
shape with a documented status and code. Without schemathesis the module is skipped, or
fails under GATEWAY_REQUIRE=schemathesis (as in CI)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests import needs
from tests.openapi_support import (
    DOC,
    assert_error_answer,
)
from tests.openapi_support import FUZZ_TOKEN as TOKEN
from tests.support import GatewayThread

schemathesis = needs.import_module(
    "schemathesis", "schemathesis", "install the test extras (pip install -e '.[test]')"
)
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.specs.openapi.checks import (  # noqa: E402
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

FUZZ_SCHEMA = schemathesis.openapi.from_dict(copy.deepcopy(DOC)).exclude(path="/v1/stream")
FUZZ_SCHEMA.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE]
)
# Bounded: no coverage phase (hundreds of boundary cases), at most 10 cases per operation.
FUZZ_SCHEMA.config.phases.update(phases=["examples", "fuzzing"])
# The archive media types carry raw bytes, like application/octet-stream.
schemathesis.serializer.alias(
    [
        m
        for m in DOC["paths"]["/v1/uploads"]["post"]["requestBody"]["content"]
        if m.startswith("application/") and m != "application/octet-stream"
    ],
    "application/octet-stream",
)
FUZZ_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def tame(body: Any) -> None:
    """Keep generated runs short: every timeout a number above 1 becomes 1."""
    if not isinstance(body, dict):
        return
    for key in ("timeout", "cell_timeout", "timeout_seconds"):
        value = body.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 1:
            body[key] = 1
    for inner in ("arguments", "params", "notebook"):
        tame(body.get(inner))


@pytest.mark.slow
@pytest.mark.timeout(300)
@FUZZ_SCHEMA.parametrize()
@settings(
    max_examples=10,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_fuzz_finds_no_server_error(case: Any, fuzz_gateway: GatewayThread) -> None:
    tame(case.body)
    response = case.call(
        base_url=f"http://127.0.0.1:{fuzz_gateway.port}",
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=60,
    )
    method = case.method.lower()
    if method not in DOC["paths"][case.path]:  # schemathesis also tries other methods
        assert response.status_code == 405, response.text[:500]
        assert_error_answer(405, response.json(), None, None)
        return
    case.validate_response(response, checks=FUZZ_CHECKS)
    if response.status_code >= 400:
        assert_error_answer(response.status_code, response.json(), case.path, method)


def test_tame_shortens_every_timeout() -> None:
    body: dict[str, Any] = {"timeout": 50, "arguments": {"timeout_seconds": 9}, "params": {}}
    tame(body)
    assert body == {"timeout": 1, "arguments": {"timeout_seconds": 1}, "params": {}}
