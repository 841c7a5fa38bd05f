"""What each user spends and may spend (issue 34): the ledger counts every run's CPU as its
record does, `GET /v1/usage` shows it, a budget of CPU-seconds refuses new runs with 429
`quota` and a Retry-After from the window, and stops a run at the budget
(`kill_reason: cpu_quota`, its output so far kept); runs per minute too; one user's spent
budget refuses only them. The quotas are the gateway's, not the sandbox's: the local backend
(with its cgroup, as root) covers them; two replicas on PostgreSQL hold them fleet-wide."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import TokenTable
from gateway.budget import CpuBudget
from gateway.errors import QuotaExceeded
from gateway.runs.quotas import DAY, HOUR, TICK, Quotas, retry_after
from gateway.store.base import UsageRow
from gateway.store.sqlite import SQLiteStore
from tests import api
from tests.api import code_cell_json, notebook_json
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, forget_snapshots, serving

ALICE, BOB, ADMIN = "alice-token-0123456789", "bob-token-0123456789ab", "admin-token-01234567"
CAROL = "carol-token-0123456789a"
DAVE = "dave-token-0123456789ab"
ERIN = "erin-token-0123456789ab"
GRACE = "grace-token-0123456789a"
HEIDI = "heidi-token-0123456789a"  # no budget: for what needs a run of its own
USERS = {"alice", "bob", "carol", "dave", "erin", "grace", "heidi", "root"}  # the tokens file's
BUDGET_S = 1.0  # alice's CPU-seconds per hour

# a run that spends CPU until it has spent `seconds` of its own (its own clock: the promise
# is measured by the program, not by the gateway)
SPIN = (
    "import time\n"
    "print('started', flush=True)\n"
    "end = time.process_time() + {seconds}\n"
    "while time.process_time() < end: pass\n"
    "print('done', flush=True)"
)


def tokens_file(folder: Path, entries: dict[str, dict[str, Any]]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokens.json"
    path.write_text(json.dumps(entries))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    tokens = tokens_file(
        tmp_path_factory.mktemp("quota-tokens"),
        {
            ALICE: {"user": "alice", "role": "user", "cpu_seconds_per_hour": BUDGET_S},
            BOB: {"user": "bob", "role": "user", "runs_per_minute": 2},
            CAROL: {"user": "carol", "cpu_seconds_per_hour": BUDGET_S, "cpu_seconds_per_day": 2},
            DAVE: {"user": "dave", "cpu_seconds_per_hour": BUDGET_S},
            ERIN: {"user": "erin", "cpu_seconds_per_day": BUDGET_S},
            GRACE: {"user": "grace", "cpu_seconds_per_hour": BUDGET_S},
            HEIDI: {"user": "heidi"},
            ADMIN: {"user": "root", "role": "admin"},
        },
    )
    yield from serving(start_gateway("local", tokens=tokens))


def post(client: Client, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    answer = client.request("POST", "/v1/runs", body)
    return answer.status, answer.json(), dict(answer.headers)


def usage_of(client: Client, query: str = "") -> dict[str, Any]:
    answer = client.request("GET", "/v1/usage" + query)
    assert answer.status == 200, answer.body[:300]
    found: dict[str, Any] = answer.json()
    return found


# --- the ledger, alone -----------------------------------------------------------------------


@pytest.mark.fast
def test_retry_after_is_when_enough_of_the_window_has_passed() -> None:
    now = 1_000_000 * 60.0 + 30  # half a minute into minute 1_000_000
    minute = 1_000_000
    rows = [
        UsageRow("u", minute - 50, 400, 1, 0),  # leaves the hour in 10 minutes
        UsageRow("u", minute - 20, 500, 1, 0),  # in 40
        UsageRow("u", minute, 300, 1, 0),
    ]
    # 1200 ms spent of 1000: once the oldest 400 leave, 800 < 1000
    assert retry_after(rows, now, HOUR, 1000) == math.ceil((minute - 50 + HOUR) * 60 - now)
    # of 500: 400 and 500 must leave
    assert retry_after(rows, now, HOUR, 500) == math.ceil((minute - 20 + HOUR) * 60 - now)
    # the day: the same rows, 1440 minutes
    assert retry_after(rows, now, DAY, 1000) == math.ceil((minute - 50 + DAY) * 60 - now)


@pytest.mark.fast
def test_the_tokens_file_gives_budgets_and_refuses_nonsense(tmp_path: Path) -> None:
    good = tokens_file(
        tmp_path / "good",
        {
            ALICE: {"user": "alice", "cpu_seconds_per_hour": 1.5, "runs_per_minute": 3},
            BOB: {"user": "bob"},
        },
    )
    table = TokenTable.load(good)
    assert table.budgets == {
        "alice": CpuBudget(cpu_seconds_per_hour=1.5, cpu_seconds_per_day=None, runs_per_minute=3)
    }
    for bad in (0, -1, "10", True, float("nan"), 1.5):
        key = "runs_per_minute" if bad == 1.5 else "cpu_seconds_per_day"
        path = tokens_file(tmp_path / f"bad{bad!s}", {ALICE: {"user": "a", key: bad}})
        with pytest.raises(ValueError, match=key):
            TokenTable.load(path)
    clash = tokens_file(
        tmp_path / "clash",
        {
            ALICE: {"user": "alice", "runs_per_minute": 3},
            BOB: {"user": "alice", "runs_per_minute": 4},
        },
    )
    with pytest.raises(ValueError, match="different budgets"):
        TokenTable.load(clash)


@pytest.mark.fast
def test_a_token_budget_adds_to_the_operators_default_field_by_field() -> None:
    default = CpuBudget(cpu_seconds_per_hour=0.5, cpu_seconds_per_day=100.0)
    quotas = Quotas(store=None, default=default, per_user={"u": CpuBudget(runs_per_minute=2)})  # type: ignore[arg-type]
    assert quotas.budget("u") == CpuBudget(0.5, 100.0, 2)
    assert quotas.budget("other") == default


@pytest.mark.fast
def test_runs_per_minute_are_counted_in_the_last_sixty_seconds(tmp_path: Path) -> None:
    async def check() -> None:
        store = SQLiteStore(tmp_path / "runs.db")
        await store.open()
        try:
            assert await store.count_start("u", 1000.0, 2) is None
            assert await store.count_start("u", 1010.0, 2) is None
            assert await store.count_start("u", 1020.0, 2) == pytest.approx(40.0)  # 1000 + 60
            assert await store.count_start("other", 1020.0, 2) is None  # theirs apart
            assert await store.count_start("u", 1060.5, 2) is None  # the first left
            assert await store.spend("u", 5, 700, (60,)) == (700,)
            assert await store.spend("u", 6, 300, (60, 1), runs=1) == (1000, 300)
            assert [(r.minute, r.cpu_ms, r.runs) for r in await store.usage("u", 0)] == [
                (5, 700, 0),
                (6, 300, 1),
            ]
        finally:
            await store.close()

    asyncio.run(check())


@pytest.mark.fast
def test_a_flood_of_refused_starts_reads_nothing_from_the_store(tmp_path: Path) -> None:
    """A user past `runs_per_minute` is refused from memory until the oldest start leaves
    the minute: their flood of requests costs the store (every user's) nothing."""

    async def check() -> None:
        store = SQLiteStore(tmp_path / "runs.db")
        await store.open()
        asked = 0
        count_start = store.count_start

        async def counted(user: str, now: float, per_minute: int) -> float | None:
            nonlocal asked
            asked += 1
            return await count_start(user, now, per_minute)

        store.count_start = counted  # type: ignore[method-assign]
        quotas = Quotas(store, CpuBudget(runs_per_minute=1))
        try:
            assert await quotas.count_start("u") is not None
            for _ in range(100):
                with pytest.raises(QuotaExceeded) as refused:
                    await quotas.count_start("u")
                assert 59 <= refused.value.retry_after <= 60
            assert asked == 2  # the start, then the first refusal
            assert await quotas.count_start("other") is not None  # theirs apart
        finally:
            await store.close()

    asyncio.run(check())


# --- a real gateway --------------------------------------------------------------------------


def test_the_ledger_holds_what_the_records_say(server: GatewayThread) -> None:
    admin = server.client(ADMIN)
    before = usage_of(admin, "?user=root")["users"][0]["last_hour"]
    records = []
    for code in ("x = sum(range(3_000_000))", "bytearray(50_000_000)", "print(1)"):
        status, record, _ = post(admin, {"code": code})
        assert status == 200 and record["status"] == "succeeded", record
        records.append(record)
    (mine,) = usage_of(admin, "?user=root")["users"]
    spent = sum(r["usage"]["cpu_ms"] for r in records) / 1000
    assert mine["last_hour"]["cpu_seconds"] == pytest.approx(before["cpu_seconds"] + spent)
    assert mine["last_hour"]["runs"] == before["runs"] + 3
    assert mine["last_hour"]["cpu_seconds_left"] is None  # no budget
    assert mine["hours"][-1]["peak_memory_bytes"] >= 50_000_000
    assert mine["stored_bytes"]["records"] > 0
    assert mine["budget"] == {
        "cpu_seconds_per_hour": None,
        "cpu_seconds_per_day": None,
        "runs_per_minute": None,
    }


def test_a_run_is_stopped_at_its_users_budget_and_then_refused(server: GatewayThread) -> None:
    alice = server.client(ALICE)
    started = time.time()
    status, record, _ = post(alice, {"code": SPIN.format(seconds=BUDGET_S * 4), "timeout": 60})
    assert status == 200, record
    assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
    assert record["stdout"] == "started\n"  # what it printed before is kept
    spent = record["usage"]["cpu_ms"] / 1000
    # stopped within a second of CPU of the budget
    assert BUDGET_S <= spent <= BUDGET_S + 1.0, spent
    (mine,) = usage_of(alice)["users"]
    assert mine["last_hour"]["cpu_seconds_left"] == 0
    assert mine["budget"]["cpu_seconds_per_hour"] == BUDGET_S
    # the next run is refused until enough of the hour has passed
    status, answer, headers = post(alice, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    wait = int(headers["Retry-After"])
    assert 3600 - (time.time() - started) - 61 <= wait <= 3600, wait
    # a notebook replay too
    notebook = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}
    refused = alice.request("POST", "/v1/notebooks/run", {"notebook": notebook})
    assert refused.status == 429 and refused.json()["error"]["code"] == "quota"


def test_a_replay_is_stopped_at_its_users_budget_between_its_cells(
    server: GatewayThread,
) -> None:
    """A notebook replay is metered as a run is: stopped in the cell that spends the
    budget, the cells before it kept with their outputs, the cells after it not run."""
    grace = server.client(GRACE)
    notebook = notebook_json(
        code_cell_json("before", "print('before')"),
        code_cell_json("spins", SPIN.format(seconds=BUDGET_S * 10)),
        code_cell_json("after", "print('never')"),
    )
    answer = grace.request("POST", "/v1/notebooks/run", {"notebook": notebook, "timeout": 60})
    assert answer.status == 200, answer.body[:500]
    record, cells = answer.json()["run"], answer.json()["notebook"]["cells"]
    assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
    assert BUDGET_S <= record["usage"]["cpu_ms"] / 1000 <= BUDGET_S + 1.0, record["usage"]
    assert cells[0]["outputs"][0]["text"] == "before\n"
    assert "started" in json.dumps(cells[1]["outputs"])  # what the cell printed is kept
    assert cells[2]["outputs"] == [] and cells[2]["execution_count"] is None, cells[2]


def test_a_day_budget_is_held_over_the_rolling_day(server: GatewayThread) -> None:
    erin = server.client(ERIN)
    status, record, _ = post(erin, {"code": SPIN.format(seconds=BUDGET_S * 3), "timeout": 60})
    assert status == 200 and record["kill_reason"] == "cpu_quota", record
    status, answer, headers = post(erin, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    assert 86400 - 120 <= int(headers["Retry-After"]) <= 86400
    (mine,) = usage_of(erin)["users"]
    assert (
        mine["last_day"]["cpu_seconds_left"] == 0 and mine["last_hour"]["cpu_seconds_left"] is None
    )


def test_a_run_deaf_to_interrupts_is_still_stopped_at_the_budget(server: GatewayThread) -> None:
    """A stop is a cancel: an interrupt, then the kernel's end for code that ignores it."""
    carol = server.client(CAROL)
    deaf = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + SPIN.format(seconds=8)
    status, record, _ = post(carol, {"code": deaf, "timeout": 60})
    assert status == 200, record
    assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
    assert BUDGET_S <= record["usage"]["cpu_ms"] / 1000 <= BUDGET_S + 2.0, record["usage"]
    # both windows: the hour's is spent, and the wait is the longest of those spent
    status, answer, headers = post(carol, {"code": "1"})
    assert status == 429 and answer["error"]["code"] == "quota"
    assert 3000 <= int(headers["Retry-After"]) <= 3600


def test_what_takes_no_cancel_ends_with_its_sandbox(server: GatewayThread) -> None:
    """After a failed cell, `result` is read back by a request of its own, which takes no
    cancel: converting it spins here, and the stop kills the sandbox a grace after."""
    code = (
        "import time\n"
        "class Slow:\n"
        "    def tolist(self):\n"
        "        end = time.process_time() + 9\n"
        "        while time.process_time() < end: pass\n"
        "        return 1\n"
        "result = Slow()\n"
        "raise ValueError('then its result is read back')"
    )
    started = time.monotonic()
    status, record, _ = post(server.client(DAVE), {"code": code, "timeout": 60})
    took = time.monotonic() - started
    assert status == 200, record
    assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
    assert record["usage"]["cpu_ms"] / 1000 <= BUDGET_S + 2.5, record["usage"]
    assert took < 8, took  # not the conversion's 9 s, nor the read's 10 s timeout


def test_runs_per_minute_and_another_users_runs(server: GatewayThread) -> None:
    bob = server.client(BOB)
    # what is refused for another reason is no start
    for _ in range(3):
        status, answer, _ = post(bob, {"code": "1", "keep": True, "language": "r"})
        assert status == 400, answer
    for _ in range(2):
        status, record, _ = post(bob, {"code": "print(1)"})
        assert status == 200, record
    status, answer, headers = post(bob, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    assert 1 <= int(headers["Retry-After"]) <= 60
    # a refused body's room in the bodies budget goes back at once
    bodies = server.gateway.services.bodies  # type: ignore[union-attr]
    status, _, _ = post(bob, {"code": "#" * 200_000})
    assert status == 429 and bodies.held_by("bob") == 0
    # bob's refusals cost nobody else anything
    status, record, _ = post(server.client(ADMIN), {"code": "print(2)"})
    assert status == 200 and record["stdout"] == "2\n"


def test_who_sees_whose_usage(server: GatewayThread) -> None:
    heidi, admin = server.client(HEIDI), server.client(ADMIN)
    for client in (heidi, admin):  # each has run something, whatever ran before
        assert post(client, {"code": "print(1)"})[0] == 200
    assert [u["user"] for u in usage_of(heidi)["users"]] == ["heidi"]
    refused = heidi.request("GET", "/v1/usage?user=alice")
    assert refused.status == 403 and refused.json()["error"]["field"] == "user"
    everyone = {u["user"] for u in usage_of(admin)["users"]}
    assert {"heidi", "root"} <= everyone
    assert [u["user"] for u in usage_of(admin, "?user=heidi")["users"]] == ["heidi"]
    assert heidi.request("GET", "/v1/usage?user=a&user=b").status == 400
    # a stranger's requests, refused at the door, name nobody in the metrics
    stranger = server.client("mallory-token-0123456789")
    assert stranger.request("POST", "/v1/runs", {"code": "print(1)"}).status == 401
    metrics = admin.request("GET", "/metrics").body.decode()
    assert 'gateway_user_runs_total{user="heidi"}' in metrics
    assert 'gateway_user_cpu_seconds_total{user="root"}' in metrics
    # the labels are the tokens file's users, a bounded set, whatever was sent
    labelled = set(re.findall(r'^gateway_user_\w+\{user="([^"]*)"\}', metrics, re.M))
    assert labelled and labelled <= USERS, labelled
    assert TICK <= 0.5  # what "within a second of CPU" rests on (DESIGN decision 26)


def test_the_typed_clients_read_usage(server: GatewayThread) -> None:
    from gateway.client import AsyncGatewayClient, GatewayClient

    url = f"http://127.0.0.1:{server.port}"
    with GatewayClient(url, token=ADMIN) as client:
        client.run("print(1)")
        mine = client.usage("root").users[0]
        assert mine.user == "root" and mine.last_hour.runs >= 1
        assert mine.hours[-1].start.tzinfo is not None  # a datetime, in UTC
        assert {u.user for u in client.usage().users} >= {"root"}

    async def read() -> str:
        async with AsyncGatewayClient(url, token=BOB) as client:
            return (await client.usage()).users[0].user

    assert asyncio.run(read()) == "bob"


def test_a_rebuilt_chain_that_spins_is_killed_at_the_budget(tmp_path: Path) -> None:
    """What takes no cancel (a rebuilt chain's code, replayed silently before the run's own)
    ends with its sandbox, a grace after the stop (`STOP_GRACE`)."""
    tokens = tokens_file(tmp_path, {CAROL: {"user": "carol", "cpu_seconds_per_hour": BUDGET_S}})
    server = start_gateway("forkserver", tokens=tokens)
    try:
        carol = server.client(CAROL)
        # spins only when replayed: after `later`, which has not come when it first runs
        later = time.time() + 3
        code = f"import time\nif time.time() > {later}:\n" + "".join(
            "    " + line + "\n" for line in SPIN.format(seconds=30).splitlines()
        )
        status, kept, _ = post(carol, {"code": code, "keep": True})
        assert status == 200 and kept["snapshot"] is not None, kept
        snapshot = kept["snapshot"]["id"]
        assert carol.request("DELETE", f"/v1/snapshots/{snapshot}").status == 204
        time.sleep(max(0.0, later - time.time()) + 0.1)
        status, record, _ = post(
            carol, {"code": "print(1)", "from": snapshot, "rebuild": True, "timeout": 60}
        )
        assert status == 200, record
        assert record["continued_by"] == "replay"
        assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
        assert record["usage"]["cpu_ms"] / 1000 <= BUDGET_S + 2.5, record["usage"]
    finally:
        forget_snapshots(server)
        server.stop()


# the user's code replaces what marks the kernel to be kept: keeping it then spins
KEEP_SPINS = """\
import kernels.python.resume as resume
def keep():
    while True:
        pass
resume.keep = keep
print('ran')
"""


def test_keeping_a_kernel_is_stopped_at_the_budget_as_its_run_is(tmp_path: Path) -> None:
    """Keeping the kernel after the run (`keep`) runs the kernel's code, which the user's
    may have replaced: the budget holds there too (within a second of CPU), and the record
    says why the state was not kept."""
    tokens = tokens_file(tmp_path, {CAROL: {"user": "carol", "cpu_seconds_per_hour": BUDGET_S}})
    server = start_gateway("forkserver", tokens=tokens)
    try:
        carol = server.client(CAROL)
        status, record, _ = post(carol, {"code": KEEP_SPINS, "keep": True, "timeout": 60})
        assert status == 200, record
        assert (record["status"], record["stdout"], record["snapshot"]) == (
            "succeeded",
            "ran\n",
            None,
        )
        assert any("CPU budget ran out" in note for note in record["notes"]), record["notes"]
        assert BUDGET_S <= record["usage"]["cpu_ms"] / 1000 <= BUDGET_S + 1.0, record["usage"]
        status, answer, _ = post(carol, {"code": "print(1)"})
        assert status == 429 and answer["error"]["code"] == "quota", answer
    finally:
        forget_snapshots(server)
        server.stop()


def test_a_run_that_waited_while_its_users_budget_went_never_starts(tmp_path: Path) -> None:
    """A run admitted while its user had CPU left, that waits for a slot (or in the store's
    queue) while their other runs spend the rest, is ended as it would start: `killed`,
    `cpu_quota`, and none of its code ran (it would otherwise spend a tick and a stop's
    grace past the budget)."""
    tokens = tokens_file(tmp_path, {DAVE: {"user": "dave", "cpu_seconds_per_hour": BUDGET_S}})
    server = start_gateway("local", tokens=tokens, max_running_per_user=1)
    try:
        dave = server.client(DAVE)
        spender = api.submit(dave, {"code": SPIN.format(seconds=30), "timeout": 60})
        waiting = api.submit(dave, {"code": "print('ran')"})  # behind it: one slot each
        spent = api.poll_run(dave, spender)
        assert (spent["status"], spent["kill_reason"]) == ("killed", "cpu_quota"), spent
        record = api.poll_run(dave, waiting)
        assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
        assert (record["stdout"], record["started_at"]) == ("", None), record
        assert any(note.startswith("It did not start") for note in record["notes"]), record
    finally:
        server.stop()
