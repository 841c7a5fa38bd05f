"""`POST /v1/notebooks/run`: the body as the API defines it, and the notebook in it.

The body is a notebook itself (it has `nbformat` at the top) or `{notebook, timeout,
cell_timeout, allow_errors, files, return_files, vars, env, network, keep, from,
rebuild, keep_files, files_from, name}`. The notebook is
checked by nbformat's own validator (older formats are converted to v4 first, as Jupyter
does), so a 400 carries nbformat's reason. Validating a large notebook is CPU work:
handlers parse in a thread.
"""

from __future__ import annotations

import json
import secrets
import unicodedata
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeGuard

import nbformat
from pydantic import AfterValidator, Field, WithJsonSchema
from pydantic import model_validator as model_check

from gateway.errors import ConflictingFields, InvalidRequest, PayloadTooLarge, UnsupportedLanguage
from gateway.jsoncodec import JsonLimits, JsonShape, parse_json, scan
from gateway.models.base import Body
from gateway.models.common import LANGUAGES, Language
from gateway.models.languages import KERNEL_LANGUAGES, notebook_metadata
from gateway.models.run import (
    FILES_FROM,
    KEEP_FILES,
    Environment,
    FileBody,
    ReturnPattern,
    RunId,
    SnapshotId,
)
from gateway.models.stream import REF, Ref

_REASON_CHARS = 500
MAX_NAME_CHARS = 255
# control and format characters (bidi overrides among them), line and paragraph separators
_UNPRINTED = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def notebook_name(value: str) -> str:
    if (
        not value.strip()
        or len(value) > MAX_NAME_CHARS
        or "/" in value
        or "\\" in value
        or any(unicodedata.category(c) in _UNPRINTED for c in value)
        or not any(unicodedata.category(c)[0] in "LNPS" for c in value)
    ):
        raise InvalidRequest(
            f"`name` must be a file name of 1 to {MAX_NAME_CHARS} characters with a letter, "
            "digit or sign, without `/`, `\\`, control or format characters.",
            field="name",
        )
    return value


NotebookName = Annotated[str, AfterValidator(notebook_name)]


class NotebookBody(Body):
    """The notebook with run options. Unknown fields are 400 invalid_request. The kernel is
    chosen from `metadata.kernelspec` / `language_info` (python, bash, typescript or
    javascript, Deno's kernel `deno` too, R and IRkernel's `ir`; python when absent;
    anything else 400 unsupported_language)."""

    notebook: Annotated[
        Any,
        WithJsonSchema(
            {
                "anyOf": [
                    {"$ref": "#/components/schemas/Notebook"},
                    {"type": "string", "description": "the notebook's JSON text"},
                ],
                "description": "nbformat v4 (or older, converted to v4)",
            }
        ),
    ]
    timeout: float | None = Field(
        None,
        description=(
            "wall-clock limit for all cells together, seconds (default 30), from the first "
            "cell's start; clamped to [1, max_timeout] exactly like a run's `timeout`"
        ),
    )
    cell_timeout: float | None = Field(
        None,
        description=(
            "limit for each cell, seconds (clamped the same way; default: `timeout`); a cell "
            "runs for at most min(cell_timeout, what is left of timeout), and a cell that "
            "times out stops the replay (`timed_out`)"
        ),
    )
    allow_errors: bool = Field(
        False,
        description=(
            "false: the first cell that raises stops the replay (later cells keep no outputs "
            "and no execution count; the run is `failed`) unless it is tagged "
            "`raises-exception`, as in nbclient; true: every cell runs, errors are recorded in "
            "their cells. Cells tagged `skip-execution` are not run"
        ),
    )
    files: list[FileBody] | None = None
    return_files: list[ReturnPattern] | None = None
    vars: dict[str, Any] | None = None
    env: Environment | None = None
    network: bool | None = None
    keep: bool | Literal["cells"] | None = Field(
        None,
        description=(
            "as a run's `keep`: the kernel's final state kept as a snapshot; `\"cells\"`: "
            "also the state after each code cell (the record's `snapshots`), each cell after "
            "the first running in a continuation of the state before it"
        ),
    )
    from_: SnapshotId | None = Field(
        None, alias="from", description="as a run's `from`: the replay starts from a snapshot"
    )
    rebuild: bool | None = Field(None, description="as a run's `rebuild`")
    keep_files: bool | None = Field(None, description=KEEP_FILES)
    files_from: RunId | None = Field(None, description=FILES_FROM)
    name: NotebookName | None = Field(
        None,
        description=(
            "the notebook's file name (e.g. `analysis.ipynb`), kept in the record and in "
            "`GET /v1/runs`, so that a history lists the replay under it; at most "
            f"{MAX_NAME_CHARS} characters, no `/`, no control characters"
        ),
    )

    @model_check(mode="after")
    def _snapshots(self) -> NotebookBody:
        if self.rebuild and self.from_ is None:
            raise InvalidRequest("`rebuild` needs `from`.", field="rebuild")
        if (self.keep or self.from_ is not None) and self.network:
            raise ConflictingFields(
                "A kept or continued replay has a working folder of its own and no network.",
                field="network",
            )
        return self

    @classmethod
    def read(cls, data: Any) -> NotebookBody:
        """The body as sent: a bare notebook is `{"notebook": <it>}`."""
        if isinstance(data, Mapping) and "nbformat" in data:
            data = {"notebook": data}
        elif not isinstance(data, Mapping) or data.get("notebook") is None:
            raise InvalidRequest(
                "Send a notebook (with `cells` and `nbformat`) or {notebook, timeout, ...}.",
                field="notebook",
            )
        return cls.parse(data)


