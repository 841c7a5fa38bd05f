"""The operator's policy, applied to a parsed body: a `RunRequest` or a `NotebookRequest`.

`gateway.models` checks a body's own shape; what depends on the settings (the
`RequestPolicy`: `gateway.runs.config`) or on the caller is decided here, after parsing:
sizes (413), clamping the timeout (with a note), network and archives (403 unless
enabled), and where a persistent `working_dir` may point (by the caller's role). Nothing on
disk is touched: a workspace is opened when its sandbox is created
(`gateway.sandbox.workspace`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any

from gateway.auth import Principal, is_user_folder, user_folder
from gateway.errors import Forbidden, InvalidPath, InvalidRequest, PayloadTooLarge
from gateway.models.notebook import (
    NotebookBody,
    cell_source,
    cleared,
    is_code,
    notebook_language,
    read_notebook,
)
from gateway.models.request import NotebookRequest, RunRequest, StagedFile, WorkspaceRef
from gateway.models.run import FileBody, RunBody, check_vars
from gateway.runs.config import RequestPolicy
from gateway.sandbox.workspace import split_below


def run_request(body: RunBody, policy: RequestPolicy, caller: Principal) -> RunRequest:
    """A `POST /v1/runs` body (or a WebSocket `run`) under this gateway's policy."""
    notes: list[str] = []
    if body.code is not None:
        _check_code_size(len(body.code.encode("utf-8", "surrogatepass")), policy, "code")
    files = staged_files(body.files, policy)
    if body.archive is not None and not policy.allow_uploads:
        raise Forbidden(
            "Archives are disabled on this gateway.", field="archive", code="archive_mode_disabled"
        )
    named = body.entrypoint
    elsewhere = body.archive is not None or body.files_from is not None
    if named is not None and not elsewhere and named not in {f.path for f in files}:
        raise InvalidRequest(f"The entrypoint {named!r} is not among `files`.", field="entrypoint")
    return RunRequest(
        language=body.language,
        code=body.code,
        entrypoint=body.entrypoint,
        timeout=clamped_timeout(body.timeout, policy, notes),
        files=files,
        archive=body.archive,
        vars=dict(body.vars or {}),
        env=dict(body.env or {}),
        return_files=returned_files(body.return_files, policy),
        background=bool(body.background),
        network=network(body.network, policy),
        working_dir=workspace(body.working_dir, policy, caller, notes),
        user=caller.user,
        notes=tuple(notes),
        keep=bool(body.keep),
        continue_from=body.from_,
        rebuild=bool(body.rebuild),
        keep_files=bool(body.keep_files),
        files_from=body.files_from,
    )


def notebook_request(
    body: NotebookBody, policy: RequestPolicy, caller: Principal
) -> NotebookRequest:
    """A `POST /v1/notebooks/run` body under this gateway's policy (CPU work: nbformat
    validates the notebook; call it in a thread)."""
    notes: list[str] = []
    notebook = read_notebook(body.notebook, notes, policy.json_limits(notebook=True))
    language = notebook_language(notebook["metadata"])
    code_bytes = sum(
        len(cell_source(c).encode("utf-8", "surrogatepass"))
        for c in notebook["cells"]
        if is_code(c)
    )
    _check_code_size(code_bytes, policy, "notebook")
    check_vars(body.vars or {}, language)
    timeout = clamped_timeout(body.timeout, policy, notes)
    cell_timeout = (
        timeout
        if body.cell_timeout is None
        else clamped_timeout(body.cell_timeout, policy, notes, field="cell_timeout")
    )
    return NotebookRequest(
        notebook=cleared(notebook, language),
        language=language,
        timeout=timeout,
        cell_timeout=cell_timeout,
        allow_errors=body.allow_errors,
        files=staged_files(body.files, policy),
        return_files=returned_files(body.return_files, policy),
        vars=dict(body.vars or {}),
        env=dict(body.env or {}),
        network=network(body.network, policy),
        user=caller.user,
        notes=tuple(notes),
        keep=bool(body.keep),
        keep_cells=body.keep == "cells",
        continue_from=body.from_,
        rebuild=bool(body.rebuild),
        keep_files=bool(body.keep_files),
        files_from=body.files_from,
        name=body.name,
    )


# --- one rule each ------------------------------------------------------------------------


