"""What a Python kernel does while it starts (the cold path of issue 10), on every backend."""

from __future__ import annotations

from tests.support import Client

DEBUGGER_MODULES = (
    "import sys\n"
    "loaded = sorted(m for m in sys.modules\n"
    "                if m.split('.')[0] in ('debugpy', 'pydevd', '_pydevd_bundle', '_pydev_bundle'))\n"
    "import debugpy\n"
    "result = {'loaded_at_start': loaded, 'user_import': debugpy.__name__}\n"
)


def test_the_kernel_starts_without_debugpy_yet_user_code_can_import_it(client: Client) -> None:
    """ipykernel's debugger (debugpy and pydevd, about half of a kernel's start in CPU) is
    never imported at start; the block is lifted before user code runs."""
    record = client.run(code=DEBUGGER_MODULES)
    assert record["status"] == "succeeded", record
    assert record["result"] == {"loaded_at_start": [], "user_import": "debugpy"}, record
