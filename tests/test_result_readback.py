"""How `result` comes back from ipykernel: as a user expression of the last cell's own
request when that cell succeeds (no second round trip), else with a silent request of its
own. Counted at the protocol boundary: a spy on the real `KernelClient.execute`, every
request still sent to the real kernel."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gateway.execution.kernel import KernelClient
from gateway.execution.value import RESULT_EXPRESSION, evaluated_result
from tests.support import GatewayThread

# the gateway's promises above the sandbox: one backend shows them (conftest.OneBackend)
pytestmark = pytest.mark.one_backend

Sent = list[tuple[int, str, bool, dict[str, str] | None]]


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[Sent]:
    """Every execute_request any kernel client sends: (client, code, silent, expressions)."""
    requests: Sent = []
    original = KernelClient.execute

    def spy(self: KernelClient, code: str, **kw: Any) -> str:
        requests.append((id(self), code, kw.get("silent", False), kw.get("user_expressions")))
        return original(self, code, **kw)

    monkeypatch.setattr(KernelClient, "execute", spy)
    yield requests


def of_run(sent: Sent, code: str) -> Sent:
    """The requests sent to the kernel that ran `code` (a pool's refills use other kernels)."""
    clients = {client for client, source, _, _ in sent if source == code}
    assert len(clients) == 1, sent
    return [request for request in sent if request[0] in clients]


def test_a_succeeding_run_gets_its_result_in_the_cells_own_reply(
    gateway: GatewayThread, sent: Sent
) -> None:
    code = "result = {'answer': 6 * 7}"
    record = gateway.client().run(code=code)
    assert record["status"] == "succeeded" and record["result"] == {"answer": 42}, record
    requests = of_run(sent, code)
    assert [(source, silent) for _, source, silent, _ in requests] == [(code, False)]
    assert RESULT_EXPRESSION in (requests[0][3] or {})


def test_a_failing_run_still_gets_its_result_with_a_request_of_its_own(
    gateway: GatewayThread, sent: Sent
) -> None:
    """ipykernel evaluates no user expression after a failed cell: the gateway asks again."""
    code = "result = 5\nraise ValueError('late')"
    record = gateway.client().run(code=code)
    assert record["status"] == "failed" and record["result"] == 5, record
    requests = of_run(sent, code)
    assert [(source, silent) for _, source, silent, _ in requests] == [(code, False), ("", True)]


def test_a_replay_asks_for_result_with_its_last_cell_only(
    gateway: GatewayThread, sent: Sent
) -> None:
    cells = ["x = 20", "x += 1", "result = x * 2"]
    notebook = {
        "nbformat": 4,
        "nbformat_minor": 5,
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "cells": [
            {"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": source,
             "outputs": [], "execution_count": None}
            for i, source in enumerate(cells)
        ],
    }  # fmt: skip
    response = gateway.client().request("POST", "/v1/notebooks/run", {"notebook": notebook})
    assert response.status == 200, response.body[:2000]
    assert response.json()["run"]["result"] == 42, response.body[:2000]
    requests = of_run(sent, cells[0])
    assert [(source, bool(expressions)) for _, source, _, expressions in requests] == [
        ("x = 20", False),
        ("x += 1", False),
        ("result = x * 2", True),
    ]


def test_what_converting_the_result_prints_is_the_runs_own_output(
    gateway: GatewayThread,
) -> None:
    """`result` is evaluated right after the code, in the same request: a conversion of the
    user's own (`tolist`, `to_dict`) that prints is output of the run, like the code's."""
    code = (
        "class Loud:\n"
        "    def tolist(self):\n"
        "        print('converting')\n"
        "        return [1, 2]\n"
        "result = Loud()\n"
    )
    record = gateway.client().run(code=code)
    assert record["result"] == [1, 2], record
    assert record["stdout"] == "converting\n", record


def test_a_result_whose_conversion_fails_in_the_kernel_is_null_with_a_note(
    gateway: GatewayThread,
) -> None:
    """A conversion of the user's own that raises (not a TypeError: that is "not
    JSON-serialisable"), or our half of `result` replaced by one that raises."""
    client = gateway.client()
    code = (
        "class Odd:\n    def tolist(self):\n        raise AttributeError('no list')\nresult = Odd()"
    )
    record = client.run(code=code)
    assert record["status"] == "succeeded" and record["result"] is None, record
    note = "`result` could not be read back from the kernel (AttributeError: no list)."
    assert note in record["notes"], record["notes"]
    code = (
        "import kernels.python.startup as startup\n"
        "def broken(max_bytes=None):\n"
        "    raise RuntimeError('x' * 10**6)\n"
        "startup.result_value = broken\n"
        "result = 1\n"
    )
    record = client.run(code=code)
    [note] = [n for n in record["notes"] if "could not be read back" in n]
    assert "RuntimeError: xxx" in note and len(note) < 400, note


@pytest.mark.parametrize(
    "reply",
    [
        None,
        [],
        "ok",
        {"status": "error", "user_expressions": {RESULT_EXPRESSION: {"data": {}}}},
        {"status": "ok"},
        {"status": "ok", "user_expressions": []},
        {"status": "ok", "user_expressions": {"other": {}}},
    ],
)
def test_a_reply_without_the_expression_reads_as_none(reply: Any) -> None:
    """None sends the gateway to ask with a request of its own (or, then, to note that
    `result` could not be read back); a kernel's reply is hostile input, never a 500."""
    assert evaluated_result(reply) is None


@pytest.mark.parametrize("evaluated", [None, 7, "x", ["status"]])
def test_an_expression_that_is_no_object_reads_as_no_value(evaluated: Any) -> None:
    reply = {"status": "ok", "user_expressions": {RESULT_EXPRESSION: evaluated}}
    assert evaluated_result(reply) == {}
