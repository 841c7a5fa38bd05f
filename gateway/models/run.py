"""`POST /v1/runs` (and a WebSocket `run`): the body as the API defines it.

Only the body's own shape is checked here: types, paths, encodings, names, and which
fields go together. What depends on the operator's settings or on the caller (sizes,
clamping the timeout, network, workspaces, archives) is applied after parsing, by
`gateway.runs.requests`.
"""

from __future__ import annotations

import base64
import binascii
import re
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
)
from pydantic import model_validator as model_check

from gateway.errors import ConflictingFields, InvalidPath, InvalidRequest
from gateway.models.base import Body, checked, refuse
from gateway.models.common import Language

ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def relative_path(path: str) -> str:
    """A path inside the working folder: relative, no `..`, no NUL; normalised."""
    if not path:
        raise refuse("invalid_path", "A path must be a non-empty string.")
    if "\x00" in path:
        raise refuse("invalid_path", f"The path {path!r} contains a NUL byte.")
    if path.startswith(("/", "\\")):
        raise refuse("invalid_path", f"The path {path!r} must be relative, not absolute.")
    parts = PurePosixPath(path).parts
    if ".." in parts or "\\" in path:
        raise refuse("invalid_path", f"The path {path!r} must stay inside the working folder.")
    if not parts or parts == (".",):
        raise refuse("invalid_path", f"The path {path!r} names no file.")
    return str(PurePosixPath(*parts))


def non_empty_path(path: str, empty: str, nul: str) -> str:
    """`path`, when it is not empty (else `invalid_request`, saying `empty`) and holds no NUL
    (else `invalid_path`, saying `nul`)."""
    if not path:
        raise refuse("invalid_request", empty)
    if "\x00" in path:
        raise refuse("invalid_path", nul)
    return path


def return_pattern(pattern: str) -> str:
    return non_empty_path(
        pattern,
        "A `return_files` entry must be a non-empty string.",
        "A return_files path contains a NUL byte.",
    )


def folder_path(path: str) -> str:
    """`working_dir`: any non-empty path without NUL (where it may point is policy)."""
    if not path or "\x00" in path:
        raise refuse("invalid_path", "`working_dir` must be a non-empty path.")
    return path


RelativePath = Annotated[str, AfterValidator(relative_path)]
FolderPath = Annotated[str, AfterValidator(folder_path)]
# a snapshot's id, as `POST /v1/runs` with `keep` answers it (`gateway.runs.snapshots`)
SNAPSHOT_ID = re.compile(r"snap_[A-Za-z0-9_-]{16,64}")


def snapshot_id(value: str) -> str:
    if not SNAPSHOT_ID.fullmatch(value):
        raise InvalidRequest(f"{value[:80]!r} is not a snapshot id.", field="from")
    return value


SnapshotId = Annotated[str, AfterValidator(snapshot_id)]
RUN_ID = re.compile(r"run_[0-9a-f]{1,64}")


def run_id(value: str) -> str:
    if not RUN_ID.fullmatch(value):
        raise InvalidRequest(f"{value[:80]!r} is not a run id.", field="files_from")
    return value


RunId = Annotated[str, AfterValidator(run_id)]
KEEP_FILES = (
    "keep the files this request stages (`files`, and those of `files_from`) with the "
    "caller's uploads, within their upload quota (`max_uploads_per_user`, "
    "`max_upload_store_bytes_per_user`; past it the oldest go) for `upload_ttl` (24 h), so "
    "that a later run can stage them again with `files_from`; the record's `files_given` "
    "says whether they were kept"
)
FILES_FROM = (
    "stage the files an earlier run of the caller was given and kept (`keep_files`), as "
    "they were; entries of `files` replace those of the same path. A run that is not the "
    "caller's: 404; one whose files were not kept, or went (past the quota, or expired): "
    "410 files_gone (add them again)"
)


def checked_path(value: Any, field: str) -> str:
    """`relative_path` for a value outside a model (a tool's argument, an archive entry)."""
    if not isinstance(value, str):
        raise InvalidPath("A path must be a non-empty string.", field=field)
    return checked(relative_path, value, field)


ReturnPattern = Annotated[str, AfterValidator(return_pattern)]


