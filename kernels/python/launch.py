"""Entry point of the Python kernel: ``python -P -m kernels.python.launch -f FILE ...``.

Imports our startup extension first, while the working folder is not on `sys.path`
(`-P`), so that IPython's later `import kernels.python.startup` (the working folder then
comes first on `sys.path`, as in Jupyter) finds ours in `sys.modules`, never a planted one.

While the kernel starts, `debugpy` cannot be imported: ipykernel otherwise imports it (and
pydevd) for the Debug Adapter Protocol of JupyterLab's visual debugger, which no run can
use (the gateway never sends a `debug_request`), at about 170 ms of CPU per kernel, half
of a kernel's start. ipykernel supports a kernel without debugpy: it leaves "debugger" out
of `kernel_info_reply.supported_features`. Our extension lifts the block once ipykernel
has decided (`startup.unblock_debugpy`), so user code imports debugpy as in Jupyter.
"""

from __future__ import annotations

import sys

sys.modules.setdefault("debugpy", None)  # type: ignore[arg-type]  # None blocks the import

from ipykernel import kernelapp  # noqa: E402  (after the block)

import kernels.python.startup  # noqa: E402, F401  (first of ours: see above)

if __name__ == "__main__":
    kernelapp.launch_new_instance()
