"""Turn a decoded JSON body into a `RunRequest`, or raise the API's 400/403/413 errors.

Every rule of API.md's request table lives here, so that the HTTP handler, the WebSocket
and the tool adapters validate the same way.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.errors import (
    ConflictingFields,
    Forbidden,
    InvalidPath,
    InvalidRequest,
    PayloadTooLarge,
    UnsupportedLanguage,
)
from gateway.models.common import LANGUAGES, Language
from gateway.runs.models import RunRequest, StagedFile
from gateway.sandbox.workspace import WorkspaceRef, split_below, user_folder
from gateway.settings import Settings

RUN_FIELDS = frozenset(
    {
        "code",
        "language",
        "timeout",
        "files",
        "entrypoint",
        "archive",
        "vars",
        "env",
        "return_files",
        "background",
        "network",
        "working_dir",
    }
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def check_relative_path(path: Any, field: str) -> str:
    """A path staged into or named inside the working folder: relative, no `..`, no NUL."""
    if not isinstance(path, str) or not path:
        raise InvalidPath("A path must be a non-empty string.", field=field)
    if "\x00" in path:
        raise InvalidPath(f"The path {path!r} contains a NUL byte.", field=field)
    if path.startswith("/") or path.startswith("\\"):
        raise InvalidPath(f"The path {path!r} must be relative, not absolute.", field=field)
    parts = PurePosixPath(path).parts
    if ".." in parts or "\\" in path:
        raise InvalidPath(f"The path {path!r} must stay inside the working folder.", field=field)
    if not parts or parts == (".",):
        raise InvalidPath(f"The path {path!r} names no file.", field=field)
    return str(PurePosixPath(*parts))


def parse_timeout(
    value: Any, settings: Settings, notes: list[str], field: str = "timeout"
) -> float:
    if value is None:
        return min(settings.default_timeout, settings.max_timeout)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequest(f"`{field}` must be a number of seconds.", field=field)
    clamped = min(max(float(value), 1.0), settings.max_timeout)
    if clamped != value:
        notes.append(f"The {field} {value:g} s was clamped to {clamped:g} s.")
    return clamped


def parse_language(value: Any) -> Language:
    if value is None:
        return "python"
    for language in LANGUAGES:
        if value == language:
            return language
    raise UnsupportedLanguage(
        f"The language {value!r} is not supported; use one of: {', '.join(LANGUAGES)}.",
        field="language",
    )


def parse_files(value: Any, settings: Settings) -> tuple[StagedFile, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise InvalidRequest("`files` must be a list of {path, content}.", field="files")
    if len(value) > settings.max_files:
        raise PayloadTooLarge(
            f"{len(value)} files given; at most {settings.max_files} are allowed.", field="files"
        )
    staged: list[StagedFile] = []
    total = 0
    seen: set[str] = set()
    for index, item in enumerate(value):
        field = f"files[{index}]"
        if not isinstance(item, Mapping):
            raise InvalidRequest("Each file must be an object {path, content}.", field=field)
        path = check_relative_path(item.get("path"), f"{field}.path")
        content = item.get("content", "")
        if not isinstance(content, str):
            raise InvalidRequest("`content` must be a string.", field=f"{field}.content")
        encoding = item.get("encoding", "utf-8")
        if encoding == "utf-8":
            data = content.encode("utf-8", "surrogatepass")
        elif encoding == "base64":
            try:
                data = base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidRequest(
                    f"The content of {path!r} is not valid base64.", field=f"{field}.content"
                ) from exc
        else:
            raise InvalidRequest(
                "`encoding` must be 'utf-8' or 'base64'.", field=f"{field}.encoding"
            )
        if len(data) > settings.max_file_bytes:
            raise PayloadTooLarge(
                f"The file {path!r} has {len(data)} bytes; at most "
                f"{settings.max_file_bytes} are allowed per file.",
                field=field,
            )
        total += len(data)
        if total > settings.max_files_bytes:
            raise PayloadTooLarge(
                f"The files add up to more than {settings.max_files_bytes} bytes.", field="files"
            )
        if path in seen:
            raise InvalidRequest(f"The path {path!r} is given twice.", field=field)
        seen.add(path)
        staged.append(StagedFile(path=path, data=data))
    _check_no_file_under_file(staged)
    return tuple(staged)


def _check_no_file_under_file(files: list[StagedFile]) -> None:
    paths = {f.path for f in files}
    for f in files:
        for parent in PurePosixPath(f.path).parents:
            if str(parent) in paths:
                raise InvalidPath(
                    f"{parent} is both a file and the folder of {f.path}.", field="files"
                )


def parse_return_files(value: Any, settings: Settings) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise InvalidRequest(
            "`return_files` must be a list of non-empty strings.", field="return_files"
        )
    if len(value) > settings.max_return_files:
        raise PayloadTooLarge(
            f"At most {settings.max_return_files} return_files are allowed.",
            field="return_files",
        )
    for index, path in enumerate(value):
        if "\x00" in path:
            raise InvalidPath(
                "A return_files path contains a NUL byte.", field=f"return_files[{index}]"
            )
    return tuple(value)


def parse_network(value: Any, settings: Settings) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest("`network` must be true or false.", field="network")
    if value and not settings.allow_network:
        raise Forbidden("Network access is not enabled on this gateway.", field="network")
    return value


def parse_env(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest("`env` must be an object of strings.", field="env")
    env: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(item, str) or not _ENV_NAME.match(key):
            raise InvalidRequest(
                f"`env` needs valid variable names and string values; {key!r} is not.",
                field="env",
            )
        if "\x00" in item:
            raise InvalidRequest(f"The value of {key!r} contains a NUL byte.", field="env")
        env[key] = item
    return env


def parse_vars(value: Any, language: Language) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidRequest("`vars` must be an object.", field="vars")
    if language == "bash":
        for key, item in value.items():
            if not _ENV_NAME.match(key):
                raise InvalidRequest(f"{key!r} is not a valid bash variable name.", field="vars")
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise InvalidRequest(
                    f"The bash variable {key!r} must be a string or a number.", field="vars"
                )
            if isinstance(item, str) and "\x00" in item:
                raise InvalidRequest(f"The value of {key!r} contains a NUL byte.", field="vars")
    return dict(value)


def resolve_working_dir(
    value: Any, settings: Settings, user: str, role: str, notes: list[str]
) -> WorkspaceRef | None:
    """The persistent workspace `working_dir` names, checked lexically: nothing on disk is
    touched here (the folder is opened when the run's sandbox is created, see
    `gateway.sandbox.workspace`)."""
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\x00" in value:
        raise InvalidPath("`working_dir` must be a non-empty path.", field="working_dir")
    if settings.workspaces is None:
        raise Forbidden(
            "Persistent workspaces are not enabled on this gateway (--workspaces).",
            field="working_dir",
        )
    root = settings.workspaces
    mine = user_folder(user)
    if role == "admin" and value.startswith("/"):
        for allowed in [*(Path(d) for d in settings.admin_dirs), root]:
            parts = split_below(allowed, value)
            if parts is not None:
                return WorkspaceRef(allowed, parts)
        raise Forbidden(f"{value} is not among the folders an admin may use.", field="working_dir")
    parts = split_below(root / mine, value)
    if parts is None and value.startswith("/"):
        notes.append(f"working_dir {value} is outside your workspace; {root / mine} was used.")
        parts = ()
    elif parts is None:
        raise InvalidPath("`working_dir` must stay inside your workspace.", field="working_dir")
    return WorkspaceRef(root, (mine, *parts))


def parse_run_request(
    body: Any, settings: Settings, *, user: str = "anonymous", role: str = "admin"
) -> RunRequest:
    """Validate a `POST /v1/runs` body (already JSON-decoded)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("The request body must be a JSON object.")
    unknown = sorted(set(body) - RUN_FIELDS - {"type", "ref"})
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(unknown)}.", field=unknown[0])
    notes: list[str] = []
    language = parse_language(body.get("language"))
    code = body.get("code")
    entrypoint = body.get("entrypoint")
    if code is not None and entrypoint is not None:
        raise ConflictingFields("Give either `code` or `entrypoint`, not both.", field="entrypoint")
    if code is None and entrypoint is None:
        raise InvalidRequest("`code` (or `entrypoint`) is required.", field="code")
    if code is not None:
        if not isinstance(code, str):
            raise InvalidRequest("`code` must be a string.", field="code")
        if len(code.encode("utf-8", "surrogatepass")) > settings.max_code_bytes:
            raise PayloadTooLarge(
                f"`code` is larger than {settings.max_code_bytes} bytes.", field="code"
            )
    files = parse_files(body.get("files"), settings)
    archive = body.get("archive")
    if archive is not None:
        if not isinstance(archive, str) or not archive:
            raise InvalidRequest("`archive` must be an upload id.", field="archive")
        if not settings.allow_uploads:
            raise Forbidden(
                "Archives are disabled on this gateway.",
                field="archive",
                code="archive_mode_disabled",
            )
    if entrypoint is not None:
        entrypoint = check_relative_path(entrypoint, "entrypoint")
        if archive is None and entrypoint not in {f.path for f in files}:
            raise InvalidRequest(
                f"The entrypoint {entrypoint!r} is not among `files`.", field="entrypoint"
            )
    network = parse_network(body.get("network"), settings)
    background = body.get("background", False)
    if not isinstance(background, bool):
        raise InvalidRequest("`background` must be true or false.", field="background")
    return RunRequest(
        language=language,
        code=code,
        entrypoint=entrypoint,
        timeout=parse_timeout(body.get("timeout"), settings, notes),
        files=files,
        archive=archive,
        vars=parse_vars(body.get("vars"), language),
        env=parse_env(body.get("env")),
        return_files=parse_return_files(body.get("return_files"), settings),
        background=background,
        network=network,
        working_dir=resolve_working_dir(body.get("working_dir"), settings, user, role, notes),
        user=user,
        notes=tuple(notes),
    )
