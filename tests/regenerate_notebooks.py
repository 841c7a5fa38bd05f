"""Store in notebooks/ the outputs that nbclient, the reference executor, gives each golden
notebook (`python -m tests.regenerate_notebooks`), then review the diff. The versions of the
executor and of the libraries that shape the outputs are written into each notebook's
metadata (`reference_executor`). test_notebooks.py checks that the stored outputs are still
what nbclient gives."""

from __future__ import annotations

import importlib.metadata
import json

import nbformat

from tests.notebook_compare import execute_reference
from tests.test_notebooks import GOLDEN, NOTEBOOKS

VERSIONED = ("nbclient", "ipykernel", "ipython", "matplotlib", "pandas", "numpy")


def main() -> None:
    versions = {name: importlib.metadata.version(name) for name in VERSIONED}
    for name, (options, _) in sorted(GOLDEN.items()):
        path = NOTEBOOKS / name
        stored = json.loads(path.read_text(encoding="utf-8"))
        executed, _ = execute_reference(stored, allow_errors=bool(options.get("allow_errors")))
        executed["metadata"]["reference_executor"] = versions
        nb = nbformat.from_dict(executed)
        nbformat.validate(nb)
        path.write_text(nbformat.writes(nb) + "\n", encoding="utf-8")
        print(f"{name}: stored nbclient's outputs")


if __name__ == "__main__":
    main()
