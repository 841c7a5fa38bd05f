"""The page's notebook edited as in JupyterLab (issue 33), in a real headless Chromium against a
real forkserver gateway: cells added, deleted, moved and made markdown by keyboard, each change
treated as an edit of its place (the cells from there on run from the state before it, never
from one their code did not make); the notebook saved as it is on show, under its own name; a
code cell named by its execution count everywhere (`In [2]`), durations under a second in
milliseconds; and the page asks before it replaces a draft or an edited notebook."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest

from tests.browser import FINAL, RECORD_VIOLATIONS, Page, downloaded, ipynb, wcag_violations
from tests.conftest import start_gateway
from tests.support import GatewayThread, forget_snapshots, serving


@pytest.fixture(scope="module")
def forked_page_gateway() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver", snapshots_per_user=40))


@pytest.fixture
def page(chromium_browser: Any, forked_page_gateway: GatewayThread) -> Iterator[Page]:
    context = chromium_browser.new_context(
        accept_downloads=True, viewport={"width": 1360, "height": 900}
    )
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        yield Page(context.new_page(), f"http://127.0.0.1:{forked_page_gateway.port}")
    finally:
        context.close()
    forget_snapshots(forked_page_gateway)


STEPS = ipynb(
    ("markdown", "# Steps"),
    ("code", "x = 1\nprint(x)"),
    ("code", "x += 1\nprint(x)"),
    ("code", "print(x * 10)"),
)


def outputs(page: Page) -> list[str]:
    return [c["output"].strip() for c in page.cells()]


def cell(page: Page, index: int) -> Any:
    return page.page.locator(f".cell[data-index='{index}']")


def finished(page: Page) -> str:
    return page.wait_status(*FINAL, which="#nb-status", timeout=60)


def press(page: Page, index: int, action: str) -> str:
    """Press a cell's button by keyboard (focus, Enter); its accessible name."""
    button = cell(page, index).locator(f".tool-{action}")
    label = str(button.get_attribute("aria-label"))
    button.focus()
    page.page.keyboard.press("Enter")
    return label


def run_last(page: Page) -> None:
    """Ctrl+Enter in the last code cell."""
    page.page.locator(".code-cell .cm-content").last.click()
    page.page.keyboard.press("Control+Enter")
    assert finished(page) == "succeeded"


def focused_cell(page: Page) -> str:
    return str(page.page.evaluate("document.activeElement.closest('.cell').dataset.index"))


def test_cells_added_deleted_moved_made_markdown_and_saved(page: Page) -> None:
    p = page.page
    page.drop({"steps.ipynb": STEPS})
    p.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
    p.locator("#run-all").click()
    assert finished(page) == "succeeded"
    assert outputs(page) == ["1", "2", "20"]

    # Add a cell below In [1], by keyboard: it takes the focus; it changes what runs after
    # it, so the cells after it run again from In [1]'s state (never from In [2]'s old one)
    assert press(page, 1, "add") == "Add a code cell below In [1]"
    assert focused_cell(page) == "2"
    p.keyboard.insert_text("x = 100")
    run_last(page)
    assert outputs(page) == ["1", "", "101", "1010"]
    assert [c["prompt"] for c in page.cells()] == ["[1]", "[4]", "[5]", "[6]"]

    # Delete it: the cells after it run from In [1]'s state again
    assert press(page, 2, "delete") == "Delete In [4]"
    assert focused_cell(page) == "2"  # the cell after it
    run_last(page)
    assert outputs(page) == ["1", "2", "20"]

    # Move the last cell up, above the one it read x from: the two run again in their new order
    assert press(page, 3, "up") == "Move In [8] up"
    assert p.evaluate("document.activeElement.dataset.action") == "up"  # the focus stays
    assert focused_cell(page) == "2"
    run_last(page)
    assert outputs(page) == ["1", "10", "2"]

    # Make the moved cell markdown, edit it, show it again (Shift+Enter)
    assert press(page, 2, "markdown") == "Make In [9] a markdown cell"
    assert p.locator(".markdown-cell").count() == 2
    assert press(page, 2, "edit").startswith("Edit markdown cell")
    p.keyboard.press("Control+a")
    p.keyboard.insert_text("## Tenfold")
    p.keyboard.press("Shift+Enter")
    assert cell(page, 2).locator("h2").inner_text() == "Tenfold"
    assert cell(page, 2).get_attribute("aria-label") == "markdown cell “Tenfold”"
    assert wcag_violations(p) == []

    # Save: the notebook as on show, under its own name, valid nbformat with its outputs
    name, data = downloaded(p, p.locator("#nb-save").click)
    assert name == "steps.ipynb"
    saved = nbformat.reads(data.decode(), as_version=4)
    nbformat.validate(saved)
    assert [(c.cell_type, c.source) for c in saved.cells] == [
        ("markdown", "# Steps"),
        ("code", "x = 1\nprint(x)"),
        ("markdown", "## Tenfold"),
        ("code", "x += 1\nprint(x)"),
    ]
    assert [c.get("execution_count") for c in saved.cells] == [None, 1, None, 10]
    assert saved.cells[1].outputs[0]["text"] == "1\n"
    assert saved.cells[3].outputs[0]["text"] == "2\n"
    page.assert_clean()


