"""The front door's answers (docs/API.md): what health says with and without a token. The
attacks these close are in test_attacks_front.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.api import write_tokens
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread

ANN, BOB = "ann-token-0123456789abcdef", "bob-token-0123456789abcdef"


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    """Two users."""
    tokens = write_tokens(
        tmp_path_factory.mktemp("door"), {ANN: ("ann", "user"), BOB: ("bob", "user")}
    )
    server = start_gateway("local", tokens=tokens)
    try:
        yield server
    finally:
        server.stop()


# --- health --------------------------------------------------------------------------------------


def test_health_without_a_token_says_only_the_status(door: GatewayThread) -> None:
    for token in (None, "not-a-token-0123456789"):
        response = Client(door.port, token).request("GET", "/v1/health")
        assert response.status == 200 and response.json() == {"status": "ok"}


def test_health_with_a_token_has_the_details(door: GatewayThread) -> None:
    response = Client(door.port, BOB).request("GET", "/v1/health")
    body = response.json()
    assert response.status == 200 and body["status"] == "ok" and body["backend"] == "local"
    assert body["store"] == {"kind": "sqlite", "ok": True} and body["version"]
    assert set(body["kernels"]) == {"running", "pooled"} and isinstance(body["pools"], dict)


def test_a_single_user_gateway_tells_its_user_everything(local_client: Client) -> None:
    body = Client(local_client.port).request("GET", "/v1/health").json()
    assert {"status", "backend", "store", "kernels", "pools", "version"} <= set(body)
