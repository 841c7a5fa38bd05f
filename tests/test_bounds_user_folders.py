"""User names map to workspace folders one to one (DESIGN.md, "Tenant → tenant, more"), for
any text a token file can hold, lone surrogates included (JSON's `"\\udc80"` is one): issue
30, item 5. The mapping's inverse is written here, not taken from `gateway.auth`: a folder
that decodes back to its name is one no other name can have.

Checked by mutation: with `surrogatepass` turned into `replace` in `user_folder`,
`"\\udc80"`, `"\\udc81"` and `"?"` all became `~3f`, and the mapping's tests here fail.

A user name can no longer hold a lone surrogate at all (found by this file: the token file
loaded, but no store could keep such a name, so the user's every run was a 500); the mapping
stays one to one for any text, as `is_user_folder` decodes any `~` folder name."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.auth import NAME_MAX, TokenTable, check_user_name, is_user_folder, user_folder
from tests.support import write_tokens

pytestmark = pytest.mark.fast

# Any code point, surrogates included (hypothesis leaves them out unless told), and more
# often the ones that sit at the mapping's edges: lone surrogates, what `replace` would make
# of them, the escape character, the dot, separators.
EDGES = "?~.-_a/\x00é\udc80\udc81\ud800\udfff\ud83d\ude00"
CHARACTERS = st.one_of(st.sampled_from(EDGES), st.characters(exclude_categories=()))
NAMES = st.text(CHARACTERS, max_size=12)


def name_of(folder: str) -> str:
    """The user name a folder was made for: the inverse of the documented mapping (a kept
    name as it is; otherwise `~` and the hex of its UTF-8 bytes, surrogates as they are)."""
    if folder.startswith("~"):
        return bytes.fromhex(folder[1:]).decode("utf-8", "surrogatepass")
    return folder


@given(NAMES)
@example("\udc80")
@example("?")
@example("\ud83d\ude00")  # a surrogate pair, not the emoji it would make
def test_a_folder_names_its_user_and_only_them(name: str) -> None:
    folder = user_folder(name)
    assert name_of(folder) == name, (name, folder)
    assert is_user_folder(folder)
    assert folder and not folder.startswith(".") and "/" not in folder and "\0" not in folder
    assert folder.isascii()  # no encoding of the host's can make two of one


# few characters, so that lists of them hold names that differ in one character only
SHORT_NAMES = st.text(st.sampled_from(EDGES), max_size=3)


@given(st.lists(SHORT_NAMES, unique=True, min_size=2, max_size=12))
@example(["?", "\udc80"])
def test_different_names_never_share_a_folder(names: list[str]) -> None:
    folders = [user_folder(name) for name in names]
    assert len(set(folders)) == len(names), dict(zip(names, folders, strict=True))


def test_lone_surrogates_and_the_question_mark_have_folders_of_their_own() -> None:
    names = ["?", "\udc80", "\udc81", "\ud800", "\udc80\udc80", "\ufffd", "~3f"]
    folders = [user_folder(name) for name in names]
    assert len(set(folders)) == len(names), dict(zip(names, folders, strict=True))


def utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


@given(NAMES)
def test_a_name_is_refused_exactly_when_it_cannot_have_a_folder_or_a_record(name: str) -> None:
    """Too long a folder name, or a lone surrogate: no store keeps one (SQLite and
    PostgreSQL take UTF-8), so such a user's every run was a 500."""
    fits = utf8(name) and len(user_folder(name)) <= NAME_MAX
    try:
        check_user_name(name)
    except ValueError:
        assert not fits, name
    else:
        assert fits, name


def test_a_token_file_naming_a_user_with_a_lone_surrogate_is_refused(tmp_path: Path) -> None:
    """JSON's `"\\udc80"` is a lone surrogate: the token file loaded, the user's folder was
    made, and every run of theirs was a 500 (the store could not keep their name). Refused
    when the file is read, with the name's reason."""
    path = write_tokens(
        tmp_path,
        {"token-question-0123456789": ("?", "user"), "token-lone-0123456789": ("\udc80", "user")},
    )
    assert "\\udc80" in path.read_text()  # as JSON writes it
    with pytest.raises(ValueError, match="lone surrogate"):
        TokenTable.load(path)
