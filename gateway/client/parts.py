"""Typed views of a run record's parts that travel as plain JSON (the record keeps them as
the kernel sent them): its error, its charts and its returned files, read with the models
that describe them in the OpenAPI document (`gateway.models.record`)."""

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

T = TypeVar("T")

_CHARTS = pydantic.TypeAdapter(list[Chart])
_FILES = pydantic.TypeAdapter(list[ReturnedFile])


def run_error(record: RunRecord) -> RunError | None:
    """The run's uncaught error (`ename`, `evalue`, `traceback`), if it has one."""
    if record.error is None:
        return None
    return _read(lambda: RunError.model_validate(record.error), "error")


def run_charts(record: RunRecord) -> list[Chart]:
    """The run's charts, in order: `mime`, `data`, `source`, `path`, `spec`."""
    return _read(lambda: _CHARTS.validate_python(record.charts), "charts")


def returned_files(record: RunRecord) -> list[ReturnedFileContent | ReturnedFileError]:
    """The run's `return_files` entries, in order: each a file's content, or why not."""
    files = _read(lambda: _FILES.validate_python(record.files), "files")
    return [entry.root for entry in files]


def _read(parse: Callable[[], T], part: str) -> T:
    try:
        return parse()
    except pydantic.ValidationError as exc:
        raise not_the_api(0, f"the record's {part} do not fit their model: {exc}") from None
