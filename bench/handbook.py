"""The Python Data Science Handbook's chapters replayed in the gateway (issue 23): which
cells fail, and why, on a kernel image.

The notebooks are not in this repository (their text is CC-BY-NC-ND): give a checkout of
jakevdp/PythonDataScienceHandbook (its `notebooks/` folder). Every notebook is replayed with
`POST /v1/notebooks/run` and `allow_errors` on the Docker backend (the image of
GATEWAY_DOCKER_IMAGE, else gateway-kernel:latest), with the files of its `data/` folder
and its helper modules staged; each failing cell is counted by its error's name. The
promise checked: no `ModuleNotFoundError` or `ImportError` (what is left are the book's own
errors: styles renamed by newer matplotlib, downloads without network). Results (JSON) go
to bench/results/.

    .venv/bin/python bench/handbook.py PATH/TO/notebooks [--chapters 04,05] [--backend docker]
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.support import DOCKER_IMAGE, GatewayThread  # noqa: E402

MISSING_MODULE = ("ModuleNotFoundError", "ImportError")
DATA_LIMIT = 8 * 1024 * 1024  # bytes of data files staged per notebook


def data_files(folder: Path) -> list[dict[str, str]]:
    """The notebooks' `data/` folder and helper modules (`helpers_05_08.py`), as a run's
    files (small files only)."""
    files, total = [], 0
    for path in sorted([*folder.glob("data/*"), *folder.glob("*.py")]):
        if not path.is_file() or total + path.stat().st_size > DATA_LIMIT:
            continue
        total += path.stat().st_size
        content = base64.b64encode(path.read_bytes()).decode("ascii")
        name = path.relative_to(folder).as_posix()
        files.append({"path": name, "content": content, "encoding": "base64"})
    return files


def errors_of(notebook: dict[str, Any]) -> list[dict[str, Any]]:
    found = []
    for index, cell in enumerate(notebook["cells"]):
        for output in cell.get("outputs", []) if cell["cell_type"] == "code" else []:
            if output.get("output_type") == "error":
                first = "".join(cell["source"]).strip().splitlines()[:1]
                found.append(
                    {
                        "cell": index,
                        "ename": output.get("ename"),
                        "evalue": str(output.get("evalue"))[:200],
                        "source": first[0][:100] if first else "",
                    }
                )
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", type=Path, help="the Handbook's notebooks/ folder")
    parser.add_argument("--chapters", default="04,05")
    parser.add_argument("--backend", default="docker")
    parser.add_argument("--cell-timeout", type=float, default=240)
    args = parser.parse_args()
    chapters = tuple(f"{c.strip()}." for c in args.chapters.split(","))
    paths = sorted(p for p in args.notebooks.glob("*.ipynb") if p.name.startswith(chapters))
    files = data_files(args.notebooks)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "backend": args.backend,
        "image": DOCKER_IMAGE if args.backend == "docker" else None,
        "notebooks": {},
    }
    settings = {"max_timeout": 1800, "pool_python": 0, "pool_bash": 0, "pool_deno": 0}
    gateway = GatewayThread(backend=args.backend, **settings).start()
    by_name: collections.Counter[str] = collections.Counter()
    cells = 0
    try:
        client = gateway.client()
        for path in paths:
            notebook = json.loads(path.read_text(encoding="utf-8"))
            code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
            cells += len(code)
            started = time.monotonic()
            response = client.request(
                "POST",
                "/v1/notebooks/run",
                {
                    "notebook": notebook,
                    "allow_errors": True,
                    "timeout": 1800,
                    "cell_timeout": args.cell_timeout,
                    "files": files,
                },
                timeout=1900,
            )
            seconds = round(time.monotonic() - started, 1)
            if response.status != 200:
                print(f"{path.name}: HTTP {response.status} {response.body[:300]!r}")
                results["notebooks"][path.name] = {"http": response.status}
                continue
            answer = response.json()
            failed = errors_of(answer["notebook"])
            by_name.update(e["ename"] for e in failed)
            run = answer["run"]
            results["notebooks"][path.name] = {
                "code_cells": len(code),
                "seconds": seconds,
                "status": run["status"],
                "charts": len(run["charts"]),
                "errors": failed,
            }
            summary = ", ".join(f"{e['ename']} (cell {e['cell']})" for e in failed) or "none"
            print(
                f"{path.name}: {len(code)} cells, {seconds} s, {len(run['charts'])} charts, "
                f"errors: {summary}"
            )
    finally:
        gateway.stop()
    results["code_cells"] = cells
    results["errors_by_name"] = dict(by_name)
    missing = sum(by_name[name] for name in MISSING_MODULE)
    results["missing_modules"] = missing
    print(f"{len(paths)} notebooks, {cells} code cells; errors by name: {dict(by_name)}")
    print(f"ModuleNotFoundError/ImportError: {missing}")
    out = REPO / "bench" / "results" / f"handbook-{results['date'][:10]}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
