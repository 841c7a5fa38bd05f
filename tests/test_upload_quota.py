"""Per-user quota on uploads (issue 8, item 12): a user could keep any number of archives
for a day each. Past the quota (a count and stored bytes) the user's oldest uploads are
deleted to make room; other users' are never touched. Uploads are stored by the gateway,
not the sandbox, so one backend (local) covers it."""

from __future__ import annotations

import io
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, serving

pytestmark = pytest.mark.attack

TOKENS = {
    "alice-token-0123456789": ("alice", "user"),
    "bob-token-0123456789ab": ("bob", "user"),
}
COUNT, BYTES = 3, 100_000


@pytest.fixture(scope="module")
def uploads() -> Iterator[GatewayThread]:
    limits = {"max_uploads_per_user": COUNT, "max_upload_store_bytes_per_user": BYTES}
    yield from serving(start_gateway("local", users=TOKENS, allow_uploads=True, **limits))


def client_of(server: GatewayThread, user: str) -> Client:
    return server.client(next(t for t, (name, _) in TOKENS.items() if name == user))


def archive(name: str, size: int = 10) -> bytes:
    """A zip of one file of `size` random (incompressible) bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(name, os.urandom(size))
    return buffer.getvalue()


def upload(client: Client, data: bytes) -> str:
    response = client.request(
        "POST", "/v1/uploads", raw=data, headers={"Content-Type": "application/zip"}
    )
    assert response.status == 201, response.body[:500]
    return str(response.json()["id"])


def kept_by(server: GatewayThread, user: str) -> dict[str, int]:
    """The user's uploads on disk: id -> archive bytes."""
    folder: Path = server.settings.data_dir / "uploads"
    found = {}
    for meta in folder.glob("upl_*.json"):
        data = json.loads(meta.read_text())
        if data["user"] == user:
            found[data["id"]] = (folder / f"{data['id']}.archive").stat().st_size
    return found


def usable(client: Client, upload_id: str) -> bool:
    """Whether a run can use the upload (404 once it is gone)."""
    response = client.request(
        "POST", "/v1/runs", {"code": "import os; print(sorted(os.listdir()))", "archive": upload_id}
    )
    assert response.status in (200, 404), response.body[:500]
    return response.status == 200


def test_a_flood_of_uploads_keeps_the_newest_within_the_count(uploads: GatewayThread) -> None:
    alice, bob = client_of(uploads, "alice"), client_of(uploads, "bob")
    bobs = upload(bob, archive("bob.txt"))
    ids = [upload(alice, archive(f"{i}.txt")) for i in range(50)]
    assert set(kept_by(uploads, "alice")) == set(ids[-COUNT:])
    assert usable(alice, ids[-1]) and not usable(alice, ids[0])
    message = alice.request("POST", "/v1/runs", {"code": "1", "archive": ids[0]}).json()["error"][
        "message"
    ]
    assert "upload it again" in message
    assert set(kept_by(uploads, "bob")) == {bobs} and usable(bob, bobs)


def test_uploads_are_kept_within_the_bytes(uploads: GatewayThread) -> None:
    """Three archives of ~40 kB: the third pushes the first out of 100 kB."""
    bob = client_of(uploads, "bob")
    ids = [upload(bob, archive(f"big{i}.bin", 40_000)) for i in range(3)]
    mine = kept_by(uploads, "bob")
    assert set(ids[1:]) <= set(mine) and ids[0] not in mine
    assert sum(mine.values()) <= BYTES


def test_one_upload_over_the_bytes_still_goes_in_alone(uploads: GatewayThread) -> None:
    """An archive larger than the quota (but under max_upload_bytes) replaces them all."""
    alice = client_of(uploads, "alice")
    big = upload(alice, archive("huge.bin", 150_000))
    assert set(kept_by(uploads, "alice")) == {big}
