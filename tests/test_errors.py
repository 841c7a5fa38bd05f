"""Bad input gets the API's error shape with the right status, never a 500 or a hang."""

from __future__ import annotations

import shutil
from typing import Any

import pytest

from tests.api import assert_error
from tests.invalid_requests import RUN_FIELD_ERRORS, status_of
from tests.support import Client, GatewayThread, serving, wait_for

pytestmark = pytest.mark.fast


@pytest.fixture(scope="module")
def small() -> Any:
    yield from serving(
        GatewayThread(backend="local", max_body_bytes=64 * 1024, max_code_bytes=1000).start()
    )


@pytest.mark.parametrize(("body", "code", "field"), RUN_FIELD_ERRORS)
def test_invalid_run_requests(small: GatewayThread, body: dict, code: str, field: str) -> None:
    response = small.client().request("POST", "/v1/runs", body)
    assert_error(response, status_of(code), code, field=field)


def test_malformed_json_and_non_objects(small: GatewayThread) -> None:
    client = small.client()
    assert_error(client.request("POST", "/v1/runs", raw=b"{bad"), 400, "invalid_request")
    assert_error(client.request("POST", "/v1/runs", raw=b""), 400, "invalid_request")
    assert_error(client.request("POST", "/v1/runs", raw=b"[1]"), 400, "invalid_request")
    assert_error(client.request("POST", "/v1/runs", raw=b"\xff\xfe"), 400, "invalid_request")


def test_wrong_media_type(small: GatewayThread) -> None:
    response = small.client().request(
        "POST", "/v1/runs", raw=b"<x/>", headers={"Content-Type": "application/xml"}
    )
    assert_error(response, 415, "unsupported_media_type")


def test_oversize_body_and_code(small: GatewayThread) -> None:
    client = small.client()
    assert_error(
        client.request("POST", "/v1/runs", {"code": "x" * 100_000}), 413, "payload_too_large"
    )
    assert_error(client.request("POST", "/v1/runs", {"code": "x" * 2000}), 413, "payload_too_large")


def test_oversize_chunked_body(small: GatewayThread) -> None:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", small.port, timeout=30)
    chunks = (b"x" * 16384 for _ in range(8))
    conn.request(
        "POST",
        "/v1/runs",
        body=chunks,
        headers={"Content-Type": "application/json"},
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 413
    conn.close()


def test_unknown_run_and_unknown_address(small: GatewayThread) -> None:
    client = small.client()
    assert_error(client.request("GET", "/v1/runs/run_0123456789abcdef0123"), 404, "not_found")
    assert_error(client.request("DELETE", "/v1/runs/run_0123456789abcdef0123"), 404, "not_found")
    assert_error(client.request("GET", "/v1/runs/nope/notebook"), 404, "not_found")
    assert_error(client.request("GET", "/v2/anything"), 404, "not_found")
    wrong_method = client.request("PUT", "/v1/runs", {"code": "1"})
    assert_error(wrong_method, 405, "method_not_allowed")
    assert wrong_method.headers["Allow"] == "GET, POST"  # list runs, start one


def test_the_websocket_route_answers_a_wrong_method_like_every_route(
    small: GatewayThread,
) -> None:
    """HTTP and WebSocket handlers share one error writer: the same code, `Allow` header and
    security headers (the WebSocket's own answered `invalid_request` without `Allow`)."""
    wrong_method = small.client().request("POST", "/v1/stream", {"code": "1"})
    assert_error(wrong_method, 405, "method_not_allowed")
    assert wrong_method.headers["Allow"] == "GET"
    assert wrong_method.headers["X-Content-Type-Options"] == "nosniff"
    assert wrong_method.headers["Cache-Control"] == "no-store"


def test_single_user_mode_answers_only_to_loopback_names(small: GatewayThread) -> None:
    client = small.client()
    rebound = client.request("GET", "/v1/health", headers={"Host": f"evil.example:{small.port}"})
    assert_error(rebound, 403, "forbidden")
    run = client.request("POST", "/v1/runs", {"code": "1"}, headers={"Host": "evil.example"})
    assert_error(run, 403, "forbidden")
    for host in (f"localhost:{small.port}", f"127.0.0.1:{small.port}", "[::1]"):
        assert client.request("GET", "/v1/health", headers={"Host": host}).status == 200


def test_health_needs_no_token_and_reports_the_backend(small: GatewayThread) -> None:
    response = Client(small.port).request("GET", "/v1/health")
    assert response.status == 200
    body = response.json()
    assert body["status"] == "ok" and body["backend"] == "local"
    assert body["kernels"]["running"] == 0 and body["version"]
    pools = body["pools"]
    # R's pool holds one kernel where the kernels have R (the local ones: this machine's)
    assert set(pools) == {"ipykernel", "bash", "deno", "irkernel"}
    has_r = shutil.which("R") is not None
    assert wait_for(
        lambda: (
            Client(small.port).request("GET", "/v1/health").json()["pools"]["irkernel"]["size"]
            == int(has_r)
        ),
        timeout=30,
    )
    assert body["kernels"]["pooled"] == sum(pool["ready"] for pool in pools.values())
