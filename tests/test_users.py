"""Users, tokens, persistent workspaces, per-user limits, and records that survive a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.server import Gateway
from gateway.settings import load
from tests.conftest import start_gateway
from tests.support import (
    Client,
    GatewayThread,
    serving,
    wait_for,
    write_tokens,
)

ANN, BOB, ROOT = "ann-token-0123456789", "bob-token-0123456789", "admin-token-0123456789"


@pytest.fixture
def multi(backend_name: str, tmp_path: Path) -> Iterator[GatewayThread]:
    tokens = write_tokens(
        tmp_path, {ANN: ("ann", "user"), BOB: ("bob", "user"), ROOT: ("root", "admin")}
    )
    shared = tmp_path / "shared"
    shared.mkdir()
    server = start_gateway(
        backend_name,
        tokens=tokens,
        workspaces=tmp_path / "ws",
        admin_dirs=(str(shared),),
        max_runs_per_user=1,
        max_concurrent_runs=2,
    )
    yield from serving(server)


def test_every_endpoint_but_health_needs_a_token(multi: GatewayThread) -> None:
    anonymous = Client(multi.port)
    assert anonymous.request("GET", "/v1/health").status == 200
    for method, path in [("POST", "/v1/runs"), ("GET", "/v1/runs/run_00"), ("GET", "/metrics")]:
        response = anonymous.request(method, path, {"code": "1"} if method == "POST" else None)
        assert response.status == 401, path
        assert response.json()["error"]["code"] == "unauthorized"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = Client(multi.port, token=ANN[:-1] + "x")
    assert wrong.request("POST", "/v1/runs", {"code": "1"}).status == 401
    query = anonymous.request("POST", f"/v1/runs?token={ANN}", {"code": "1"})
    assert query.status == 401  # never accepted in a URL outside the WebSocket handshake


def test_users_never_see_each_others_runs(multi: GatewayThread) -> None:
    ann, bob, admin = (Client(multi.port, t) for t in (ANN, BOB, ROOT))
    record = ann.run(code="print('mine')")
    assert ann.request("GET", f"/v1/runs/{record['id']}").status == 200
    for path in (f"/v1/runs/{record['id']}", f"/v1/runs/{record['id']}/notebook"):
        assert bob.request("GET", path).status == 404
    assert bob.request("DELETE", f"/v1/runs/{record['id']}").status == 404
    assert admin.request("GET", f"/v1/runs/{record['id']}").status == 200


def test_per_user_limit_answers_429_with_retry_after(multi: GatewayThread) -> None:
    ann, bob = Client(multi.port, ANN), Client(multi.port, BOB)
    first = ann.request(
        "POST", "/v1/runs", {"code": "import time; time.sleep(30)", "background": True}
    )
    assert first.status == 202
    second = ann.request("POST", "/v1/runs", {"code": "print(2)"})
    assert second.status == 429 and int(second.headers["Retry-After"]) >= 1
    assert second.json()["error"]["code"] == "capacity"
    assert bob.run(code="print(3)")["stdout"] == "3\n"  # another user is not held back
    ann.request("DELETE", f"/v1/runs/{first.json()['id']}")


def test_workspace_persists_between_runs_and_confines_users(
    multi: GatewayThread, tmp_path: Path
) -> None:
    ann, bob = Client(multi.port, ANN), Client(multi.port, BOB)
    wrote = ann.run(code="open('notes.txt', 'w').write('kept')\nx = 1", working_dir="proj")
    assert wrote["status"] == "succeeded", wrote
    assert (tmp_path / "ws" / "ann" / "proj" / "notes.txt").read_text() == "kept"
    again = ann.run(
        code="import os\nresult = [open('notes.txt').read(), 'x' in dir()]", working_dir="proj"
    )
    assert again["result"] == ["kept", False]  # files stay, nothing else does
    outside = ann.run(code="import os\nresult = sorted(os.listdir('.'))", working_dir="/etc")
    assert outside["result"] == ["proj"] and any(
        "outside your workspace" in n for n in outside["notes"]
    )
    escape = ann.request("POST", "/v1/runs", {"code": "1", "working_dir": "../bob"})
    assert escape.status == 400 and escape.json()["error"]["code"] == "invalid_path"
    theirs = bob.run(code="import os\nresult = os.listdir('.')", working_dir="proj")
    assert theirs["result"] == []


def test_a_planted_link_cannot_redirect_a_workspace(multi: GatewayThread) -> None:
    ann = Client(multi.port, ANN)
    ann.run(code="import os\nos.symlink('/etc', 'evil')", working_dir=".")
    response = ann.request("POST", "/v1/runs", {"code": "1", "working_dir": "evil"})
    assert response.status == 400 and response.json()["error"]["field"] == "working_dir"
    staged = ann.request(
        "POST",
        "/v1/runs",
        {
            "code": "1",
            "working_dir": ".",
            "files": [{"path": "evil/passwd", "content": "x"}],
        },
    )
    assert staged.status == 400 and staged.json()["error"]["code"] == "invalid_path"
    assert "link" in staged.json()["error"]["message"]
    assert Path("/etc/passwd").read_text().startswith("root:")


def test_admin_may_use_allowed_folders_only(multi: GatewayThread, tmp_path: Path) -> None:
    admin = Client(multi.port, ROOT)
    record = admin.run(
        code="open('by-admin.txt', 'w').write('a')", working_dir=str(tmp_path / "shared")
    )
    assert record["status"] == "succeeded", record
    assert (tmp_path / "shared" / "by-admin.txt").exists()
    refused = admin.request("POST", "/v1/runs", {"code": "1", "working_dir": "/etc"})
    assert refused.status == 403


def test_record_ttl_expires_old_runs(tmp_path: Path) -> None:
    server = GatewayThread(backend="local", record_ttl=1.0).start()
    try:
        record = server.client().run(code="print(1)")
        assert wait_for(
            lambda: server.client().request("GET", f"/v1/runs/{record['id']}").status == 404,
            timeout=10,
        )
    finally:
        server.stop()


def test_refuses_to_listen_beyond_loopback_without_tokens() -> None:
    with pytest.raises(RuntimeError, match="loopback"):
        Gateway(load(environ={}, overrides={"host": "0.0.0.0", "backend": "local"}))
