"""What a run keeps when it is stopped, at the edge (issue 30, item 5).

- The deadline (API.md: partial output on timeout; DESIGN.md decision 4): at the deadline
  the kernel is interrupted and given `interrupt_grace` seconds to flush before it is killed.
  So a `finally:` that prints when the interrupt lands is kept, and so is everything the
  code printed up to the deadline, although ipykernel sends stdout only every 0.2 s.
  Checked by mutation: with the wait for the grace removed from `KernelSession._interrupt`
  (`execution/session.py`), both tests fail (`cleanup` and the last ~0.2 s of prints lost).
- A cancel is a stop (`execution/executor.py`): a notebook cancelled during Cell 2 says so,
  "The run ended during In [2]. The cells after it did not run.". Checked by
  mutation: with a cancelled cell not counted as a stop (the loop goes on to find the cancel
  before the next cell), only that note goes missing, and both tests fail.

Real kernels on the session's local gateway (the deadline and a cancel are the gateway's,
the same on every backend), and the executor against the fake kernel."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from tests.api import code_notebook
from tests.fake_kernel import script
from tests.stream_client import connect
from tests.support import Client, GatewayThread
from tests.test_executor_fast import harness, notebook, run

CLEANUP = """
import time
try:
    print('started', flush=True)
    time.sleep(100)
finally:
    print('cleanup')
"""


def test_a_finally_that_prints_when_the_deadline_interrupts_is_kept(
    local_gateway: GatewayThread,
) -> None:
    record = local_gateway.client().run(code=CLEANUP, timeout=1)
    assert record["status"] == "timed_out" and record["timed_out"], record
    assert record["stdout"] == "started\ncleanup\n", record["stdout"]


# Counts as fast as it can, printing each number (stdout is sent every 0.2 s) and then
# writing it to a file (atomically: an interrupt never leaves it half written). The file is
# read back after the timeout: the last number the code wrote, so printed before.
COUNT = """
import os, time
i = 0
while True:
    print(i)
    with open('count.tmp', 'w') as f:
        f.write(str(i))
    os.replace('count.tmp', 'count')
    i += 1
    time.sleep(0.001)
"""


def test_what_was_printed_up_to_the_deadline_arrives(local_gateway: GatewayThread) -> None:
    record = local_gateway.client().run(code=COUNT, timeout=1, return_files=["count"])
    assert record["status"] == "timed_out", record
    (counted,) = record["files"]
    assert counted["path"] == "count" and "content" in counted, counted
    printed = [int(line) for line in record["stdout"].split()]
    assert printed == list(range(len(printed)))  # nothing lost on the way
    # every number written was printed first, and arrived: none of the last ones is lost
    assert printed[-1] >= int(counted["content"]), (printed[-5:], counted["content"])


# --- a cancel is a stop ------------------------------------------------------------------

STOPPED = "The run ended during In [2]. The cells after it did not run."


def test_a_notebook_cancelled_during_a_cell_says_which_and_that_the_rest_did_not_run(
    local_gateway: GatewayThread,
) -> None:
    nb = code_notebook(
        ("print('a')", []),
        ("import time\nprint('waiting', flush=True)\ntime.sleep(600)", []),
        ("print('never')", []),
    )

    async def main() -> dict[str, Any]:
        async with connect(local_gateway.port) as stream:
            stream.send({"type": "notebook", "ref": 1, "notebook": nb, "timeout": 300})
            accepted = await stream.until(lambda e: e["type"] == "accepted")
            await stream.until(lambda e: e["type"] == "output" and e["index"] == 1)
            stream.send({"type": "cancel", "id": accepted["id"]})
            done = await stream.done(1)
        record: dict[str, Any] = done["run"]
        return record

    record = asyncio.run(main())
    assert record["status"] == "cancelled", record
    assert STOPPED in record["notes"], record["notes"]
    # and read back as it was stored
    stored = Client(local_gateway.port).request("GET", f"/v1/runs/{record['id']}").json()
    assert STOPPED in stored["notes"], stored["notes"]


def test_a_cancel_during_a_cell_is_a_stop_in_the_executor(tmp_path: Path) -> None:
    """The same against the fake kernel, in a fraction of a second."""

    async def scenario() -> None:
        async with harness(tmp_path) as h:
            cancel = asyncio.Event()
            first = script(["stdout", "a\n"])
            waits = script(["mark", "second"], ["wait", "never"])
            never = script(["stdout", "never\n"])
            program = notebook((first, []), (waits, []), (never, []))
            running = asyncio.ensure_future(h.execute(program, cancel=cancel))
            await h.backend.signals.mark("second").wait()
            cancel.set()
            record, sandbox = await running
        assert record.status == "cancelled" and never not in sandbox.executed
        assert STOPPED in record.notes, record.notes

    run(scenario)
