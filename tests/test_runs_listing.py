"""`GET /v1/runs` on a real gateway with three users: each sees only their own runs, newest
first, a page at a time to the end, filtered by status and language; an admin may name
another user; cursors, limits, filters and names that are not what the API says are 400
(or 403), never another user's data and never a 500."""

from __future__ import annotations

import base64
import json
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import start_gateway
from tests.openapi_support import assert_error_answer, assert_valid
from tests.support import Client, GatewayThread, serving

pytestmark = pytest.mark.attack

ALICE, BOB, ROOT = "alice-token-0123456789", "bob-token-0123456789", "root-token-0123456789"


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    yield from serving(
        start_gateway(
            "local", users={ALICE: ("alice", "user"), BOB: ("bob", "user"), ROOT: ("root", "admin")}
        )
    )


@pytest.fixture(scope="module")
def runs(server: GatewayThread) -> dict[str, list[dict[str, Any]]]:
    """The users' runs, in the order they were made (each waited for)."""
    alice, bob = server.client(ALICE), server.client(BOB)
    made = {
        "alice": [
            alice.run(code="print('one')"),
            alice.run(code="echo two", language="bash"),
            alice.run(code="\n# three\nraise SystemExit(3)"),
            alice.run(code="print('four')"),
        ],
        "bob": [bob.run(code="print('bob')")],
    }
    assert [r["status"] for r in made["alice"]] == ["succeeded", "succeeded", "failed", "succeeded"]
    return made


def listing(client: Client, **query: Any) -> tuple[int, dict[str, Any]]:
    path = "/v1/runs"
    if query:
        path += "?" + urllib.parse.urlencode(query, doseq=True)
    response = client.request("GET", path)
    return response.status, response.json()


def every_page(client: Client, **query: Any) -> list[list[dict[str, Any]]]:
    pages = []
    cursor = None
    while True:
        status, page = listing(client, **query, **({"cursor": cursor} if cursor else {}))
        assert status == 200, page
        assert_valid("RunList", page)
        pages.append(page["runs"])
        cursor = page["next"]
        if cursor is None:
            return pages


def test_a_user_pages_through_their_own_runs_newest_first(
    server: GatewayThread, runs: dict[str, list[dict[str, Any]]]
) -> None:
    alice = server.client(ALICE)
    newest_first = [r["id"] for r in reversed(runs["alice"])]
    pages = every_page(alice, limit=3)
    assert [[s["id"] for s in page] for page in pages] == [newest_first[:3], newest_first[3:]]
    status, whole = listing(alice)
    assert status == 200 and whole["next"] is None
    assert [s["id"] for s in whole["runs"]] == newest_first
    failed = whole["runs"][1]
    record = runs["alice"][2]
    assert failed == {
        "id": record["id"],
        "status": "failed",
        "language": "python",
        "kind": "run",
        "created_at": failed["created_at"],
        "started_at": record["started_at"],
        "finished_at": record["finished_at"],
        "first_line": "# three",
        "exit_code": 3,
    }
    # a page of exactly the runs there are says so: no cursor to an empty page
    status, exact = listing(alice, limit=4)
    assert status == 200 and len(exact["runs"]) == 4 and exact["next"] is None


def test_filters_by_status_and_language(
    server: GatewayThread, runs: dict[str, list[dict[str, Any]]]
) -> None:
    alice = server.client(ALICE)
    by_language = every_page(alice, language="bash", limit=1)
    assert [[s["id"] for s in p] for p in by_language] == [[runs["alice"][1]["id"]]]
    failed = every_page(alice, status="failed")
    assert [[s["id"] for s in p] for p in failed] == [[runs["alice"][2]["id"]]]
    assert every_page(alice, status="running") == [[]]
    succeeded = every_page(alice, status="succeeded", limit=2)
    assert [s["id"] for p in succeeded for s in p] == [runs["alice"][i]["id"] for i in (3, 1, 0)]


