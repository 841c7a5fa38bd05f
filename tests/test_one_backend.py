"""The suite's `one_backend` marker (conftest.OneBackend): a marked test runs on the one
chosen backend and its other backends' instances are deselected; an unmarked test runs on
each backend. Seen from a real collection of the suite's own modules, in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
# test_runs: some tests marked, most not; test_record_quota: none marked
MODULES = ("tests/test_runs.py", "tests/test_record_quota.py")


def collected(**env: str) -> tuple[int, list[str], str]:
    answer = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            *MODULES,
        ],
        cwd=ROOT,
        env={**os.environ, "GATEWAY_TEST_BACKENDS": "local,docker", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    ids = [line for line in answer.stdout.splitlines() if "::" in line]
    return answer.returncode, ids, answer.stderr + answer.stdout


def backends(ids: list[str]) -> Counter[str]:
    """How many of `ids` are of each backend."""
    return Counter(m.group(1) for i in ids if (m := re.search(r"\[(local|docker)", i)))


def backends_of(ids: list[str], test: str) -> Counter[str]:
    return backends([i for i in ids if f"::{test}[" in i])


def test_a_marked_test_runs_on_the_chosen_backend_and_the_rest_on_each() -> None:
    for chosen, other in (("local", "docker"), ("docker", "local")):
        code, ids, _ = collected(GATEWAY_TEST_ONE_BACKEND=chosen)
        assert code == 0, ids
        marked = backends_of(ids, "test_result_then_output_are_read_back")
        assert marked == Counter({chosen: 1}), (chosen, marked)
        # unmarked, in the same module and in a module with no mark at all
        assert backends_of(ids, "test_nothing_carries_over_between_runs") == Counter(
            {chosen: 1, other: 1}
        )
        unmarked = [i for i in ids if i.startswith("tests/test_record_quota.py")]
        assert {"local", "docker"} <= set(backends(unmarked)), unmarked


def test_a_backend_that_is_not_tested_cannot_be_chosen() -> None:
    code, _, said = collected(GATEWAY_TEST_ONE_BACKEND="forkserver")
    assert code == pytest.ExitCode.USAGE_ERROR, said
    assert "GATEWAY_TEST_ONE_BACKEND=forkserver is not one of ('local', 'docker')" in said
