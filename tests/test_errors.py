"""Bad input gets the API's error shape with the right status, never a 500 or a hang."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support import Client, GatewayThread

LOCAL_ONLY = {"backend": "local"}


@pytest.fixture(scope="module")
def small() -> Any:
    server = GatewayThread(backend="local", max_body_bytes=64 * 1024, max_code_bytes=1000).start()
    try:
        yield server
    finally:
        server.stop()


def error_of(response: Any, status: int, code: str) -> dict[str, Any]:
    assert response.status == status, (response.status, response.body[:500])
    assert response.headers["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


@pytest.mark.parametrize(
    ("body", "code", "field"),
    [
        ({"code": "1", "language": "ruby"}, "unsupported_language", "language"),
        ({"code": "1", "timeout": "soon"}, "invalid_request", "timeout"),
        ({"code": "1", "timeout": True}, "invalid_request", "timeout"),
        (
            {"code": "1", "files": [{"path": "../x", "content": ""}]},
            "invalid_path",
            "files[0].path",
        ),
        (
            {"code": "1", "files": [{"path": "/etc/x", "content": ""}]},
            "invalid_path",
            "files[0].path",
        ),
        (
            {"code": "1", "files": [{"path": "a\u0000b", "content": ""}]},
            "invalid_path",
            "files[0].path",
        ),
        (
            {"code": "1", "files": [{"path": "a", "content": "%%", "encoding": "base64"}]},
            "invalid_request",
            "files[0].content",
        ),
        (
            {"code": "1", "files": [{"path": "a", "content": "", "encoding": "rot13"}]},
            "invalid_request",
            "files[0].encoding",
        ),
        (
            {"code": "1", "entrypoint": "a.py", "files": [{"path": "a.py", "content": ""}]},
            "conflicting_fields",
            "entrypoint",
        ),
        ({"language": "python"}, "invalid_request", "code"),
        ({"code": 5}, "invalid_request", "code"),
        ({"entrypoint": "nope.py"}, "invalid_request", "entrypoint"),
        ({"code": "1", "vars": []}, "invalid_request", "vars"),
        ({"code": "1", "language": "bash", "vars": {"1bad": "x"}}, "invalid_request", "vars"),
        ({"code": "1", "env": {"A": 1}}, "invalid_request", "env"),
        ({"code": "1", "return_files": "a"}, "invalid_request", "return_files"),
        ({"code": "1", "nonsense": 1}, "invalid_request", "nonsense"),
        ({"code": "1", "network": True}, "forbidden", "network"),
        ({"code": "1", "archive": "abc"}, "archive_mode_disabled", "archive"),
        ({"code": "1", "working_dir": "proj"}, "forbidden", "working_dir"),
    ],
)
def test_invalid_run_requests(small: GatewayThread, body: dict, code: str, field: str) -> None:
    response = small.client().request("POST", "/v1/runs", body)
    status = 403 if code in ("forbidden", "archive_mode_disabled") else 400
    assert error_of(response, status, code).get("field") == field


def test_malformed_json_and_non_objects(small: GatewayThread) -> None:
    client = small.client()
    error_of(client.request("POST", "/v1/runs", raw=b"{bad"), 400, "invalid_request")
    error_of(client.request("POST", "/v1/runs", raw=b""), 400, "invalid_request")
    error_of(client.request("POST", "/v1/runs", raw=b"[1]"), 400, "invalid_request")
    error_of(client.request("POST", "/v1/runs", raw=b"\xff\xfe"), 400, "invalid_request")


def test_wrong_media_type(small: GatewayThread) -> None:
    response = small.client().request(
        "POST", "/v1/runs", raw=b"<x/>", headers={"Content-Type": "application/xml"}
    )
    error_of(response, 415, "unsupported_media_type")


def test_oversize_body_and_code(small: GatewayThread) -> None:
    client = small.client()
    error_of(client.request("POST", "/v1/runs", {"code": "x" * 100_000}), 413, "payload_too_large")
    error_of(client.request("POST", "/v1/runs", {"code": "x" * 2000}), 413, "payload_too_large")


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
    error_of(client.request("GET", "/v1/runs/run_0123456789abcdef0123"), 404, "not_found")
    error_of(client.request("DELETE", "/v1/runs/run_0123456789abcdef0123"), 404, "not_found")
    error_of(client.request("GET", "/v1/runs/nope/notebook"), 404, "not_found")
    error_of(client.request("GET", "/v2/anything"), 404, "not_found")
    wrong_method = client.request("PUT", "/v1/runs", {"code": "1"})
    error_of(wrong_method, 405, "method_not_allowed")
    assert wrong_method.headers["Allow"] == "POST"


def test_single_user_mode_answers_only_to_loopback_names(small: GatewayThread) -> None:
    client = small.client()
    rebound = client.request("GET", "/v1/health", headers={"Host": f"evil.example:{small.port}"})
    error_of(rebound, 403, "forbidden")
    run = client.request("POST", "/v1/runs", {"code": "1"}, headers={"Host": "evil.example"})
    error_of(run, 403, "forbidden")
    for host in (f"localhost:{small.port}", f"127.0.0.1:{small.port}", "[::1]"):
        assert client.request("GET", "/v1/health", headers={"Host": host}).status == 200


def test_health_needs_no_token_and_reports_the_backend(small: GatewayThread) -> None:
    response = Client(small.port).request("GET", "/v1/health")
    assert response.status == 200
    body = response.json()
    assert body["status"] == "ok" and body["backend"] == "local"
    assert body["kernels"] == {"running": 0, "pooled": 0} and body["version"]
