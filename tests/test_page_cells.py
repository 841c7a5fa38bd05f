"""The page's notebook run a cell at a time, as JupyterLab runs one (issue 32), in a real
headless Chromium against a real forkserver gateway: Run all keeps each cell's state;
Shift+Enter runs a cell from the state of the cell before it and moves on, without running
the cells before it again; an edited cell and the cells after it run from its predecessor's
state; Restart starts from nothing (running the cells before as well); the history shows
the chain of runs as one notebook. Without snapshots (the local backend of test_page.py's
gateway) the same page runs a cell with the cells before it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import FINAL, RECORD_VIOLATIONS, Page, ipynb
from tests.conftest import start_gateway
from tests.support import GatewayThread, forget_snapshots, serving


@pytest.fixture(scope="module")
def forked_page_gateway() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver", snapshots_per_user=40))


@pytest.fixture
def page(chromium_browser: Any, forked_page_gateway: GatewayThread) -> Iterator[Page]:
    context = chromium_browser.new_context(viewport={"width": 1360, "height": 900})
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        yield Page(context.new_page(), f"http://127.0.0.1:{forked_page_gateway.port}")
    finally:
        context.close()
    forget_snapshots(forked_page_gateway)


NOTEBOOK = ipynb(
    ("markdown", "# Steps"),
    ("code", "import time\nx = 1\nprint('one', time.time_ns())"),
    ("code", "x += 1\nprint(x)"),
    ("code", "print(x * 10)"),
)


def outputs(page: Page) -> list[str]:
    return [c["output"].strip() for c in page.cells()]


def prompts(page: Page) -> list[str]:
    return [c["prompt"] for c in page.cells()]


def editor(page: Page, index: int) -> Any:
    return page.page.locator(f".code-cell[data-index='{index}'] .cm-content")


def finished(page: Page) -> str:
    return page.wait_status(*FINAL, which="#nb-status", timeout=60)


def opened_and_run(page: Page, name: str) -> None:
    """Drop the notebook on the page and Run all of it."""
    page.drop({name: NOTEBOOK})
    page.page.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
    page.page.locator("#run-all").click()
    assert finished(page) == "succeeded"


def typed(page: Page, index: int, code: str, keys: str) -> None:
    """Replace cell `index`'s code as a person would, then press `keys`."""
    editor(page, index).click()
    page.page.keyboard.press("Control+a")
    page.page.keyboard.insert_text(code)
    page.page.keyboard.press(keys)


def test_a_cell_runs_from_the_state_the_cell_before_it_left(page: Page) -> None:
    p = page.page
    opened_and_run(page, "steps.ipynb")
    first = outputs(page)
    assert first[1:] == ["2", "20"] and first[0].startswith("one")
    assert prompts(page) == ["[1]", "[2]", "[3]"]

    # edit cell 2 and Shift+Enter: it runs from cell 1's state (cell 1 does not run again:
    # its output, with the time it ran, stays as it was), and the focus moves to cell 3
    typed(page, 2, "x += 5\nprint(x)", "Shift+Enter")
    assert finished(page) == "succeeded"
    assert outputs(page) == [first[0], "6", "20"] and prompts(page)[1] == "[4]"
    assert p.evaluate("document.activeElement.closest('.code-cell').dataset.index") == "3"
    assert editor(page, 2).inner_text() == "x += 5\nprint(x)"  # no new line typed
    # Ctrl+Enter in cell 3: from cell 2's new state, and the focus stays
    p.keyboard.press("Control+Enter")
    assert finished(page) == "succeeded"
    assert outputs(page)[2] == "60" and prompts(page)[2] == "[5]"
    assert p.evaluate("document.activeElement.closest('.code-cell').dataset.index") == "3"

    # Restart: the next cell runs from nothing, so the cells before it run too
    p.locator("#nb-restart").click()
    p.locator(".code-cell[data-index='3'] .cell-run").click()
    assert finished(page) == "succeeded"
    after = outputs(page)
    assert after[1:] == ["6", "60"] and after[0].startswith("one") and after[0] != first[0]
    assert prompts(page) == ["[1]", "[2]", "[3]"]
    page.assert_clean()


def test_the_history_opens_a_chain_as_one_notebook(page: Page) -> None:
    p = page.page
    opened_and_run(page, "chain.ipynb")
    typed(page, 3, "print(x * 100)", "Control+Enter")
    assert finished(page) == "succeeded"
    assert outputs(page)[2] == "200"
    newest = p.locator("#history-list .history-item").first
    p.wait_for_function(
        "() => document.querySelector('#history-list .history-item').dataset.runs"
        ".split(' ').length === 2"
    )
    assert "2 runs" in newest.inner_text()
    # open something else, then the chain: one notebook, its cells as last run
    p.locator("#run-all").click()
    assert finished(page) == "succeeded"
    p.locator("#history-list .history-item").nth(1).click()
    p.wait_for_function(
        "() => [...document.querySelectorAll('.code-cell .cell-outputs')]"
        ".map((o) => o.innerText.trim())[2] === '200'"
    )
    assert outputs(page)[1] == "2"
    assert "print(x * 100)" in editor(page, 3).inner_text()
    # and it goes on from there: its cells hold the states their runs kept
    editor(page, 3).click()
    p.keyboard.press("Control+Enter")
    assert finished(page) == "succeeded"
    assert outputs(page)[2] == "200"
    page.assert_clean()