def test_a_cell_is_named_by_its_execution_count(page: Page) -> None:
    p = page.page
    page.drop(
        {
            "named.ipynb": ipynb(
                ("markdown", "# One"),
                ("markdown", "## Two"),
                ("code", "import time\ntime.sleep(1.6)\nprint('slow')"),
                ("code", "print('fast')"),
            )
        }
    )
    p.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
    assert cell(page, 2).locator(".cell-run").get_attribute("aria-label") == "Run In [ ]"
    page.listen()
    p.locator("#run-all").click()
    # the cell running is named by the count it will have, not by its place (3rd of 4 cells)
    p.wait_for_function(
        "() => document.querySelector('#nb-progress').textContent === 'In [1] · 1 of 2 code cells'"
    )
    assert finished(page) == "succeeded"
    times = [c["time"] for c in page.cells()]
    assert re.fullmatch(r"[12]\.\d s", times[0]), times  # tenths from a second on
    assert re.fullmatch(r"\d{1,3} ms", times[1]), times  # milliseconds under a second
    said = " ".join(page.all_said())
    assert "In [1] finished, 1." in said and re.search(r"In \[2\] finished, \d+ ms\.", said), said
    assert cell(page, 3).get_attribute("aria-label") == "In [2], code"
    assert cell(page, 3).locator(".cell-run").get_attribute("aria-label") == "Run In [2]"
    assert cell(page, 3).locator(".cell-outputs").get_attribute("aria-label") == "Output of In [2]"
    assert cell(page, 3).locator(".cm-content").get_attribute("aria-label") == "Code of In [2]"
    page.assert_clean()


def until_asked(page: Page, asked: list[str]) -> None:
    """Until the page has asked (a drop is read before the page asks)."""
    for _ in range(100):
        if asked:
            return
        page.page.wait_for_timeout(50)
    raise AssertionError("the page never asked")


def opened(page: Page, times: int) -> None:
    """Until the page has said `times` times since `listen` that it opened a run."""
    page.page.wait_for_function(
        "(n) => window.__said.filter((s) => s.includes('Opened run')).length === n", arg=times
    )


def test_the_page_asks_before_it_replaces_a_draft_or_an_edited_notebook(page: Page) -> None:
    p = page.page
    # the code view: a run from the history would replace a draft that was never run
    page.type_code("print('run once')")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    item = p.locator(".history-item").first
    item.locator(".history-code:text-is(\"print('run once')\")").wait_for()
    page.type_code("print('my draft')")
    page.listen()
    with page.answering(False) as asked:
        item.click()
    assert len(asked) == 1 and "not run" in asked[0], asked
    assert page.code() == "print('my draft')"
    with page.answering(True) as asked:
        item.click()
        opened(page, 1)
    assert len(asked) == 1 and page.code() == "print('run once')"
    with page.answering(True) as asked:  # nothing of the person's own: nothing to ask
        item.click()
        opened(page, 2)
    assert asked == []

    # the notebook view: another notebook would replace one with edits not saved
    page.drop({"steps.ipynb": STEPS})
    p.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
    p.locator(".code-cell .cm-content").first.click()
    p.keyboard.press("End")
    p.keyboard.insert_text("  # edited")
    other = ipynb(("code", "print('other')"))
    with page.answering(False) as asked:
        page.drop({"other.ipynb": other})
        until_asked(page, asked)
    assert len(asked) == 1 and asked[0].startswith("steps.ipynb has edits you have not saved")
    assert p.locator("#notebook-title").inner_text() == "steps.ipynb"
    assert "# edited" in p.locator(".code-cell .cm-content").first.inner_text()
    with page.answering(False) as asked:
        p.locator("#nb-close").click()
    assert len(asked) == 1 and p.locator("#notebook-title").inner_text() == "steps.ipynb"
    # once saved, nothing is lost: no question
    downloaded(p, p.locator("#nb-save").click)
    with page.answering(False) as asked:
        page.drop({"other.ipynb": other})
        p.wait_for_selector(".code-cell .cm-content:has-text('other')")
    assert asked == [] and p.locator("#notebook-title").inner_text() == "other.ipynb"
    with page.answering(False) as asked:
        p.locator("#nb-close").click()
    assert asked == [] and p.locator("#notebook-title").inner_text() == "No notebook open"
    assert p.locator(".cell").count() == 0
    page.assert_clean()
