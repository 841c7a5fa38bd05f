"""`GET /v1/usage`: a user's usage from the store's ledger, by rolling window, hour and day
(`gateway.models.usage`), with their budget and what they keep. Whose usage is decided here
and only here: the caller's own, or for an admin every user's or the one `?user=` names."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Mapping

from gateway.auth import Principal
from gateway.errors import Forbidden, InvalidRequest
from gateway.models.usage import Period, Spent, Stored, UsageList, UserBudget, UserUsage
from gateway.runs.quotas import DAY, HOUR, Quotas, minute_of
from gateway.runs.snapshots import Snapshots
from gateway.store.base import RecordStore, UsageRow
from gateway.uploads.shelf import UploadShelf

HOURS_SHOWN = 48
DAYS_SHOWN = 30
MAX_USER_CHARS = 256


def whose(arguments: Mapping[str, list[bytes]], caller: Principal) -> str | None:
    """The user whose usage the caller asks for; None: every user's (an admin only)."""
    values = arguments.get("user") or []
    if len(values) > 1:
        raise InvalidRequest("`user` is given more than once; give it once.", field="user")
    if not values:
        return None if caller.is_admin else caller.user
    try:
        named = values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("`user` is not valid UTF-8.", field="user") from None
    if not 0 < len(named) <= MAX_USER_CHARS or "\x00" in named:
        raise InvalidRequest(
            f"`user` must be a user name of 1 to {MAX_USER_CHARS} characters.", field="user"
        )
    if named != caller.user and not caller.is_admin:
        raise Forbidden("Only an admin may see another user's usage.", field="user")
    return named


async def usage(
    caller: str,
    user: str | None,
    store: RecordStore,
    quotas: Quotas,
    shelf: UploadShelf | None,
    snapshots: Snapshots,
) -> UsageList:
    now = time.time()
    minute = minute_of(now)
    rows = await store.usage(user, minute - DAYS_SHOWN * DAY)
    users = [user] if user is not None else sorted({r.user for r in rows})
    found = []
    for name in users:
        mine = [r for r in rows if r.user == name]
        budget = quotas.budget(name)
        found.append(
            UserUsage(
                user=name,
                budget=UserBudget(
                    cpu_seconds_per_hour=budget.cpu_seconds_per_hour,
                    cpu_seconds_per_day=budget.cpu_seconds_per_day,
                    runs_per_minute=budget.runs_per_minute,
                ),
                last_hour=_spent(mine, minute, HOUR, budget.cpu_seconds_per_hour),
                last_day=_spent(mine, minute, DAY, budget.cpu_seconds_per_day),
                hours=_periods(mine, HOUR, minute - HOURS_SHOWN * HOUR),
                days=_periods(mine, DAY, minute - DAYS_SHOWN * DAY),
                stored_bytes=Stored(
                    records=await store.stored_bytes(name),
                    uploads=0 if shelf is None else await shelf.stored_bytes(name),
                    snapshots=sum(s.bytes for s in snapshots.owned(name)),
                ),
            )
        )
    return UsageList(you=caller, users=found)


def _spent(rows: Iterable[UsageRow], minute: int, window: int, limit: float | None) -> Spent:
    inside = [r for r in rows if minute - window < r.minute <= minute]
    cpu = sum(r.cpu_ms for r in inside) / 1000
    return Spent(
        cpu_seconds=cpu,
        runs=sum(r.runs for r in inside),
        cpu_seconds_left=None if limit is None else max(0.0, limit - cpu),
    )


def _periods(rows: Iterable[UsageRow], size: int, since: int) -> list[Period]:
    """The rows from `since` on, summed by periods of `size` minutes (an hour, a day)."""
    by_start: dict[int, list[UsageRow]] = {}
    for row in rows:
        if row.minute > since:
            by_start.setdefault(row.minute // size * size, []).append(row)
    return [
        Period(
            start=_rfc3339(start),
            cpu_seconds=sum(r.cpu_ms for r in group) / 1000,
            runs=sum(r.runs for r in group),
            peak_memory_bytes=max(r.peak_memory_bytes for r in group),
        )
        for start, group in sorted(by_start.items())
    ]


def _rfc3339(minute: int) -> str:
    when = dt.datetime.fromtimestamp(minute * 60, dt.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")