def test_another_users_runs_are_invisible_and_an_admin_may_name_a_user(
    server: GatewayThread, runs: dict[str, list[dict[str, Any]]]
) -> None:
    bob, root = server.client(BOB), server.client(ROOT)
    assert [s["id"] for p in every_page(bob) for s in p] == [runs["bob"][0]["id"]]
    status, answer = listing(bob, user="alice")
    assert status == 403 and answer["error"]["field"] == "user"
    status, own = listing(bob, user="bob")  # naming oneself is no privilege
    assert status == 200 and [s["id"] for s in own["runs"]] == [runs["bob"][0]["id"]]
    pages = every_page(root, user="alice", limit=3)
    assert [s["id"] for p in pages for s in p] == [r["id"] for r in reversed(runs["alice"])]
    assert every_page(root) == [[]]  # the admin's own: none
    for hostile in ("alice' OR '1'='1", 'alice"; DROP TABLE runs; --', "%", "_", "*"):
        status, answer = listing(root, user=hostile)
        assert (status, answer) == (200, {"runs": [], "next": None}), hostile
    assert len(every_page(root, user="alice")[0]) == 4  # and the table is still there


def cursor_of(client: Client, **query: Any) -> str:
    status, page = listing(client, limit=1, **query)
    assert status == 200 and page["next"], page
    cursor: str = page["next"]
    return cursor


def test_a_foreign_or_forged_cursor_is_refused(
    server: GatewayThread, runs: dict[str, list[dict[str, Any]]]
) -> None:
    alice, bob, root = server.client(ALICE), server.client(BOB), server.client(ROOT)
    mine = cursor_of(alice)
    # alice's cursor used by bob, by the admin for another listing, or with other filters
    for client, query in (
        (bob, {}),
        (root, {}),
        (root, {"user": "bob"}),
        (alice, {"status": "succeeded"}),
        (alice, {"language": "python"}),
    ):
        status, answer = listing(client, cursor=mine, **query)
        assert status == 400 and answer["error"]["field"] == "cursor", (query, answer)
    # the admin's cursor of alice's listing, used by alice for her own: that is her listing
    status, page = listing(alice, cursor=cursor_of(root, user="alice"), limit=1)
    assert status == 200 and page["runs"][0]["id"] == runs["alice"][-2]["id"]
    # a cursor rewritten to name bob's listing, sent by alice: still not hers
    data = json.loads(base64.urlsafe_b64decode(mine + "=" * (-len(mine) % 4)))
    for forged in ({**data, "u": "bob"}, {**data, "p": ["not a time", data["p"][1]]}):
        text = base64.urlsafe_b64encode(json.dumps(forged).encode()).decode()
        status, answer = listing(alice, cursor=text)
        assert status == 400 and answer["error"]["code"] == "invalid_request", answer
    status, answer = listing(
        bob, cursor=base64.urlsafe_b64encode(json.dumps({**data, "u": "bob"}).encode()).decode()
    )
    assert status == 200  # a position in bob's own listing shows bob only his own runs
    assert {s["id"] for s in answer["runs"]} <= {runs["bob"][0]["id"]}
    for garbage in ("x", "!!!", "A" * 3000, "eyJ2IjoxfQ", base64.b64encode(b"[1,2]").decode()):
        status, answer = listing(alice, cursor=garbage)
        assert status == 400 and answer["error"]["field"] == "cursor", garbage


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "99999999999999999999"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "2.5"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"status": "finished"}, "status"),
        ({"status": "succeeded' OR 1=1 --"}, "status"),
        ({"language": "cobol"}, "language"),
        ({"status": ["failed", "succeeded"]}, "status"),
        ({"user": ""}, "user"),
        ({"user": "a\x00b"}, "user"),
    ],
)
def test_query_values_that_are_not_the_apis_are_400(
    server: GatewayThread, query: dict[str, Any], field: str
) -> None:
    status, answer = listing(server.client(ROOT), **query)
    assert status == 400, answer
    assert_error_answer(status, answer, "/v1/runs", "get")
    assert answer["error"]["code"] == "invalid_request" and answer["error"]["field"] == field


def test_the_largest_limit_is_served(
    server: GatewayThread, runs: dict[str, list[dict[str, Any]]]
) -> None:
    status, page = listing(server.client(ALICE), limit=100)
    assert status == 200 and len(page["runs"]) == 4 and page["next"] is None
    response = server.client().request("GET", "/v1/runs")  # no token
    assert response.status == 401
