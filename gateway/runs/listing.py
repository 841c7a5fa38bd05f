"""`GET /v1/runs`: the query string of a listing, its cursor, and a page from the store.

Whose runs a page shows is decided here and only here: the caller's own, or for an admin
the user `?user=` names. A cursor is a position in one listing (its owner and filters,
and the last run's place in the order), encoded as opaque text; one that is not a cursor,
or that belongs to another listing (another user's, other filters), is 400. Whatever a
cursor says, the store is asked only for the runs of the listing the caller may see, so a
forged one can at most move within it.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from typing import Any, get_args

from gateway.auth import Principal
from gateway.errors import Forbidden, InvalidRequest
from gateway.models.common import LANGUAGES, RUN_ID_PATTERN, Status
from gateway.models.listing import DEFAULT_LIMIT, MAX_LIMIT, RunList, RunSummary
from gateway.store.base import InvalidPosition, RecordStore, RunQuery

STATUSES: tuple[str, ...] = get_args(Status)
MAX_CURSOR_CHARS = 2000
MAX_USER_CHARS = 256
_VERSION = 1
_RUN_ID = re.compile(RUN_ID_PATTERN)
_INTEGER = re.compile(r"[0-9]{1,6}")


def listing_query(arguments: Mapping[str, list[bytes]], caller: Principal) -> RunQuery:
    """The store's query for a listing's query string, as `caller` may ask it."""
    args = {name: _argument(arguments, name) for name in _NAMES}
    owner = caller.user
    if args["user"] is not None and args["user"] != caller.user:
        if not caller.is_admin:
            raise Forbidden("Only an admin may list another user's runs.", field="user")
        owner = args["user"]
    status, language = args["status"], args["language"]
    if status is not None and status not in STATUSES:
        raise InvalidRequest(
            f"`status` must be one of {', '.join(STATUSES)}; not {status[:100]!r}.",
            field="status",
        )
    if language is not None and language not in LANGUAGES:
        raise InvalidRequest(
            f"`language` must be one of {', '.join(LANGUAGES)}; not {language[:100]!r}.",
            field="language",
        )
    query = RunQuery(owner=owner, limit=_limit(args["limit"]), status=status, language=language)
    if args["cursor"] is None:
        return query
    return RunQuery(
        owner=query.owner,
        limit=query.limit,
        status=query.status,
        language=query.language,
        after=read_cursor(args["cursor"], query),
    )


async def list_runs(store: RecordStore, query: RunQuery) -> RunList:
    """A page of the listing; `next` when there is more (one run more is asked for)."""
    asked = RunQuery(
        owner=query.owner,
        limit=query.limit + 1,
        status=query.status,
        language=query.language,
        after=query.after,
    )
    try:
        listed = await store.list_runs(asked)
    except InvalidPosition:
        raise _bad_cursor() from None
    page = listed[: query.limit]
    more = len(listed) > query.limit
    return RunList(
        runs=[RunSummary.model_validate(item.summary) for item in page],
        next=make_cursor(query, page[-1].after) if more else None,
    )


# --- the cursor ---------------------------------------------------------------------------


def make_cursor(query: RunQuery, after: tuple[str, str]) -> str:
    data = {
        "v": _VERSION,
        "u": query.owner,
        "s": query.status,
        "l": query.language,
        "p": list(after),
    }
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    return base64.urlsafe_b64encode(text).decode("ascii").rstrip("=")


def read_cursor(cursor: str, query: RunQuery) -> tuple[str, str]:
    """The position a cursor of this listing holds; 400 for anything else."""
    if len(cursor) > MAX_CURSOR_CHARS:
        raise _bad_cursor()
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data: Any = json.loads(text)
    except (binascii.Error, ValueError, RecursionError):
        raise _bad_cursor() from None
    if not isinstance(data, dict) or set(data) != {"v", "u", "s", "l", "p"}:
        raise _bad_cursor()
    position = data["p"]
    if (
        data["v"] != _VERSION
        or not isinstance(position, list)
        or len(position) != 2
        or not all(isinstance(part, str) and 0 < len(part) <= 100 for part in position)
        or not _RUN_ID.fullmatch(position[1])
    ):
        raise _bad_cursor()
    if (data["u"], data["s"], data["l"]) != (query.owner, query.status, query.language):
        raise InvalidRequest(
            "This cursor belongs to another listing (another user's, or other `status` or "
            "`language` filters): pass it with the query it came from.",
            field="cursor",
        )
    return position[0], position[1]


def _bad_cursor() -> InvalidRequest:
    return InvalidRequest(
        "`cursor` is not a cursor of this gateway: pass the `next` of a previous page as it came.",
        field="cursor",
    )


# --- the query string ---------------------------------------------------------------------

_NAMES = ("limit", "cursor", "status", "language", "user")


def _argument(arguments: Mapping[str, list[bytes]], name: str) -> str | None:
    values = arguments.get(name)
    if not values:
        return None
    if len(values) > 1:
        raise InvalidRequest(f"`{name}` is given {len(values)} times; give it once.", field=name)
    try:
        value = values[0].decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest(f"`{name}` is not valid UTF-8.", field=name) from None
    if name == "user" and not 0 < len(value) <= MAX_USER_CHARS:
        raise InvalidRequest(
            f"`user` must be a user name of 1 to {MAX_USER_CHARS} characters.", field="user"
        )
    if "\x00" in value:
        raise InvalidRequest(f"`{name}` contains a NUL character.", field=name)
    return value


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_LIMIT
    if not _INTEGER.fullmatch(value) or not 1 <= int(value) <= MAX_LIMIT:
        raise InvalidRequest(
            f"`limit` must be a whole number from 1 to {MAX_LIMIT}; not {value[:100]!r}.",
            field="limit",
        )
    return int(value)
