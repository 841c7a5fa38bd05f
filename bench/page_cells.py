"""The page's notebook a cell at a time (issue 32): Shift+Enter on a cell of a Handbook
notebook, against Run all of the same notebook, in a real headless Chromium on one
forkserver gateway, side by side in one run.

Measured in the page itself (performance.now(): from the key press to the cell's status
`ok`, and Run all's click to its final status), so that the browser driver's polling is
not counted; each sample also gives the cell's own run time in its kernel (the
`cell_finished` event's `duration_ms`), so that what the gateway adds is seen apart from
what the cell's code costs. Steady use: one press every 0.25 s after the last finished.
Results also go to bench/results/.

    .venv/bin/python bench/page_cells.py [--notebook notebooks/handbook/04.12-...ipynb]
        [--cell 10] [--runs 20] [--run-all 3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.cold_runs import percentiles  # noqa: E402
from tests.browser import FINAL, Page, chromium  # noqa: E402
from tests.support import GatewayThread  # noqa: E402

NOTEBOOK = REPO / "notebooks" / "handbook" / "04.12-Three-Dimensional-Plotting.ipynb"
STEADY_GAP = 0.25

# Arms the cell: `window.__pressed` becomes [ms from the key press to the cell's status
# `ok`, the cell's own time as shown] (or an error) once the key is pressed
ARM = """([index]) => {
  const cell = document.querySelector(`.code-cell[data-index='${index}']`);
  cell.querySelector('.cm-content').focus();
  window.__pressed = null;
  let pressed = 0;
  const seen = new MutationObserver(() => {
    const status = cell.dataset.status;
    if (pressed && status === 'ok') {
      seen.disconnect();
      const own = cell.querySelector('.cell-time').textContent;
      window.__pressed = [performance.now() - pressed, own];
    } else if (pressed && !['queued', 'running', 'idle'].includes(status)) {
      seen.disconnect();
      window.__pressed = ['error', status];
    }
  });
  seen.observe(cell, { attributes: true, attributeFilter: ['data-status'] });
  document.addEventListener('keydown', () => { pressed = performance.now(); },
                            { capture: true, once: true });
}"""

RUN_ALL = """async () => {
  const status = document.querySelector('#nb-status');
  return await new Promise((resolve) => {
    const clicked = performance.now();
    let started = false;
    const seen = new MutationObserver(() => {
      const now = status.dataset.status;
      if (now === 'running' || now === 'starting') started = true;
      if (started && ['succeeded', 'failed'].includes(now)) {
        seen.disconnect();
        resolve([performance.now() - clicked, now]);
      }
    });
    seen.observe(status, { attributes: true, attributeFilter: ['data-status'] });
    document.querySelector('#run-all').click();
  });
}"""


def own_ms(text: str) -> float:
    """A cell's time as the page shows it ("87 ms", "1.2 s")."""
    value, unit = text.split()
    return float(value) * (1000 if unit == "s" else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK)
    parser.add_argument("--cell", type=int, default=10, help="which code cell (1 = the first)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--run-all", type=int, default=3)
    args = parser.parse_args()
    text = args.notebook.read_text(encoding="utf-8")
    server = GatewayThread(backend="forkserver", snapshots_per_user=100).start()
    results: dict[str, Any] = {"notebook": args.notebook.name, "cell": args.cell}
    try:
        with chromium() as browser:
            context = browser.new_context(viewport={"width": 1360, "height": 900})
            page = Page(context.new_page(), f"http://127.0.0.1:{server.port}")
            p = page.page
            page.drop({args.notebook.name: text})
            p.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
            index = p.evaluate(
                "(n) => document.querySelectorAll('.code-cell')[n - 1].dataset.index",
                args.cell,
            )
            run_all = []
            for _ in range(args.run_all):
                time.sleep(STEADY_GAP)
                ms, status = p.evaluate(RUN_ALL)
                run_all.append(ms / 1000)
                page.wait_status(*FINAL, which="#nb-status")
            results["run_all_status"] = status
            presses, owns = [], []
            for _ in range(args.runs):
                time.sleep(STEADY_GAP)
                p.evaluate(ARM, [index])
                p.keyboard.press("Shift+Enter")
                ms, own = p.wait_for_function("() => window.__pressed").json_value()
                if ms == "error":
                    raise RuntimeError(f"the cell ended {own}")
                presses.append(ms / 1000)
                owns.append(own_ms(own) / 1000)
                page.wait_status(*FINAL, which="#nb-status")
            context.close()
    finally:
        server.stop()
    results["shift_enter"] = percentiles(presses)
    results["cell_own"] = percentiles(owns)
    results["added"] = percentiles([a - b for a, b in zip(presses, owns, strict=True)])
    results["run_all"] = percentiles(run_all)
    print(json.dumps(results, indent=1))
    out = REPO / "bench" / "results" / f"page_cells-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
