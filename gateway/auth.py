"""Who is calling: bearer tokens from the operator's token file, compared in constant time."""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
import re
import urllib.parse
from pathlib import Path
from typing import Literal

Role = Literal["user", "admin"]


@dataclasses.dataclass(frozen=True)
class Principal:
    user: str
    role: Role

    @property
    def is_admin(self) -> bool:
        return self.role == "admin"


SINGLE_USER = Principal(user="local", role="admin")

_KEPT_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9_.-]*")
NAME_MAX = 255  # bytes in one file name (Linux)


def user_folder(user: str) -> str:
    """The name of a user's folder under the workspaces root, one per user name.

    A name of `[A-Za-z0-9_-][A-Za-z0-9_.-]*` is its own folder (so folders made before
    kept their names); any other becomes `~` and the hex of its UTF-8 bytes, which no
    kept name can be (none starts with `~`). Different names never share a folder, and
    no user's folder starts with `.` (the workspaces root's `.images` is the gateway's).
    """
    if _KEPT_NAME.fullmatch(user):
        return user
    return "~" + user.encode("utf-8", "surrogatepass").hex()


def is_user_folder(name: str) -> bool:
    """Whether `name` is what `user_folder` makes of some user name."""
    if not name.startswith("~"):
        return _KEPT_NAME.fullmatch(name) is not None
    try:
        user = bytes.fromhex(name[1:]).decode("utf-8", "surrogatepass")
    except ValueError:
        return False
    return user_folder(user) == name


def check_user_name(user: str) -> None:
    """Raise ValueError when `user` cannot have a folder (its name would be too long)."""
    size = len(user_folder(user))  # ASCII
    if size > NAME_MAX:
        raise ValueError(
            f"the user name {user[:40]!r}... would need a workspace folder name of {size} "
            f"bytes (at most {NAME_MAX}): shorten it"
        )


class TokenTable:
    """Token -> principal. Empty table means single-user mode (no auth, loopback only)."""

    def __init__(self, entries: dict[str, Principal]) -> None:
        self._entries = [(token.encode(), principal) for token, principal in entries.items()]

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def multi_user(self) -> bool:
        """More than one user: tenants who must be kept apart from each other."""
        return len({principal.user for _, principal in self._entries}) > 1

    @classmethod
    def load(cls, path: Path | None) -> TokenTable:
        if path is None:
            return cls({})
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not data:
            raise ValueError(f"{path}: expected a non-empty object of tokens")
        entries: dict[str, Principal] = {}
        for token, spec in data.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("user"), str):
                raise ValueError(f"{path}: each token needs {{'user': ..., 'role': ...}}")
            role = spec.get("role", "user")
            if role not in ("user", "admin"):
                raise ValueError(f"{path}: role must be 'user' or 'admin', not {role!r}")
            if len(token) < 16:
                raise ValueError(f"{path}: tokens must be at least 16 characters")
            try:
                check_user_name(spec["user"])
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
            entries[token] = Principal(user=spec["user"], role=role)
        return cls(entries)

    def authenticate(self, token: str | None) -> Principal | None:
        if not self.enabled:
            return SINGLE_USER
        if not token:
            return None
        candidate = token.encode()
        found: Principal | None = None
        for known, principal in self._entries:  # compare with every token: no early exit
            if hmac.compare_digest(candidate, known):
                found = principal
        return found


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name, an address, or a Host header's `host:port`) is loopback."""
    name = urllib.parse.urlsplit("//" + host).hostname or host
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
