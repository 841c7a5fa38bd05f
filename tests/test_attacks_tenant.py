"""Tenants against each other and the host, the leftovers of issue 20 (rows 6, 7 and 8 and
the shared uid): a workspace's size, user names that shared a folder, what a local sandbox
saw of other sandboxes and of the gateway, and per-uid kernel counters shared by all."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth import TokenTable, user_folder
from tests.api import write_tokens
from tests.conftest import start_gateway

pytestmark = pytest.mark.attack

MiB = 1024 * 1024


def tokens_for(folder: Path, *users: str) -> tuple[Path, dict[str, str]]:
    """A token file with one user token per name; the tokens by user."""
    table = {f"token-{i:02d}-0123456789abcdef": name for i, name in enumerate(users)}
    path = write_tokens(folder, {t: (name, "user") for t, name in table.items()})
    return path, {name: token for token, name in table.items()}


# --- row 7: user names map to folders one to one ------------------------------------------

LOOKALIKES = [("ann", ".ann"), ("a_b", "a b"), ("x_y", "x@y"), ("ann", "..ann"), ("_", "")]


def test_user_names_that_look_alike_get_folders_of_their_own(tmp_path: Path) -> None:
    names = sorted({name for pair in LOOKALIKES for name in pair})
    tokens, token_of = tokens_for(tmp_path / "etc", *names)
    server = start_gateway("local", tokens=tokens, workspaces=tmp_path / "ws")
    try:
        for first, second in LOOKALIKES:
            mine = server.client(token_of[first]).run(
                code=f"open('secret.txt', 'w').write({first!r})", working_dir="."
            )
            assert mine["status"] == "succeeded", mine
            theirs = server.client(token_of[second]).run(
                code="import os\nresult = sorted(os.listdir('.'))", working_dir="."
            )
            assert theirs["status"] == "succeeded", theirs
            assert "secret.txt" not in theirs["result"], (first, second, theirs["result"])
            # and back: the second's own file is not the first's either
            server.client(token_of[second]).run(
                code=f"open('secret.txt', 'w').write({second!r})", working_dir="."
            )
            again = server.client(token_of[first]).run(
                code="result = open('secret.txt').read()", working_dir="."
            )
            assert again["result"] == first, (first, second, again)
    finally:
        server.stop()


def test_user_folders_are_one_to_one_and_never_hidden_names() -> None:
    names = ["ann", ".ann", "..", ".", "", "a b", "a_b", "x@y", "x_y", "~61", "a", "é", "\udc80"]
    names += ["A", "a.b", "a-b", "-", "_", "~", "ann/..", "ann\x00"]
    folders = [user_folder(name) for name in names]
    assert len(set(folders)) == len(names), dict(zip(names, folders, strict=True))
    for folder in folders:
        assert folder and not folder.startswith(".") and "/" not in folder and "\0" not in folder
    # names that were folders before keep them
    assert [user_folder(n) for n in ("ann", "a_b", "x-y.z", "Bob_2")] == [
        "ann",
        "a_b",
        "x-y.z",
        "Bob_2",
    ]


def test_a_tokens_file_whose_user_cannot_have_a_folder_is_refused(tmp_path: Path) -> None:
    fine, _ = tokens_for(tmp_path / "fine", "a" * 255, "é" * 63)
    TokenTable.load(fine)
    for name in ("a" * 256, "é" * 64, "\x01" * 128):
        path, _ = tokens_for(tmp_path / f"n{len(name)}{ord(name[0])}", name)
        with pytest.raises(ValueError, match="folder name"):
            TokenTable.load(path)
