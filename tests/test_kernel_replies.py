"""What a cell's execute_reply claims is the kernel's word: hostile input. An exit code that
is not a whole number of 32 bits is a failure (1), never a gateway error (a forged
`"exit_code": "x"` was a 500) nor a number the record store cannot hold."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.execution.result import exit_code_of

pytestmark = pytest.mark.fast


@pytest.mark.parametrize(
    ("claimed", "code"),
    [
        (0, 0),
        (3, 3),
        (-3, -3),
        ("4", 4),
        (" 5 ", 5),
        ("x", 1),
        (None, 1),
        ([], 1),
        ({"a": 1}, 1),
        (1.5, 1),
        (10**40, 1),
        (2**31, 1),
        ("9" * 5000, 1),
    ],
)
def test_an_exit_code_the_kernel_claims(claimed: Any, code: int) -> None:
    assert exit_code_of({"status": "ok", "exit_code": claimed}) == code


@pytest.mark.parametrize(
    ("evalue", "code"), [("", 0), ("None", 0), ("7", 7), ("no", 1), ("9" * 30, 1)]
)
def test_a_system_exit_the_kernel_reports(evalue: str, code: int) -> None:
    reply = {"status": "error", "ename": "SystemExit", "evalue": evalue}
    assert exit_code_of(reply) == code
