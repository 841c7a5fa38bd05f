"""The soak's short variant (issue 8): 100 runs of every kind (successes, errors, timeouts,
limit kills, floods, cancels, crashes, hostile code) at concurrency 2 against a gateway
process on Docker; every request is answered without a 5xx, nothing is left behind
(containers, volumes, folders, cgroups), and the gateway's descriptors and threads do not
grow. Memory growth is judged on the 1,000-run soak (bench/README.md): over 100 runs the
warm-up is too short to tell growth from caches filling, so the bound here is looser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import require_backend
from tests.support import REPO

pytestmark = [pytest.mark.attack, pytest.mark.serial, pytest.mark.timeout(1500)]


def test_a_100_run_soak_leaves_nothing_and_answers_everything(tmp_path: Path) -> None:
    require_backend("docker")
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--runs",
            "100",
            "--concurrency",
            "2",
            "--max-growth",
            "0.5",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    (written,) = tmp_path.glob("soak-docker-100-*.json")
    result = json.loads(written.read_text())
    assert done.returncode == 0 and result["ok"], (result, done.stderr[-3000:])
    assert not any(result["leftovers"].values()), result["leftovers"]
    assert not result["unexpected"], result["unexpected"]
    # the front-door attacks ran beside the runs, and each was refused or bounded
    assert result["attacks"], "the attacker never ran"
    assert not any("refused 500" in attack for attack in result["attacks"]), result["attacks"]
    assert sum(result["statuses"].values()) == 100
