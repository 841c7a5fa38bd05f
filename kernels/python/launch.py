"""Entry point of the Python kernel: ``python -P -m kernels.python.launch -f FILE ...``.

Imports our startup extension first, while the working folder is not on `sys.path`
(`-P`), so that IPython's later `import kernels.python.startup` (the working folder then
comes first on `sys.path`, as in Jupyter) finds ours in `sys.modules`, never a planted one.
"""

from __future__ import annotations

from ipykernel import kernelapp

import kernels.python.startup  # noqa: F401  (first: see above)

if __name__ == "__main__":
    kernelapp.launch_new_instance()
