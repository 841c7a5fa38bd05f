"""Replay fidelity over the whole corpus (notebooks/corpus/, issue 12).

Each notebook is executed twice by nbclient, the reference executor (the second execution
shows that the corpus is deterministic: it must agree with the first), then replayed with
`POST /v1/notebooks/run` on each backend; every code cell is compared with the first
reference execution (tests/notebook_compare.py: error verdict and name, outputs and their
types, stream text, text/plain, HTML, images by size and marks). Prints cells identical /
total per backend, the differing cells, the wall time of each pass and the kernel-side
package versions of each backend. Results (JSON) also go to bench/results/.

    .venv/bin/python bench/replay_corpus.py [--backends local,docker] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import corpus  # noqa: E402
from tests.notebook_compare import cell_differences, execute_reference  # noqa: E402
from tests.support import GatewayThread  # noqa: E402


def tally(
    executions: dict[str, dict[str, Any]], references: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    total = differing = 0
    notebooks = {}
    for name, executed in executions.items():
        cells = len(corpus.code_cells(references[name]))
        differences = cell_differences(executed, references[name])
        total += cells
        differing += len(differences)
        notebooks[name] = {"code_cells": cells, "differences": differences}
    return {"identical": total - differing, "total": total, "notebooks": notebooks}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="local,docker")
    parser.add_argument("--only", nargs="*", help="notebook names (default: the whole corpus)")
    args = parser.parse_args()
    names = args.only or corpus.names()
    results: dict[str, Any] = {"date": datetime.now(UTC).isoformat(timespec="seconds")}

    started = time.monotonic()
    references = {name: execute_reference(corpus.read(name))[0] for name in names}
    results["reference_seconds"] = round(time.monotonic() - started, 1)
    again = {name: execute_reference(corpus.read(name))[0] for name in names}
    results["reference_again"] = tally(again, references)
    print(
        f"nbclient twice: {results['reference_again']['identical']}/"
        f"{results['reference_again']['total']} code cells agree "
        f"({results['reference_seconds']} s a pass)"
    )

    for backend in args.backends.split(","):
        server = GatewayThread(backend=backend).start()
        try:
            client = server.client()
            versions = corpus.kernel_versions(client)
            started = time.monotonic()
            replays = {name: corpus.replay(client, corpus.read(name)) for name in names}
            seconds = round(time.monotonic() - started, 1)
        finally:
            server.stop()
        outcome = tally({n: answer["notebook"] for n, answer in replays.items()}, references)
        outcome.update(
            seconds=seconds,
            versions=versions,
            statuses={n: answer["run"]["status"] for n, answer in replays.items()},
        )
        results[backend] = outcome
        print(f"{backend}: {outcome['identical']}/{outcome['total']} code cells identical "
              f"({seconds} s); kernel {versions}")  # fmt: skip
        for name, row in outcome["notebooks"].items():
            for line in row["differences"]:
                print(f"  {name} {line}")

    out = REPO / "bench" / "results"
    out.mkdir(exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out / f"replay_corpus-{stamp}.json").write_text(json.dumps(results, indent=2))
    fidelity = [results[b]["identical"] == results[b]["total"] for b in args.backends.split(",")]
    return 0 if all(fidelity) else 1


if __name__ == "__main__":
    raise SystemExit(main())
