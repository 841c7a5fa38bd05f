"""Issue 34: a user whose budget is spent cannot slow another user.

The attack: mallory spends her CPU-seconds, then floods the gateway with submissions (POST
/v1/runs and /v1/notebooks/run, `run` messages on WebSockets) from 14 threads as fast as
they are answered, each refused 429 `quota`; trudy, whose runs per minute are spent, floods
beside her from 2 more. A refusal is answered from what the gateway remembers of the first
(`Quotas.admit`, `Quotas.count_start`: until the window frees, nothing is read from the
store), so the flood
costs the gateway what any refused request costs, on the event loop all users share.
Bob, who has no budget, runs `print(1)` one after another before and during the flood: his
runs all succeed and take at most `SLOWDOWN` times as long, plus `SLACK_S`.

The flood is a process of its own (`FLOOD`), as an attacker's clients are: its threads
would otherwise take the GIL from the gateway, which runs in this process (so that the test
can see which store calls the flood causes)."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.store.base import RecordStore
from tests import census
from tests.conftest import start_gateway
from tests.support import Client, GatewayThread, serving
from tests.test_quotas import SPIN, post, tokens_file

pytestmark = [pytest.mark.attack, pytest.mark.serial]  # times another user's answers

MALLORY, TRUDY = "mallory-token-0123456789", "trudy-token-0123456789ab"
BOB = "bob-token-0123456789abcd"
MALLORYS_BUDGET_S = 0.5  # CPU-seconds per hour
BOBS_RUNS = 15  # timed before the flood, and again during it
# mallory's flooding threads by what they send, and trudy's
FLOOD_PLAN = [
    ("mallory", MALLORY, "runs", 10),
    ("mallory", MALLORY, "notebooks", 2),
    ("mallory", MALLORY, "stream", 2),
    ("trudy", TRUDY, "runs", 2),
]
# Bob's median run under the flood, against his median before it. Most of a run's time is
# its kernel's start (no warm pools here), CPU in a process of its own; on the 2-core
# machines the suite is measured on, the flooding clients and the loop answering them take
# one core, so his kernels start on what is left: up to twice as long. SLACK_S is for the
# loop's turns his run waits behind refusals: each turn answers at most one request per
# flooding connection (16, about 2 ms each), and a run waits for some 16 turns (a refusal
# that held the loop 50 ms made each of his runs 13 s: 16 x 16 x 50 ms), so about 0.5 s;
# twice that, as the machine is shared with other work. Measured there: 0.39-0.59 s
# before, 0.81-1.44 s during.
SLOWDOWN = 2.0
SLACK_S = 1.0

# One attacker's clients: `argv[2]`'s plan of threads, each sending as soon as its last
# answer came, until stdin ends; then what they were answered, counted, as JSON.
FLOOD = r"""
import collections, json, sys, threading, time
from tests.support import Client
from tests.ws_client import RawStream