def is_code(cell: Mapping[str, Any]) -> bool:
    return cell.get("cell_type") == "code"


def cell_source(cell: Mapping[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def cleared(notebook: dict[str, Any], language: Language) -> dict[str, Any]:
    """The notebook as it is before a replay: no outputs, no execution counts, sources as
    text, and kernel metadata set when it had none (so the result opens in JupyterLab)."""
    for cell in notebook["cells"]:
        cell["source"] = cell_source(cell)
        if is_code(cell):
            cell["outputs"] = []
            cell["execution_count"] = None
    metadata = notebook["metadata"]
    for key, value in notebook_metadata(language).items():
        metadata.setdefault(key, value)
    return notebook


def notebook_text(data: Any) -> str | None:
    """The notebook of a replay's body or message when it is sent as its JSON text."""
    if isinstance(data, Mapping) and "nbformat" not in data:
        text = data.get("notebook")
        return text if isinstance(text, str) else None
    return None


def scan_text(text: str, limits: JsonLimits) -> JsonShape:
    """What a notebook sent as its JSON text holds (`jsoncodec.scan`), refused as its
    field's: what the body's own scan counted of it was one string."""
    try:
        return scan(text, limits, "`notebook`")
    except (InvalidRequest, PayloadTooLarge) as exc:
        raise type(exc)(exc.message, field="notebook") from None


def read_notebook(raw: Any, notes: list[str], limits: JsonLimits) -> dict[str, Any]:
    """A valid nbformat v4 notebook from a decoded JSON object (or its JSON text, held to
    the same rules as a body: within `limits`, no NaN, Unicode text), of at most
    `limits.cells` cells (413).

    Notebooks of older formats are converted to v4; missing or repeated cell ids are
    replaced (with a note), as nbformat's `normalize` does; anything else nbformat's
    validator finds wrong is a 400 with its reason. A v4 notebook is checked and repaired
    where it is (the caller's parsed body, which nothing else reads): no copy of it is made.
    """
    if isinstance(raw, str):
        try:
            raw = parse_json(raw, limits, "`notebook`")
        except (InvalidRequest, PayloadTooLarge) as exc:
            raise type(exc)(exc.message, field="notebook") from None
    if not isinstance(raw, Mapping):
        raise InvalidRequest("`notebook` must be a notebook object.", field="notebook")
    version, minor = raw.get("nbformat"), raw.get("nbformat_minor", 0)
    if not _is_int(version) or not 1 <= version <= 4:
        raise InvalidRequest(
            f"The notebook must be nbformat 4 (or older, converted); it says {version!r}.",
            field="notebook.nbformat",
        )
    if not _is_int(minor) or minor < 0:
        raise InvalidRequest(
            f"`nbformat_minor` must be a whole number, not {minor!r}.",
            field="notebook.nbformat_minor",
        )
    if version == 4 and "cells" not in raw:
        raise InvalidRequest(
            "The notebook is not valid nbformat: 'cells' is a required property.",
            field="notebook",
        )
    cells = raw.get("cells", [])
    if not isinstance(cells, list) or not all(isinstance(c, Mapping) for c in cells):
        raise InvalidRequest("`cells` must be a list of cell objects.", field="notebook.cells")
    if limits.cells is not None and len(cells) > limits.cells:
        raise PayloadTooLarge(
            f"The notebook has {len(cells)} cells; the most a replay takes is {limits.cells}.",
            field="notebook.cells",
        )
    if version == 4:
        notebook = dict(raw)  # (a Mapping that is not a dict becomes one; its parts are kept)
    else:
        old = nbformat.from_dict(dict(raw))
        _validate(old)
        try:
            converted = nbformat.convert(old, 4)
        except Exception as exc:  # nbformat's converters raise whatever they meet
            raise InvalidRequest(
                f"The nbformat {version} notebook could not be converted to v4: {exc}.",
                field="notebook",
            ) from exc
        notebook = json.loads(json.dumps(converted))  # plain dicts, as a v4 one is
    minor = notebook.get("nbformat_minor")
    if notebook.get("nbformat") == 4 and _is_int(minor) and minor >= 5:
        _repair_ids(notebook, notes)  # (a missing minor is left to nbformat's validator)
    _validate(notebook)
    return notebook


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _repair_ids(notebook: dict[str, Any], notes: list[str]) -> None:
    """Give cells without an id, or with one an earlier cell has, a fresh id.

    nbformat's validator would do the same but warn while it does; ids of the wrong type
    or shape are left for the validator to refuse.
    """
    seen: set[Any] = set()
    repaired = 0
    for cell in notebook.get("cells", []):
        cell_id = cell.get("id")
        if "id" not in cell or (isinstance(cell_id, str) and cell_id in seen):
            cell["id"] = secrets.token_hex(4)
            repaired += 1
        if isinstance(cell.get("id"), str):
            seen.add(cell["id"])
    if repaired:
        notes.append(f"{repaired} cell id(s) were missing or repeated and were replaced.")


def _validate(notebook: dict[str, Any]) -> None:
    try:
        nbformat.validate(notebook)
    except nbformat.ValidationError as exc:
        raise InvalidRequest(_reason(exc), field="notebook") from exc
    except (AttributeError, KeyError, TypeError, ValueError) as exc:  # a shape nbformat chokes on
        raise InvalidRequest(
            f"The notebook is not valid nbformat: {exc}.", field="notebook"
        ) from exc


def _reason(exc: nbformat.ValidationError) -> str:
    message = str(getattr(exc, "message", "") or exc).split("\n", 1)[0]
    if len(message) > _REASON_CHARS:
        message = message[:_REASON_CHARS] + "..."
    path = "/".join(str(p) for p in getattr(exc, "absolute_path", ()) or ())
    where = f" (at {path})" if path else ""
    return f"The notebook is not valid nbformat: {message}{where}."


def notebook_language(metadata: Mapping[str, Any]) -> Language:
    """The kernel a notebook asks for: `kernelspec.language`, else `language_info.name`,
    else `kernelspec.name`; Python when it names none."""
    kernelspec = metadata.get("kernelspec") or {}
    info = metadata.get("language_info") or {}
    for value in (kernelspec.get("language"), info.get("name"), kernelspec.get("name")):
        if isinstance(value, str) and value:
            language = KERNEL_LANGUAGES.get(value.strip().lower())
            if language is None:
                raise UnsupportedLanguage(
                    f"The notebook's kernel language {value!r} is not supported; use one of: "
                    f"{', '.join(LANGUAGES)}.",
                    field="notebook.metadata.kernelspec",
                )
            return language
    return "python"


class NotebookMessage(NotebookBody):
    """client -> gateway: replay a notebook, its cells' events sent live. The fields of
    POST /v1/notebooks/run (`notebook` is required; validated, capped and clamped the same
    way) plus `type` and `ref`, which is echoed in every message about the replay."""

    type: Literal["notebook"]
    ref: Ref | None = Field(None, description=REF)
