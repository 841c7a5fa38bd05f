"""`GET /v1/usage`: what a user's runs spent and may still spend (`gateway.runs.quotas`)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from gateway.models.base import Answer

DATE_TIME: dict[str, Any] = {"format": "date-time"}


class UserBudget(Answer):
    """What the user may spend (null: no limit): the tokens file's, else the operator's."""

    cpu_seconds_per_hour: float | None = Field(description="in any rolling hour")
    cpu_seconds_per_day: float | None = Field(description="in any rolling day")
    runs_per_minute: int | None = Field(description="runs started in any rolling minute")


class Spent(Answer):
    """A rolling window up to now."""

    cpu_seconds: float = Field(ge=0, description="CPU of the runs, going and done")
    runs: int = Field(ge=0, description="runs that ended")
    cpu_seconds_left: float | None = Field(
        description="of the budget of this window, if there is one (0 when spent)"
    )


class Period(Answer):
    """One hour or one day (UTC) with runs."""

    start: str = Field(json_schema_extra=DATE_TIME)
    cpu_seconds: float = Field(ge=0)
    runs: int = Field(ge=0)
    peak_memory_bytes: int = Field(ge=0, description="the largest peak of one of its runs")


class Stored(Answer):
    """What the user keeps on the gateway now, in bytes."""

    records: int = Field(ge=0, description="run records (the store)")
    uploads: int = Field(ge=0, description="uploads and kept files")
    snapshots: int = Field(ge=0, description="kept kernel states on this gateway instance")


class UserUsage(Answer):
    user: str
    budget: UserBudget
    last_hour: Spent
    last_day: Spent
    hours: list[Period] = Field(description="the last 48 hours with runs, oldest first")
    days: list[Period] = Field(description="the last 30 days with runs, oldest first")
    stored_bytes: Stored


class UsageList(Answer):
    """The caller's usage; an admin's: every user's with runs in the last 30 days (or the
    one `?user=` names)."""

    you: str = Field(description="the caller's user name (its entry among `users`)")
    users: list[UserUsage]
