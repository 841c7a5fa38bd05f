"""The pools' bound on the machine's memory (DESIGN.md, "Gateway resources", the pools; decision
14): no refill while less than `pool_min_free_bytes` is available, and idle pooled kernels
are given back; what a run loses is a warm start, never the run. Until now only the warning
at start was tested (`test_pool.py`). Issue 30, item 5.

Against the fake backend (fake_backend.py: scripted kernels on real sockets), with a reserve
larger than any machine's memory, so memory is short from the start, for real
(/proc/meminfo), nothing stubbed. Checked by mutation, each failing the test:
- `_refill` filling whatever `_memory_short` says (the `and not self._memory_short` gone):
  the pool is filled again at once;
- `_check_memory` giving nothing back (its discard loop gone): the idle kernel stays."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.fake_kernel import script
from tests.test_executor_fast import fill_pool, harness, run, single

pytestmark = pytest.mark.fast

MORE_THAN_ANY_MACHINE = 1 << 60


def test_short_of_memory_the_pool_gives_its_kernels_back_and_refills_none(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gateway.execution.pool")

    async def scenario() -> None:
        async with harness(tmp_path, pool_python=1, pool_min_free_bytes=MORE_THAN_ANY_MACHINE) as h:
            pooled = await fill_pool(h)  # started by hand: the refiller has not looked yet
            h.pools.start()  # the refiller: it finds memory short
            await pooled.wait_exit()  # given back: its kernel ends as it is destroyed
            assert pooled.destroyed and h.pools.ready == 0
            record, used = await h.execute(single(script(["stdout", "cold\n"])))
            # a run still runs, on a kernel of its own; the pool starts none meanwhile
            assert record.status == "succeeded" and record.stdout == "cold\n"
            assert used is not pooled
            assert h.backend.sandboxes == [pooled, used], h.backend.sandboxes
            assert h.pools.ready == 0

    run(scenario)
    assert any("memory is short" in r.getMessage() for r in caplog.records)
