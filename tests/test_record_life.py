"""A run's life is owned by its record (gateway/models/record.py): `status` moves only
through `start`, `cancel_unstarted`, `stop_unstarted`, `fail` and `finish`, each allowed
only from where the life allows it; and nothing else in the gateway assigns a record's status."""

from __future__ import annotations

import ast
import datetime as dt
import re

import pytest

from gateway.models.record import IllegalMove, RunRecord, Verdict
from tests.support import REPO

pytestmark = pytest.mark.fast

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def fresh() -> RunRecord:
    return RunRecord(id="run_00000000000000000001", language="python")


def test_a_run_is_queued_then_running_with_its_start_time() -> None:
    record = fresh()
    assert record.status == "queued" and record.started_at is None
    record.start()
    assert record.status == "running"
    assert record.started_at is not None and RFC3339.match(record.started_at)
    assert record.finished_at is None


def test_finishing_sets_everything_the_verdict_says_and_the_end() -> None:
    record = fresh()
    record.start()
    record.error = {"ename": "SystemExit", "evalue": "0", "traceback": []}
    record.finish(Verdict("succeeded", exit_code=0, notes=("a note",), keep_error=False))
    assert (record.status, record.exit_code, record.error) == ("succeeded", 0, None)
    assert record.notes == ["a note"] and record.success
    assert record.finished_at is not None
    started = dt.datetime.fromisoformat(record.started_at or "")
    assert dt.datetime.fromisoformat(record.finished_at) >= started
    assert record.usage.wall_ms >= 0


@pytest.mark.parametrize(
    ("verdict", "status", "kill_reason", "timed_out"),
    [
        (Verdict("timed_out", kill_reason="timeout", timed_out=True), "timed_out", "timeout", True),
        (Verdict("killed", kill_reason="memory"), "killed", "memory", False),
        (Verdict("cancelled", kill_reason="cancelled"), "cancelled", "cancelled", False),
        (Verdict("failed", exit_code=3), "failed", None, False),
    ],
)
def test_every_final_status_is_reached_by_finishing(
    verdict: Verdict, status: str, kill_reason: str | None, timed_out: bool
) -> None:
    record = fresh()
    record.start()
    record.finish(verdict)
    assert (record.status, record.kill_reason, record.timed_out) == (
        status,
        kill_reason,
        timed_out,
    )


def test_a_run_cancelled_while_it_waited_never_started() -> None:
    record = fresh()
    record.cancel_unstarted("cancelled before it started")
    assert (record.status, record.kill_reason) == ("cancelled", "cancelled")
    assert record.started_at is None and record.finished_at is not None
    assert record.notes == ["cancelled before it started"]


def test_a_run_whose_users_budget_went_while_it_waited_is_killed_unstarted() -> None:
    record = fresh()
    record.stop_unstarted("cpu_quota", "It did not start: the budget was spent.")
    assert (record.status, record.kill_reason) == ("killed", "cpu_quota")
    assert record.started_at is None and record.finished_at is not None
    started = fresh()
    started.start()
    with pytest.raises(IllegalMove):
        started.stop_unstarted("cpu_quota", "too late")  # it started: the meter stops it


@pytest.mark.parametrize("started", [False, True])
def test_the_gateway_can_fail_a_run_queued_or_running(started: bool) -> None:
    record = fresh()
    if started:
        record.start()
    record.fail("no kernel could start")
    assert (record.status, record.exit_code) == ("failed", None)
    assert record.notes == ["no kernel could start"] and record.finished_at is not None


def test_moves_the_life_does_not_allow_are_refused() -> None:
    record = fresh()
    with pytest.raises(IllegalMove):
        record.finish(Verdict("succeeded", exit_code=0))  # never ran
    with pytest.raises(IllegalMove):
        record.finish(Verdict("failed", exit_code=1))  # never ran, whatever the verdict
    record.start()
    with pytest.raises(IllegalMove):
        record.finish(Verdict("running"))  # a verdict is final
    with pytest.raises(IllegalMove):
        record.start()  # already running
    with pytest.raises(IllegalMove):
        record.cancel_unstarted("too late")  # it started
    record.finish(Verdict("succeeded", exit_code=0))
    for move in (
        record.start,
        lambda: record.fail("after the end"),
        lambda: record.finish(Verdict("failed", exit_code=1)),
    ):
        with pytest.raises(IllegalMove):
            move()
    assert record.status == "succeeded"  # a refused move changes nothing


def test_nothing_but_the_record_assigns_a_status() -> None:
    """`grep` finds one writer of `status`: assignments to `<something>.status` in the
    gateway's code, outside the record's own module, are refused here (the client side's own
    objects, which are not records, excepted; and an error's HTTP status, set in
    `gateway/errors.py` as the class is made or, for an answer the client met, as the error
    is)."""
    writers = []
    for path in sorted((REPO / "gateway").rglob("*.py")):
        # an error's HTTP status (errors.py) is no record's, nor the client side's objects
        client_side = (REPO / "gateway" / "client", REPO / "gateway" / "commands")
        if path.name in ("record.py", "errors.py") or any(
            path.is_relative_to(side) for side in client_side
        ):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if (
                        isinstance(leaf, ast.Attribute)
                        and leaf.attr == "status"
                        and not (isinstance(leaf.value, ast.Name) and leaf.value.id == "cls")
                    ):
                        writers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not writers, writers
