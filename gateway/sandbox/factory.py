"""Make the gateway's sandbox backend: the one named by `--backend`, or for `auto` the first
that can run here; each found by entry point (`gateway.plugins`) and given only the
settings it reads.

`--backend NAME` loads that plug-in and asks it whether it can run here (`probe`): if not,
the gateway does not start, and says why. `--backend auto` tries every installed backend
that takes part in it, in the order of their `auto_preference` (forkserver, Docker, then
local), and
takes the first that can run; the log line says which and why ("backend local (no Docker
engine answers ...)"). A backend that does not isolate users from each other
(`isolates_users` false: local) serves a gateway with several users only when the operator
consents (`--allow-local-multi-user`), and `auto` never falls back to it for them.

A plug-in whose packages are missing says which extra installs them (`gateway.extras`),
whether its import failed or its own `extra` is incomplete.

A backend's configuration is a frozen dataclass (`config_type`) whose fields are named
after the settings they take (`gateway.config.config_from` fills it), as jupyter_client
hands a provisioner the config stanza of its kernel spec: the backend sees those values and
no other setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import EntryPoint
from typing import Any

from gateway.config import config_from
from gateway.extras import missing, providing
from gateway.plugins import backend_entry_points
from gateway.sandbox.base import BackendContext, SandboxBackend


class BackendMissing(Exception):
    """A backend cannot run here; the message says why (a clause: "no Docker engine ...")."""


def load(entry: EntryPoint) -> type[SandboxBackend]:
    """The backend class an entry point names; `BackendMissing` when it cannot be imported
    (its packages missing: saying which extra installs them) or is not a backend."""
    try:
        loaded = entry.load()
    except ImportError as exc:
        extra = providing(exc.name or "")
        absent = missing(extra) if extra is not None else None
        raise BackendMissing(
            absent or f"the {entry.name} backend cannot be imported ({exc})"
        ) from exc
    if not (isinstance(loaded, type) and issubclass(loaded, SandboxBackend)):
        raise BackendMissing(
            f"the entry point {entry.name} ({entry.value}) is not a sandbox backend"
        )
    return loaded


async def _ready(cls: type[SandboxBackend], settings: Mapping[str, Any]) -> tuple[Any, str]:
    """The backend's configuration and why it can run here; `BackendMissing` if it cannot (its
    extra incomplete, or its probe says no)."""
    if cls.extra is not None:
        absent = missing(cls.extra)
        if absent is not None:
            raise BackendMissing(absent)
    config = config_from(cls.config_type, settings)
    ok, why = await cls.probe(config)
    if not ok:
        raise BackendMissing(why)
    return config, why


async def make_backend(
    settings: Mapping[str, Any], context: BackendContext
) -> tuple[SandboxBackend, str]:
    """The backend the settings name (`backend`: a name, or "auto"), made but not started,
    and a sentence saying which and why. Raises RuntimeError when it cannot run here."""
    name = str(settings["backend"])
    installed = backend_entry_points()
    if not installed:
        raise RuntimeError(
            "No sandbox backend is installed (no gateway.backends entry points): reinstall "
            "the gateway (scripts/setup.sh, or pip install kernel-gateway[all])."
        )
    if name == "auto":
        return await _auto(installed, settings, context)
    if name not in installed:
        found = ", ".join(sorted(installed))
        raise RuntimeError(f"--backend {name}: no backend of that name is installed ({found})")
    try:
        cls = load(installed[name])
        config, _ = await _ready(cls, settings)
    except BackendMissing as exc:
        raise RuntimeError(f"--backend {name} was requested but {exc}") from None
    if context.multi_user and not cls.isolates_users and not settings["allow_local_multi_user"]:
        raise RuntimeError(
            f"The --tokens file names several users, and the {name} backend isolates "
            "users far less than Docker (README, 'What each backend isolates'). Use "
            "--backend docker, or acknowledge the weaker isolation with "
            "--allow-local-multi-user."
        )
    return cls(config, context), f"backend {name} (requested)"


async def _auto(
    installed: Mapping[str, EntryPoint], settings: Mapping[str, Any], context: BackendContext
) -> tuple[SandboxBackend, str]:
    """The first backend, in order of preference, that can run here."""
    candidates: list[tuple[int, str, type[SandboxBackend]]] = []
    skipped: list[str] = []  # why the ones before the chosen one cannot run here
    for name, entry in sorted(installed.items()):
        try:
            cls = load(entry)
        except BackendMissing as exc:  # its preference is unknown: it counts as one before
            skipped.append(str(exc))
            continue
        if cls.auto_preference is not None:
            candidates.append((cls.auto_preference, name, cls))
    for _, name, cls in sorted(candidates, key=lambda c: (c[0], c[1])):
        try:
            config, why = await _ready(cls, settings)
        except BackendMissing as exc:
            skipped.append(str(exc))
            continue
        if context.multi_user and not cls.isolates_users:
            reasons = "; ".join(skipped) or f"only the {name} backend can run here"
            raise RuntimeError(
                f"The --tokens file names several users, and {reasons}: refusing to fall "
                f"back to the {name} backend, which isolates users far less than Docker. "
                "Start a Docker engine and build the image (docker/build.sh), or, to "
                f"accept the {name} backend's weaker isolation, pass --backend {name} "
                "--allow-local-multi-user."
            )
        reason = "; ".join(skipped) or why or "auto"
        return cls(config, context), f"backend {name} ({reason})"
    raise RuntimeError(f"No sandbox backend can run here: {'; '.join(skipped)}.")
