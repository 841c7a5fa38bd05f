"""Deprecated: a run record's error, charts and returned files, read with their models.

The client's records are typed all the way down now (`gateway.models.typed.TypedRunRecord`):
`record.error`, `record.charts` and `record.files` are these models already. The three
functions stay for code written against the records of old, whose parts were dicts; given a
typed record they return its own fields, given a server's `RunRecord` they read its JSON.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pydantic

from gateway.client.refusals import not_the_api
from gateway.models.record import (
    Chart,
    ReturnedFile,
    ReturnedFileContent,
    ReturnedFileError,
    RunError,
    RunRecord,
)
from gateway.models.typed import TypedRunRecord

T = TypeVar("T")

_CHARTS = pydantic.TypeAdapter(list[Chart])
_FILES = pydantic.TypeAdapter(list[ReturnedFile])


def run_error(record: RunRecord) -> RunError | None:
    """Deprecated: `record.error`."""
    if isinstance(record, TypedRunRecord):
        return record.error
    if record.error is None:
        return None
    return _read(lambda: RunError.model_validate(record.error), "error")


def run_charts(record: RunRecord) -> list[Chart]:
    """Deprecated: `record.charts`."""
    if isinstance(record, TypedRunRecord):
        return record.charts
    return _read(lambda: _CHARTS.validate_python(record.charts), "charts")


def returned_files(record: RunRecord) -> list[ReturnedFileContent | ReturnedFileError]:
    """Deprecated: `record.files`."""
    if isinstance(record, TypedRunRecord):
        return record.files
    files = _read(lambda: _FILES.validate_python(record.files), "files")
    return [entry.root for entry in files]


def _read(parse: Callable[[], T], part: str) -> T:
    try:
        return parse()
    except pydantic.ValidationError as exc:
        raise not_the_api(0, f"the record's {part} do not fit their model: {exc}") from None
