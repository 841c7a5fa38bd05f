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

from gateway.budget import CpuBudget

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
    """Raise ValueError when `user` cannot have a folder (its name would be too long), or is
    not text a store can keep (a lone surrogate, JSON's `"\\udc80"`: its every run was a 500)."""
    try:
        user.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"the user name {user[:40]!r} holds a lone surrogate, which is not text: "
            "give it a name of real characters"
        ) from None
    size = len(user_folder(user))  # ASCII
    if size > NAME_MAX:
        raise ValueError(
            f"the user name {user[:40]!r}... would need a workspace folder name of {size} "
            f"bytes (at most {NAME_MAX}): shorten it"
        )


MIN_TOKEN_LENGTH = 16


class TokenTable:
    """Token -> principal. Empty table means single-user mode (no auth, loopback only).
    A token's entry may also say what its user may spend: `cpu_seconds_per_hour`,
    `cpu_seconds_per_day`, `runs_per_minute` (every token of one user alike).

    The operator's metrics token (`--metrics-token-file`), if any, is no one's: it is kept
    apart from the principals, so it may read what `sees_gateway` allows and nothing
    else."""

    def __init__(
        self,
        entries: dict[str, Principal],
        metrics_token: str | None = None,
        budgets: dict[str, CpuBudget] | None = None,
    ) -> None:
        self._entries = [(token.encode(), principal) for token, principal in entries.items()]
        self._metrics = None if metrics_token is None else metrics_token.encode()
        # what a user may spend, where the file says (`cpu_seconds_per_hour`, ...)
        self.budgets = dict(budgets or {})

    @property
    def users(self) -> list[str]:
        """The users the file names (each once)."""
        return sorted({principal.user for _, principal in self._entries})

    @property
    def enabled(self) -> bool:
        return bool(self._entries)

    @property
    def multi_user(self) -> bool:
        """More than one user: tenants who must be kept apart from each other."""
        return len({principal.user for _, principal in self._entries}) > 1

    @classmethod
    def load(cls, path: Path | None, metrics_path: Path | None = None) -> TokenTable:
        """The token file's table (`path`), with the metrics token read from
        `metrics_path` (a file that holds only the token)."""
        metrics = None if metrics_path is None else read_metrics_token(metrics_path)
        if path is None:
            return cls({}, metrics)
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not data:
            raise ValueError(f"{path}: expected a non-empty object of tokens")
        entries: dict[str, Principal] = {}
        budgets: dict[str, CpuBudget] = {}
        for token, spec in data.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("user"), str):
                raise ValueError(f"{path}: each token needs {{'user': ..., 'role': ...}}")
            role = spec.get("role", "user")
            if role not in ("user", "admin"):
                raise ValueError(f"{path}: role must be 'user' or 'admin', not {role!r}")
            if len(token) < MIN_TOKEN_LENGTH:
                raise ValueError(f"{path}: tokens must be at least {MIN_TOKEN_LENGTH} characters")
            try:
                check_user_name(spec["user"])
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from None
            entries[token] = Principal(user=spec["user"], role=role)
            budget = _budget(path, spec)
            if budget.limited and budgets.setdefault(spec["user"], budget) != budget:
                raise ValueError(
                    f"{path}: the tokens of {spec['user']!r} give it different budgets"
                )
        if metrics is not None and metrics in entries:
            raise ValueError(
                f"{metrics_path}: the metrics token is also a token of {path}: give the "
                "metrics scraper a token of its own"
            )
        return cls(entries, metrics, budgets)

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

    def sees_gateway(self, token: str | None) -> bool:
        """Whether the caller may see every tenant's activity (`/metrics`, the details of
        `/v1/health`): anyone on a single-user gateway; with tokens, an admin's token or
        the operator's metrics token, never a user's."""
        if not self.enabled:
            return True
        if not token:
            return False
        principal = self.authenticate(token)  # both compared, whichever it is
        scraper = self._metrics is not None and hmac.compare_digest(token.encode(), self._metrics)
        return scraper or (principal is not None and principal.is_admin)


BUDGET_KEYS = ("cpu_seconds_per_hour", "cpu_seconds_per_day", "runs_per_minute")
MAX_BUDGET = 1e9  # past it a budget is no budget (and its milliseconds stay integers)


def _budget(path: Path, spec: dict[str, object]) -> CpuBudget:
    """A token's `cpu_seconds_per_hour`, `cpu_seconds_per_day`, `runs_per_minute`."""
    values: dict[str, float | int | None] = {}
    for key in BUDGET_KEYS:
        value = spec.get(key)
        if value is None:
            values[key] = None
            continue
        whole = key == "runs_per_minute"
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or (whole and not isinstance(value, int))
            or not 0 < value <= MAX_BUDGET
            or value != value
            or value == float("inf")
        ):
            kind = "a whole number" if whole else "a number"
            raise ValueError(
                f"{path}: {key} must be {kind} above 0 and at most {MAX_BUDGET:g}, not {value!r}"
            )
        values[key] = value
    return CpuBudget(
        cpu_seconds_per_hour=_float(values["cpu_seconds_per_hour"]),
        cpu_seconds_per_day=_float(values["cpu_seconds_per_day"]),
        runs_per_minute=None
        if values["runs_per_minute"] is None
        else int(values["runs_per_minute"]),
    )


def _float(value: float | int | None) -> float | None:
    return None if value is None else float(value)


def read_metrics_token(path: Path) -> str:
    """The token a metrics file holds (surrounding white space left out)."""
    token = path.read_text(encoding="utf-8").strip()
    if len(token) < MIN_TOKEN_LENGTH or any(c.isspace() for c in token):
        raise ValueError(
            f"{path}: expected one token of at least {MIN_TOKEN_LENGTH} characters, without "
            "white space"
        )
    return token


def is_loopback_host(host: str) -> bool:
    """Whether `host` (a name, an address, or a Host header's `host:port`) is loopback."""
    name = urllib.parse.urlsplit("//" + host).hostname or host
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False
