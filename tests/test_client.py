"""`gateway.client.GatewayClient` against a real gateway: every call, and error answers
raised as `GatewayClientError` with the API's code, message and field."""

from __future__ import annotations

import io
import secrets
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import gateway.client
from gateway.client import GatewayClient, GatewayClientError
from tests.api import write_tokens
from tests.conftest import start_gateway
from tests.support import GatewayThread, free_port


@pytest.fixture
def api(gateway: GatewayThread) -> GatewayClient:
    return GatewayClient(f"http://127.0.0.1:{gateway.port}")


def test_public_surface_is_declared() -> None:
    assert set(gateway.client.__all__) == {"DEFAULT_TIMEOUT", "GatewayClient", "GatewayClientError"}
    for name in gateway.client.__all__:
        assert hasattr(gateway.client, name)


def test_run_get_notebook_and_health(api: GatewayClient) -> None:
    record = api.run("print(6 * 7)\nresult = 'r'", timeout=20)
    assert record["status"] == "succeeded" and record["stdout"] == "42\n"
    assert record["result"] == "r"
    assert api.get_run(record["id"]) == record
    notebook = api.notebook(record["id"])
    assert notebook["nbformat"] == 4
    assert "".join(notebook["cells"][0]["source"]) == "print(6 * 7)\nresult = 'r'"
    bash = api.run("echo $GREETING", language="bash", env={"GREETING": "hi"})
    assert bash["stdout"] == "hi\n"
    health = api.health()
    assert health["status"] == "ok" and "version" in health
    assert "gateway_" in api.metrics()
    assert api.openapi()["openapi"].startswith("3.1")


def test_background_run_can_be_cancelled(api: GatewayClient) -> None:
    accepted = api.run("import time\ntime.sleep(60)", background=True)
    assert set(accepted) == {"id", "status"}
    record = api.cancel(accepted["id"])
    assert record["status"] == "cancelled" and record["kill_reason"] == "cancelled"


def test_run_notebook_with_and_without_options(api: GatewayClient) -> None:
    nb = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {},
        "cells": [
            {
                "id": "a",
                "cell_type": "code",
                "metadata": {},
                "source": "x = 3",
                "outputs": [],
                "execution_count": None,
            },
            {
                "id": "b",
                "cell_type": "code",
                "metadata": {},
                "source": "print(x * 2)",
                "outputs": [],
                "execution_count": None,
            },
        ],
    }
    for answer in (api.run_notebook(nb), api.run_notebook(nb, timeout=20, allow_errors=False)):
        assert answer["run"]["status"] == "succeeded"
        assert answer["notebook"]["cells"][1]["outputs"][0]["text"] == "6\n"


def test_error_answers_raise_with_code_message_and_field(api: GatewayClient) -> None:
    with pytest.raises(GatewayClientError) as caught:
        api.run("1", language="cobol")
    error = caught.value
    assert (error.status, error.code, error.field) == (400, "unsupported_language", "language")
    assert "python" in error.message and "unsupported_language" in str(error)
    with pytest.raises(GatewayClientError) as caught:
        api.run("1", files=[{"path": "/etc/passwd", "content": ""}])
    assert (caught.value.code, caught.value.field) == ("invalid_path", "files[0].path")
    with pytest.raises(GatewayClientError) as caught:
        api.get_run("run_0000")
    assert (caught.value.status, caught.value.code) == (404, "not_found")
    with pytest.raises(GatewayClientError) as caught:
        api.upload(b"PK", filename="a.zip")  # uploads are off on this gateway
    assert (caught.value.status, caught.value.code) == (403, "archive_mode_disabled")


def test_unreachable_gateway_is_a_client_error() -> None:
    with pytest.raises(GatewayClientError) as caught:
        GatewayClient(f"http://127.0.0.1:{free_port()}", timeout=5).health()
    assert (caught.value.status, caught.value.code) == (0, "unreachable")


def test_a_bad_url_is_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        GatewayClient("ftp://example")


TOKEN = "client-" + secrets.token_hex(16)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    """A local gateway with a token, uploads enabled and one run per user at a time."""
    tokens = write_tokens(tmp_path_factory.mktemp("tokens"), {TOKEN: ("alice", "user")})
    server = start_gateway("local", tokens=tokens, allow_uploads=True, max_runs_per_user=1)
    try:
        yield server
    finally:
        server.stop()


def test_token_uploads_and_retry_after(guarded: GatewayThread, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{guarded.port}"
    with pytest.raises(GatewayClientError) as caught:
        GatewayClient(url).run("1")
    assert (caught.value.status, caught.value.code) == (401, "unauthorized")
    with pytest.raises(GatewayClientError):
        GatewayClient(url, token="wrong-" + TOKEN).run("1")
    assert GatewayClient(url).health()["status"] == "ok"  # public

    api = GatewayClient(url + "/", token=TOKEN)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("main.py", "print('zipped')\n")
    path = tmp_path / "project.zip"
    path.write_bytes(buffer.getvalue())
    upload = api.upload(path)
    assert upload["entries"] == 1 and upload["unpacked_bytes"] == len("print('zipped')\n")
    assert api.upload(buffer.getvalue(), filename="same.zip")["entries"] == 1
    record = api.request("POST", "/v1/runs", {"archive": upload["id"], "entrypoint": "main.py"})
    assert record["stdout"] == "zipped\n"
    with pytest.raises(GatewayClientError) as caught:
        api.upload(b"definitely not an archive", filename="x.zip")
    assert caught.value.status == 400 and caught.value.code.startswith("archive_")

    busy = api.run("import time\ntime.sleep(60)", background=True)
    try:
        with pytest.raises(GatewayClientError) as caught:
            api.run("print(1)")
        assert (caught.value.status, caught.value.code) == (429, "capacity")
        assert caught.value.retry_after is not None and caught.value.retry_after >= 1
    finally:
        api.cancel(busy["id"])