def environment(env: dict[str, Any]) -> dict[str, Any]:
    for key, value in env.items():
        if not isinstance(value, str) or not ENV_NAME.match(key):
            raise refuse(
                "invalid_request",
                f"`env` needs valid variable names and string values; {key!r} is not.",
            )
        if "\x00" in value:
            raise refuse("invalid_request", f"The value of {key!r} contains a NUL byte.")
    return env


def check_vars(vars: dict[str, Any], language: Language) -> None:
    """Bash gets `vars` as shell variables: names and values must be ones a shell takes."""
    if language != "bash":
        return
    for key, item in vars.items():
        if not ENV_NAME.match(key):
            raise InvalidRequest(f"{key!r} is not a valid bash variable name.", field="vars")
        if isinstance(item, bool) or not isinstance(item, str | int | float):
            raise InvalidRequest(
                f"The bash variable {key!r} must be a string or a number.", field="vars"
            )
        if isinstance(item, str) and "\x00" in item:
            raise InvalidRequest(f"The value of {key!r} contains a NUL byte.", field="vars")


Environment = Annotated[dict[str, Any], AfterValidator(environment)]


class FileBody(Body):
    """A file written into the working folder before the run; folders are created. Other
    keys are ignored."""

    model_config = ConfigDict(extra="ignore")

    path: RelativePath = Field(
        json_schema_extra={"minLength": 1},
        description="relative; no `..`, no leading `/`, no NUL (else 400 invalid_path)",
    )
    encoding: Literal["utf-8", "base64"] = "utf-8"
    content: str = ""
    _data: bytes = PrivateAttr(b"")

    @field_validator("content")
    @classmethod
    def _decodes(cls, content: str, info: ValidationInfo) -> str:
        if info.data.get("encoding") == "base64":
            try:
                base64.b64decode(content, validate=True)
            except (binascii.Error, ValueError):
                raise refuse("invalid_request", "`content` is not valid base64.") from None
        return content

    @property
    def data(self) -> bytes:
        """The file's bytes (decoded)."""
        if not self._data and self.content:
            if self.encoding == "base64":
                self._data = base64.b64decode(self.content, validate=True)
            else:
                self._data = self.content.encode("utf-8", "surrogatepass")
        return self._data