port, plan = int(sys.argv[1]), json.loads(sys.argv[2])
NOTEBOOK = {"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}
answers, lock, stop = collections.Counter(), threading.Lock(), threading.Event()

def count(key):
    with lock:
        answers[key] += 1

def answer_of(response):
    error = response.json().get("error", {}) if response.status != 200 else {}
    return f"{response.status} {error.get('code', '')}".strip()

def posting(who, token, kind):
    client = Client(port, token)
    path, body = {
        "runs": ("/v1/runs", {"code": "print(3)"}),
        "notebooks": ("/v1/notebooks/run", {"notebook": NOTEBOOK}),
    }[kind]
    while not stop.is_set():
        try:
            count(f"{who} {kind} {answer_of(client.request('POST', path, body))}")
        except OSError as exc:
            count(f"{who} {kind} {type(exc).__name__}")

def streaming(who, token, kind):
    stream = RawStream(port, {"Authorization": f"Bearer {token}"})
    try:
        sent = 0
        while not stop.is_set():
            sent += 1
            stream.send({"type": "run", "ref": f"r{sent}", "code": "print(3)"})
            event = stream.recv()
            code = event.get("error", {}).get("code", "")
            count(f"{who} {kind} {event['type']} {code}".strip())
    except OSError as exc:
        count(f"{who} {kind} {type(exc).__name__}")
    finally:
        stream.close()

threads = [
    threading.Thread(target=streaming if kind == "stream" else posting, args=(who, token, kind))
    for who, token, kind, n in plan
    for _ in range(n)
]
for thread in threads:
    thread.start()
while sum(answers.values()) < len(threads):
    time.sleep(0.01)
print("flooding", flush=True)
sys.stdin.read()
stop.set()
for thread in threads:
    thread.join()
print(json.dumps(answers))
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[GatewayThread]:
    tokens = tokens_file(
        tmp_path,
        {
            MALLORY: {"user": "mallory", "cpu_seconds_per_hour": MALLORYS_BUDGET_S},
            TRUDY: {"user": "trudy", "runs_per_minute": 1},
            BOB: {"user": "bob"},
        },
    )
    yield from serving(start_gateway("local", tokens=tokens))


def spend_mallorys_budget(server: GatewayThread) -> None:
    """A run stopped at her budget, then a refusal (the one that reads the store)."""
    mallory = server.client(MALLORY)
    spin = {"code": SPIN.format(seconds=MALLORYS_BUDGET_S * 4), "timeout": 60}
    status, record, _ = post(mallory, spin)
    assert status == 200 and record["kill_reason"] == "cpu_quota", record
    status, answer, headers = post(mallory, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    assert 0 < int(headers["Retry-After"]) <= 3600


def spend_trudys_minute(server: GatewayThread) -> float:
    """Her one start of the minute, then a refusal (the one that reads the store); when the
    start was made (her next is admitted a minute on)."""
    trudy = server.client(TRUDY)
    started = time.monotonic()
    status, record, _ = post(trudy, {"code": "print(1)"})
    assert status == 200 and record["status"] == "succeeded", record
    status, answer, headers = post(trudy, {"code": "print(1)"})
    assert status == 429 and answer["error"]["code"] == "quota", answer
    assert 0 < int(headers["Retry-After"]) <= 60
    return started


def bobs_runs(client: Client, slower_than: float = math.inf) -> list[float]:
    """Seconds each of `BOBS_RUNS` runs of `print(1)` took, one after another, each asserted
    to succeed; fewer once more than half took longer than `slower_than` (their median is
    then longer, whatever the rest would take: a broken gateway fails in seconds)."""
    took: list[float] = []
    while len(took) < BOBS_RUNS and sum(t > slower_than for t in took) <= BOBS_RUNS // 2:
        started = time.monotonic()
        status, record, _ = post(client, {"code": "print(1)"})
        took.append(time.monotonic() - started)
        assert status == 200 and record["stdout"] == "1\n", record
    return took


def summary(took: list[float]) -> str:
    p90 = statistics.quantiles(took, n=10, method="inclusive")[-1]
    return f"median {statistics.median(took):.3f} s, p90 {p90:.3f} s, max {max(took):.3f} s"


@contextlib.contextmanager
def flooding(port: int) -> Iterator[collections.Counter[str]]:
    """`FLOOD_PLAN`'s clients, in a process of their own, sending while the block runs; then
    what they were answered, counted ("mallory runs 429 quota": n)."""
    plan = json.dumps(FLOOD_PLAN)
    answers: collections.Counter[str] = collections.Counter()
    with census.harness_owned("the quota flood's clients"):
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, str(port), plan],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).parent.parent,
        )
    assert flood.stdin is not None and flood.stdout is not None
    with flood:  # its pipes closed, and the process waited for, however the block ends
        try:
            assert flood.stdout.readline() == "flooding\n"
            yield answers
        finally:
            flood.stdin.close()  # the clients stop, and say what they were answered
            found = flood.stdout.read()
            assert flood.wait(120) == 0
    answers.update(json.loads(found))


@contextlib.contextmanager
def calls_for(store: RecordStore, *users: str) -> Iterator[collections.Counter[str]]:
    """The store's calls that name one of `users` while the block runs, by user and method
    ("mallory spent": n; the real store answers each: its coroutine methods are wrapped on
    the instance, counting)."""
    calls: collections.Counter[str] = collections.Counter()

    def counted(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def call(*args: Any, **kwargs: Any) -> Any:
            for user in users:
                if user in args or user in kwargs.values():
                    calls[f"{user} {name}"] += 1
            return await method(*args, **kwargs)

        return call

    names = [
        name
        for name, method in inspect.getmembers(type(store), inspect.iscoroutinefunction)
        if not name.startswith("_")
    ]
    for name in names:
        setattr(store, name, counted(name, getattr(store, name)))
    try:
        yield calls
    finally:
        for name in names:
            delattr(store, name)


@pytest.mark.timeout(300)  # refusals that hold the loop make bob's runs 13 s: 8 to fail
def test_a_spent_users_flood_of_refusals_does_not_slow_another_user(
    server: GatewayThread,
) -> None:
    spend_mallorys_budget(server)
    bob = server.client(BOB)
    before = bobs_runs(bob)
    bound = SLOWDOWN * statistics.median(before) + SLACK_S
    assert server.gateway.services is not None
    store = server.gateway.services.runs.quotas.store
    trudys_start = spend_trudys_minute(server)
    with calls_for(store, "mallory", "trudy") as reads, flooding(server.port) as answers:
        during = bobs_runs(bob, slower_than=bound)
    measured = f"bob before: {summary(before)}; during: {summary(during)}; flood: {answers}"
    print(measured)
    assert statistics.median(during) <= bound, (bound, measured)
    # every one of mallory's was refused for her budget: hundreds, none read the store
    mallorys = {key: n for key, n in answers.items() if key.startswith("mallory")}
    assert set(mallorys) == {
        "mallory runs 429 quota",
        "mallory notebooks 429 quota",
        "mallory stream error quota",
    }, measured
    assert sum(mallorys.values()) >= 300, measured
    assert not [key for key in reads if key.startswith("mallory")], reads
    # trudy's for her runs per minute, but the one start each minute after hers gives her
    trudys = {key: n for key, n in answers.items() if key.startswith("trudy")}
    assert set(trudys) <= {"trudy runs 429 quota", "trudy runs 200"}, measured
    assert trudys.get("trudy runs 429 quota", 0) >= 50, measured
    admitted = trudys.get("trudy runs 200", 0)
    minutes = (time.monotonic() - trudys_start) / 60
    assert admitted <= int(minutes), (minutes, measured)
    # (a freed minute's request reads the store, to count her start there)
    assert admitted or not [key for key in reads if key.startswith("trudy")], reads
