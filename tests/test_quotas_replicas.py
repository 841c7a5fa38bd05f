"""A user's CPU-seconds budget holds across replicas (issue 34): 50 submissions at once from
one user, split over two `gateway serve` processes on one PostgreSQL, spend at most the
budget plus what the runs admitted could spend before they were stopped, and once it is
spent both replicas refuse with 429 `quota`. The ledger the replicas share holds exactly
what the records say: a budget spent on one replica is refused by the other, which ran
nothing for that user.

The bound (docs/DESIGN.md decision 26): a run is admitted only while the user's window has
CPU left; the ledger takes each run's CPU every `TICK` and answers the user's total with it,
atomically, on either replica; a run whose tick finds the window spent is stopped, which
takes at most `STOP_SLACK` more. So past the budget each admitted run spends at most
(`TICK` + `STOP_SLACK`) x its CPUs (1, the sandbox's default limit)."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.runs.quotas import TICK
from tests.support import Client, GatewayProcess, wait_for
from tests.test_quotas import SPIN, post

ALICE, ADMIN = "alice-token-0123456789", "admin-token-01234567"
BUDGET_S = 2.0
SUBMISSIONS = 50
STOP_SLACK = 1.0  # seconds from the stop to the sandbox's end: interrupt, grace, kill
CPUS = 1  # each sandbox's CPU limit (the default)


@pytest.fixture
def replicas(postgres_dsn: str, tmp_path: Path) -> Iterator[list[GatewayProcess]]:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(
        json.dumps(
            {
                ALICE: {"user": "alice", "role": "user", "cpu_seconds_per_hour": BUDGET_S},
                ADMIN: {"user": "root", "role": "admin"},
            }
        )
    )
    processes = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        processes.append(
            GatewayProcess(
                "local",
                tmp_path / name,
                store=postgres_dsn,
                tokens=tokens,
                allow_local_multi_user=True,
            )
        )
    try:
        for process in processes:
            process.start()
        yield processes
    finally:
        for process in processes:
            process.stop()


def submit(client: Client) -> tuple[int, dict[str, Any]]:
    answer = client.request(
        "POST",
        "/v1/runs",
        {"code": SPIN.format(seconds=10), "timeout": 120, "background": True},
    )
    return answer.status, answer.json()


def test_fifty_submissions_over_two_replicas_keep_to_the_budget(
    replicas: list[GatewayProcess],
) -> None:
    clients = [Client(process.port, ALICE) for process in replicas]
    with concurrent.futures.ThreadPoolExecutor(SUBMISSIONS) as pool:
        answers = list(pool.map(lambda i: submit(clients[i % 2]), range(SUBMISSIONS)))
    admitted = [body["id"] for status, body in answers if status == 202]
    refused = [body["error"]["code"] for status, body in answers if status != 202]
    assert admitted, answers
    assert set(refused) <= {"capacity", "quota"}, refused

    def record(run_id: str) -> dict[str, Any]:
        found: dict[str, Any] = clients[0].request("GET", f"/v1/runs/{run_id}").json()
        return found

    assert wait_for(lambda: all(record(run_id)["finished_at"] for run_id in admitted), timeout=120)
    records = [record(run_id) for run_id in admitted]
    assert {(r["status"], r["kill_reason"]) for r in records} == {("killed", "cpu_quota")}
    # a run still waiting for a slot when the budget went never starts (API.md): it spent
    # nothing and is no run of the ledger's
    ran = [r for r in records if r["started_at"] is not None]
    assert all(r["usage"]["cpu_ms"] is None for r in records if r["started_at"] is None)
    spent = sum(r["usage"]["cpu_ms"] for r in ran) / 1000
    bound = BUDGET_S + len(admitted) * (TICK + STOP_SLACK) * CPUS
    assert BUDGET_S <= spent <= bound, (spent, bound, len(admitted))
    # spent: both replicas refuse, saying when to come back
    for client in clients:
        status, body = submit(client)
        assert status == 429 and body["error"]["code"] == "quota", body
    # the ledger both share is what the records say
    (usage,) = (
        Client(replicas[1].port, ADMIN).request("GET", "/v1/usage?user=alice").json()["users"]
    )
    assert usage["last_hour"]["cpu_seconds"] == pytest.approx(spent)
    assert usage["last_hour"]["runs"] == len(ran)


def test_a_budget_spent_on_one_replica_is_refused_by_the_other(
    replicas: list[GatewayProcess],
) -> None:
    """One ledger for the fleet, not one per replica: B ran nothing for alice, so it knows
    what she spent on A only through the ledger (above, each replica ran some of her runs
    and would refuse her with a ledger of its own as well)."""
    a, b = (Client(process.port, ALICE) for process in replicas)
    started = time.time()
    status, record, _ = post(a, {"code": SPIN.format(seconds=BUDGET_S * 4), "timeout": 60})
    assert status == 200, record
    assert (record["status"], record["kill_reason"]) == ("killed", "cpu_quota"), record
    status, answer, headers = post(b, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    # when the minute A's run spent in leaves B's rolling hour
    wait = int(headers["Retry-After"])
    assert 0 < 3600 - (time.time() - started) - 61 <= wait <= 3600, wait
    (usage,) = (
        Client(replicas[1].port, ADMIN).request("GET", "/v1/usage?user=alice").json()["users"]
    )
    assert usage["last_hour"]["cpu_seconds"] == pytest.approx(record["usage"]["cpu_ms"] / 1000)
    assert (usage["last_hour"]["runs"], usage["last_hour"]["cpu_seconds_left"]) == (1, 0)
