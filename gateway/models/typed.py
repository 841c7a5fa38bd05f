# mypy: disable-error-code="assignment"
# (each field below narrows a field of the server's model to the model of its JSON: see
# the last paragraph of the docstring)
"""The API's answers as a client reads them: the server's own models, typed all the way down.

The server keeps a run record's parts as plain JSON while the run goes (`RunRecord` in
`gateway.models.record`: its error, charts and returned files as the kernel sent them, its
timestamps as the RFC 3339 text it writes), so that it never walks a record of 64 MiB on its
event loop. A client reads an answer once, so it reads it typed:

    record = client.run(code)            # a TypedRunRecord (a RunRecord too)
    record.error.ename                   # RunError
    record.charts[0].spec.title          # Chart, ChartSpec
    record.files[0].content              # ReturnedFileContent (or ReturnedFileError)
    record.started_at                    # datetime, in UTC

Each class here subclasses the server's model and overrides only the fields whose JSON a
model of `gateway.models.record` describes (the very models the OpenAPI document names for
them), and the timestamps. Every other field is inherited: a field the server's record gains
is the client's at once, and the document's schema is the server's, unchanged
(tests/test_client_typed.py holds each part to the component the document names).

The gateway's own fields (`record.PRIVATE_FIELDS`: `user`, `code`, ...) are never sent; on a
client they hold their defaults, but `created_at`, which is None (a listing's `RunSummary`
has it). A typed field is not the type the server's model declares (the server's `error` is
a dict), which mypy rightly calls an incompatible override: the one check this module turns
off, on its first line. No code of the server takes these records.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pydantic import Field

from gateway.models.listing import RunList, RunSummary
from gateway.models.record import (
    Chart,
    ReturnedFileContent,
    ReturnedFileError,
    RunError,
    RunRecord,
    SnapshotInfo,
    SnapshotList,
)
from gateway.models.usage import Period, UsageList, UserUsage


class TypedSnapshotInfo(SnapshotInfo):
    """A kept state (`SnapshotInfo`) with `expires_at` as a datetime."""

    expires_at: dt.datetime


class TypedSnapshotList(SnapshotList):
    """`GET /v1/snapshots` (`SnapshotList`), each snapshot typed."""

    snapshots: list[TypedSnapshotInfo]


class TypedRunRecord(RunRecord):
    """The run record (`RunRecord`) with its error, charts and returned files as their models,
    its timestamps as datetimes and its snapshots typed."""

    error: RunError | None = None
    charts: list[Chart] = Field(default_factory=list)
    files: list[ReturnedFileContent | ReturnedFileError] = Field(default_factory=list)
    snapshot: TypedSnapshotInfo | None = None
    snapshots: list[TypedSnapshotInfo] = Field(default_factory=list)
    started_at: dt.datetime | None = None
    finished_at: dt.datetime | None = None
    created_at: dt.datetime | None = Field(None, exclude=True)  # not sent (see above)

    def to_json(self) -> dict[str, Any]:
        """The record as the gateway sent it (JSON values; what it left out, left out)."""
        return self.model_dump(mode="json", exclude_unset=True)


class TypedRunSummary(RunSummary):
    """One run of a listing (`RunSummary`) with its timestamps as datetimes."""

    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class TypedRunList(RunList):
    """`GET /v1/runs` (`RunList`), each summary typed."""

    runs: list[TypedRunSummary]


class TypedPeriod(Period):
    """An hour or a day of `GET /v1/usage` (`Period`), its start a datetime."""

    start: dt.datetime


class TypedUserUsage(UserUsage):
    hours: list[TypedPeriod]
    days: list[TypedPeriod]


class TypedUsageList(UsageList):
    """`GET /v1/usage` (`UsageList`), each period's start a datetime."""

    users: list[TypedUserUsage]
