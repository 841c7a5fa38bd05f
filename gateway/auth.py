"""Who is calling: bearer tokens from the operator's token file, compared in constant time."""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import json
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