def _check_code_size(size: int, policy: RequestPolicy, field: str) -> None:
    if size > policy.max_code_bytes:
        what = "`code` is" if field == "code" else "The notebook's cells hold"
        raise PayloadTooLarge(f"{what} more than {policy.max_code_bytes} bytes.", field=field)


def clamped_timeout(
    value: float | None, policy: RequestPolicy, notes: list[str], field: str = "timeout"
) -> float:
    """The timeout within [1, max_timeout] (a note says when it was clamped)."""
    if value is None:
        return min(policy.default_timeout, policy.max_timeout)
    clamped = min(max(float(value), 1.0), policy.max_timeout)
    if clamped != value:
        notes.append(f"The {field} {value:g} s was clamped to {clamped:g} s.")
    return clamped


def staged_files(files: list[FileBody] | None, policy: RequestPolicy) -> tuple[StagedFile, ...]:
    """The files to write before the run: within the count and size limits, each path once,
    and no file where another needs a folder."""
    files = files or []
    if len(files) > policy.max_files:
        raise PayloadTooLarge(
            f"{len(files)} files given; at most {policy.max_files} are allowed.", field="files"
        )
    staged: list[StagedFile] = []
    total = 0
    for index, file in enumerate(files):
        field = f"files[{index}]"
        data = file.data
        if len(data) > policy.max_file_bytes:
            raise PayloadTooLarge(
                f"The file {file.path!r} has {len(data)} bytes; at most "
                f"{policy.max_file_bytes} are allowed per file.",
                field=field,
            )
        total += len(data)
        if total > policy.max_files_bytes:
            raise PayloadTooLarge(
                f"The files add up to more than {policy.max_files_bytes} bytes.", field="files"
            )
        if any(s.path == file.path for s in staged):
            raise InvalidRequest(f"The path {file.path!r} is given twice.", field=field)
        staged.append(StagedFile(path=file.path, data=data))
    paths = {f.path for f in staged}
    for path in (f.path for f in staged):
        for parent in PurePosixPath(path).parents:
            if str(parent) in paths:
                raise InvalidPath(
                    f"{parent} is both a file and the folder of {path}.", field="files"
                )
    return tuple(staged)


def returned_files(patterns: list[str] | None, policy: RequestPolicy) -> tuple[str, ...]:
    if patterns and len(patterns) > policy.max_return_files:
        raise PayloadTooLarge(
            f"At most {policy.max_return_files} return_files are allowed.",
            field="return_files",
        )
    return tuple(patterns or ())


def network(wanted: bool | None, policy: RequestPolicy) -> bool:
    if wanted and not policy.allow_network:
        raise Forbidden("Network access is not enabled on this gateway.", field="network")
    return bool(wanted)


def workspace(
    value: str | None, policy: RequestPolicy, caller: Principal, notes: list[str]
) -> WorkspaceRef | None:
    """The persistent workspace `working_dir` names, checked lexically: a user's own folder
    under the workspaces root; an admin may also name an absolute folder the operator
    allowed."""
    if value is None:
        return None
    if policy.workspaces is None:
        raise Forbidden(
            "Persistent workspaces are not enabled on this gateway (--workspaces).",
            field="working_dir",
        )
    root = policy.workspaces
    mine = user_folder(caller.user)
    if caller.is_admin and value.startswith("/"):
        parts = split_below(root, value)  # first: an admin folder may hold the root
        if parts is not None:
            if not parts or not is_user_folder(parts[0]):
                # the root holds every user's folder (each with its owner's quota and
                # uid) and the gateway's images: a run goes into one user's folder
                raise Forbidden(
                    f"{value} is not inside a user's workspace: name a folder below {root}/<user>.",
                    field="working_dir",
                )
            return WorkspaceRef(root, parts)
        for allowed in (Path(d) for d in policy.admin_dirs):
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


def parse_run_request(data: Any, policy: RequestPolicy, caller: Principal) -> RunRequest:
    """Decoded JSON of a `POST /v1/runs` body, parsed and put under the policy. A body that
    is a WebSocket `run` message is accepted as it is: its `type` and `ref` are ignored."""
    if isinstance(data, Mapping):
        data = {k: v for k, v in data.items() if k not in ("type", "ref")}
    return run_request(RunBody.parse(data), policy, caller)


def parse_notebook_request(data: Any, policy: RequestPolicy, caller: Principal) -> NotebookRequest:
    return notebook_request(NotebookBody.read(data), policy, caller)
