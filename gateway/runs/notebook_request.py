"""A validated `POST /v1/notebooks/run` body (`NotebookRequest`), and the rules that make one.

The body is a notebook itself (it has `nbformat` at the top) or `{notebook, timeout,
cell_timeout, allow_errors, files, return_files}`. The notebook is checked by nbformat's own
validator (older formats are converted to v4 first, as Jupyter does), so a 400 carries
nbformat's reason. Validating a large notebook is CPU work: handlers call
`parse_notebook_request` in a thread.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import secrets
from collections.abc import Mapping
from typing import Any, TypeGuard

import nbformat

from gateway.errors import InvalidRequest, PayloadTooLarge, UnsupportedLanguage
from gateway.models.common import LANGUAGES, Language
from gateway.runs.models import StagedFile
from gateway.runs.notebook import notebook_metadata
from gateway.runs.validation import (
    parse_env,
    parse_files,
    parse_network,
    parse_return_files,
    parse_timeout,
    parse_vars,
)
from gateway.settings import Settings

NOTEBOOK_FIELDS = frozenset(
    {
        "notebook",
        "timeout",
        "cell_timeout",
        "allow_errors",
        "files",
        "return_files",
        "vars",
        "env",
        "network",
    }
)
# Kernel names and languages a notebook may name, and the kernel that runs it.
KERNEL_LANGUAGES: dict[str, Language] = {
    "python": "python",
    "python3": "python",
    "ipython": "python",
    "ipython3": "python",
    "bash": "bash",
    "typescript": "typescript",
    "deno": "typescript",  # the kernel name `deno jupyter --install` gives
    "javascript": "javascript",
}
_REASON_CHARS = 500


@dataclasses.dataclass(frozen=True)
class NotebookRequest:
    """A notebook to replay in one fresh kernel, with its outputs already cleared."""

    notebook: dict[str, Any]  # valid nbformat v4; code cells have no outputs yet
    language: Language
    timeout: float = 30.0  # for all cells together, from the first cell's start
    cell_timeout: float = 30.0  # for each cell (a cell gets at most the time left)
    allow_errors: bool = False
    files: tuple[StagedFile, ...] = ()
    return_files: tuple[str, ...] = ()
    vars: dict[str, Any] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    network: bool = False
    user: str = "anonymous"
    notes: tuple[str, ...] = ()

    @property
    def code(self) -> str:
        """Every code cell's source, in order, as one text (kept with the record)."""
        return "\n\n".join(cell_source(c) for c in self.notebook["cells"] if is_code(c))


def is_code(cell: Mapping[str, Any]) -> bool:
    return cell.get("cell_type") == "code"


def cell_source(cell: Mapping[str, Any]) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else str(source)


def parse_notebook_request(
    body: Any, settings: Settings, *, user: str = "anonymous"
) -> NotebookRequest:
    """Validate a `POST /v1/notebooks/run` body (already JSON-decoded)."""
    if not isinstance(body, Mapping):
        raise InvalidRequest("The request body must be a notebook or a JSON object.")
    if "nbformat" in body:  # the notebook itself (a v3 one has `worksheets`, not `cells`)
        options: Mapping[str, Any] = {}
        raw = body
    elif "notebook" in body:
        unknown = sorted(set(body) - NOTEBOOK_FIELDS)
        if unknown:
            raise InvalidRequest(f"Unknown field(s): {', '.join(unknown)}.", field=unknown[0])
        options, raw = body, body["notebook"]
    else:
        raise InvalidRequest(
            "Send a notebook (with `cells` and `nbformat`) or {notebook, timeout, ...}.",
            field="notebook",
        )
    notes: list[str] = []
    notebook = read_notebook(raw, notes)
    language = notebook_language(notebook["metadata"])
    code_bytes = sum(
        len(cell_source(c).encode("utf-8", "surrogatepass"))
        for c in notebook["cells"]
        if is_code(c)
    )
    if code_bytes > settings.max_code_bytes:
        raise PayloadTooLarge(
            f"The notebook's cells hold more than {settings.max_code_bytes} bytes of source.",
            field="notebook",
        )
    timeout = parse_timeout(options.get("timeout"), settings, notes)
    cell_timeout = (
        timeout
        if options.get("cell_timeout") is None
        else parse_timeout(options["cell_timeout"], settings, notes, field="cell_timeout")
    )
    allow_errors = options.get("allow_errors", False)
    if not isinstance(allow_errors, bool):
        raise InvalidRequest("`allow_errors` must be true or false.", field="allow_errors")
    network = parse_network(options.get("network"), settings)
    return NotebookRequest(
        notebook=_cleared(notebook, language),
        language=language,
        timeout=timeout,
        cell_timeout=cell_timeout,
        allow_errors=allow_errors,
        files=parse_files(options.get("files"), settings),
        return_files=parse_return_files(options.get("return_files"), settings),
        vars=parse_vars(options.get("vars"), language),
        env=parse_env(options.get("env")),
        network=network,
        user=user,
        notes=tuple(notes),
    )


def read_notebook(raw: Any, notes: list[str]) -> dict[str, Any]:
    """A valid nbformat v4 notebook from a decoded JSON object (or its JSON text).

    Notebooks of older formats are converted to v4; missing or repeated cell ids are
    replaced (with a note), as nbformat's `normalize` does; anything else nbformat's
    validator finds wrong is a 400 with its reason.
    """
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"`notebook` is not valid JSON: {exc}.", field="notebook") from exc
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
    notebook = nbformat.from_dict(copy.deepcopy(dict(raw)))
    if version < 4:
        _validate(notebook)
        try:
            notebook = nbformat.convert(notebook, 4)
        except Exception as exc:  # nbformat's converters raise whatever they meet
            raise InvalidRequest(
                f"The nbformat {version} notebook could not be converted to v4: {exc}.",
                field="notebook",
            ) from exc
    minor = notebook.get("nbformat_minor")
    if notebook.get("nbformat") == 4 and _is_int(minor) and minor >= 5:
        _repair_ids(notebook, notes)  # (a missing minor is left to nbformat's validator)
    _validate(notebook)
    plain: dict[str, Any] = json.loads(json.dumps(notebook))
    return plain


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


def _cleared(notebook: dict[str, Any], language: Language) -> dict[str, Any]:
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