class RunBody(Body):
    """Exactly one of `code` and `entrypoint` is required (both: 400 conflicting_fields;
    neither: 400 invalid_request, field `code`). Unknown fields are refused: 400
    invalid_request with `field` naming the first unknown one. An explicit `null` is the
    same as leaving a field out."""

    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [{"required": ["code"]}, {"required": ["entrypoint"]}],
            "example": {
                "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
                "timeout": 20,
            },
        }
    )

    code: str | None = Field(
        None, description="the source to run; at most `max_code_bytes` (default 1 MiB): 413"
    )
    language: Language = Field(
        "python",
        description="anything else: 400 unsupported_language, listing the supported ones",
    )
    timeout: float | None = Field(
        None,
        description=(
            "Wall-clock limit in seconds (default 30). Clamped to [1, `max_timeout`] (default "
            "300); a clamp is reported in `notes`. A non-number (or NaN/Infinity) is 400. The "
            "deadline counts from when the code is sent to the kernel: starting the sandbox "
            "and kernel is bounded separately by the operator's `kernel_start_timeout` "
            "(default 60 s; past it, 503 sandbox_unavailable). At the deadline the kernel is "
            "interrupted, gets a short grace period to flush, then every process of the "
            "sandbox is killed."
        ),
    )
    files: list[FileBody] | None = Field(
        None,
        description=(
            "Written into the working folder before the run (after `archive`). A path given "
            "twice: 400. Over the operator's count (default 1000), per-file (10 MiB decoded) "
            "or total (32 MiB) limits: 413."
        ),
    )
    entrypoint: RelativePath | None = Field(
        None,
        json_schema_extra={"minLength": 1},
        description=(
            "a path among `files` (or inside the archive) to run instead of `code`: Python "
            "runs it as `__main__` (`%run -i`), bash with `bash`, JavaScript/TypeScript "
            "import it as a module"
        ),
    )
    archive: str | None = Field(
        None,
        min_length=1,
        description=(
            "an id from POST /v1/uploads, unpacked into the working folder before `files`; "
            "403 archive_mode_disabled unless the operator enabled uploads; an unknown or "
            "expired id (or another user's upload) is 404 not_found"
        ),
    )
    vars: dict[str, Any] | None = Field(
        None,
        description=(
            "Python, JavaScript, TypeScript: each key that is a valid identifier and not "
            "`input`, `result` or `output` becomes a global; every key is in the global "
            "`input`. Bash: values must be strings or numbers and keys valid variable names "
            "(else 400); they become environment variables."
        ),
    )
    env: Environment | None = Field(
        None,
        description="extra environment variables for the kernel (no NUL in values)",
        json_schema_extra={
            "propertyNames": {"pattern": ENV_NAME.pattern},
            "additionalProperties": {"type": "string"},
        },
    )
    return_files: list[ReturnPattern] | None = Field(
        None,
        description=(
            "paths or glob patterns (`*`, `?`, `[...]`, `**`) relative to the working folder, "
            "read back after the run, also after a timeout; at most `max_return_files` "
            "(default 100; more: 413); each file up to 1 MiB, 8 MiB in all (operator's)"
        ),
    )
    background: bool | None = Field(
        None, description="answer 202 `{id, status}` at once; poll GET /v1/runs/{id}"
    )
    network: bool | None = Field(
        None, description="outbound network; 403 forbidden unless the operator enabled it"
    )
    keep: bool | None = Field(
        None,
        description=(
            "keep the kernel's final state as a snapshot (the record's `snapshot`), for later "
            "runs to start from with `from`; Python and bash on the forkserver backend (else 400 "
            "snapshot_unsupported); not with `network` or `working_dir` (400)"
        ),
    )
    from_: SnapshotId | None = Field(
        None,
        alias="from",
        description=(
            "start from a snapshot (an id from a record's `snapshot`): a fresh sandbox whose "
            "kernel holds the snapshot's variables, imports and working-folder files; the "
            "snapshot itself is unchanged. Another user's or an unknown id: 404; one that "
            "expired, was evicted or deleted, or whose gateway stopped: 410 snapshot_gone; "
            "one held by another replica: 409 snapshot_elsewhere naming its `instance`"
        ),
    )
    rebuild: bool | None = Field(
        None,
        description=(
            "with `from`: where the snapshot is gone or elsewhere (or cannot be forked on "
            "this backend or language), replay the code of its chain (every run from the "
            "first) in a fresh kernel instead, and mark the record `continued_by: "
            '"replay"`; its files are not replayed. Without it such a run is refused'
        ),
    )
    keep_files: bool | None = Field(None, description=KEEP_FILES)
    files_from: RunId | None = Field(None, description=FILES_FROM)
    working_dir: FolderPath | None = Field(
        None,
        json_schema_extra={"minLength": 1},
        description=(
            "Run inside the caller's persistent workspace (mounted read-write; files written "
            "there stay). A non-admin caller is confined to `<workspaces>/<user>/`: a "
            "relative path resolves inside it (leaving it: 400 invalid_path), an absolute "
            "path outside it is replaced by that root and a note says so. An admin may name "
            "any folder the operator allows (else 403). 403 when the operator configured no "
            "workspaces."
        ),
    )

    @model_check(mode="after")
    def _code_or_entrypoint(self) -> RunBody:
        if self.code is not None and self.entrypoint is not None:
            raise ConflictingFields(
                "Give either `code` or `entrypoint`, not both.", field="entrypoint"
            )
        if self.code is None and self.entrypoint is None:
            raise InvalidRequest("`code` (or `entrypoint`) is required.", field="code")
        check_vars(self.vars or {}, self.language)
        if self.rebuild and self.from_ is None:
            raise InvalidRequest("`rebuild` needs `from`.", field="rebuild")
        if self.archive is not None and self.files_from is not None:
            raise ConflictingFields(
                "Give either `archive` or `files_from`, not both.", field="files_from"
            )
        if (self.keep or self.from_ is not None) and (self.network or self.working_dir):
            raise ConflictingFields(
                "A kept or continued run has a working folder of its own and no network.",
                field="network" if self.network else "working_dir",
            )
        return self
