"""What the page keeps (issue 33), in a real headless Chromium against real gateways: a
notebook's replays listed in the history under the notebook's name (a chain of single-cell runs
under its first run's), opened again under that name, and re-run with the files they were given
(`files_from`); files that are gone said to be gone, with an offer to add them again, instead
of a run without them; and the open notebook (its cells, edits, outputs) and the staged files
kept in the browser across a reload, until the notebook is closed and the files cleared. A
Handbook notebook opened with its folder, edited and reloaded, then runs a cell that reads its
data file."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.browser import FINAL, RECORD_VIOLATIONS, Page, downloaded, ipynb
from tests.conftest import start_gateway
from tests.support import REPO, GatewayThread, forget_snapshots, serving

HANDBOOK = REPO / "notebooks" / "handbook" / "04.14-Visualization-With-Seaborn.ipynb"
MARATHON = (
    "age,gender,split,final\n"
    "33,M,01:05:38,02:08:51\n32,M,01:06:26,02:09:28\n31,W,01:06:49,02:10:42\n"
)

BIRTHS = ipynb(
    ("markdown", "## Births by year"),
    ("code", "import pandas as pd\nbirths = pd.read_csv('data/births.csv')\nprint(len(births))"),
    ("code", "print(births.births.sum())"),
)
BIRTHS_CSV = "year,births\n2019,120\n2020,115\n2021,131\n"


@pytest.fixture(scope="module")
def forked_page_gateway() -> Iterator[GatewayThread]:
    yield from serving(start_gateway("forkserver", snapshots_per_user=40))


@pytest.fixture(scope="module")
def one_upload_gateway() -> Iterator[GatewayThread]:
    """Local (no snapshots): each user keeps one upload, so a run's kept files go when the
    next run keeps its own."""
    yield from serving(start_gateway("local", max_uploads_per_user=1))


def open_page(browser: Any, server: GatewayThread) -> tuple[Any, Page]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1360, "height": 900})
    context.add_init_script(RECORD_VIOLATIONS)
    return context, Page(context.new_page(), f"http://127.0.0.1:{server.port}")


@pytest.fixture
def page(chromium_browser: Any, forked_page_gateway: GatewayThread) -> Iterator[Page]:
    context, opened = open_page(chromium_browser, forked_page_gateway)
    try:
        yield opened
    finally:
        context.close()
    forget_snapshots(forked_page_gateway)


@pytest.fixture
def local_page(chromium_browser: Any, one_upload_gateway: GatewayThread) -> Iterator[Page]:
    context, opened = open_page(chromium_browser, one_upload_gateway)
    try:
        yield opened
    finally:
        context.close()


def finished(page: Page, timeout: float = 60) -> str:
    return page.wait_status(*FINAL, which="#nb-status", timeout=timeout)


def add_folder(page: Page, folder: Path, button: str = "#add-folder") -> None:
    with page.page.expect_file_chooser() as chooser:
        page.page.locator(button).click()
    chooser.value.set_files(str(folder))


def staged(page: Page) -> list[str]:
    return list(page.page.locator("#file-list .file-path").all_inner_texts())


def births_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "births"
    (folder / "data").mkdir(parents=True)
    (folder / "births.ipynb").write_text(BIRTHS)
    (folder / "data" / "births.csv").write_text(BIRTHS_CSV)
    return folder


def outputs(page: Page) -> list[str]:
    return [c["output"].strip() for c in page.cells()]


def test_a_replay_keeps_its_name_and_its_files_in_the_history(page: Page, tmp_path: Path) -> None:
    p = page.page
    p.locator("#tab-notebook").click()
    add_folder(page, births_folder(tmp_path))
    p.wait_for_selector("#notebook-view .code-cell")
    p.locator("#run-all").click()
    assert finished(page) == "succeeded"
    top = p.locator(".history-item").first
    top.locator(".history-code:text-is('births.ipynb')").wait_for()
    assert "notebook" in top.inner_text()

    # a cell run on its own continues the replay: one item, under the notebook's name
    p.locator(".code-cell .cm-content").last.click()
    p.keyboard.press("Control+Enter")
    assert finished(page) == "succeeded"
    p.wait_for_function(
        "() => document.querySelector('.history-item').dataset.runs.split(' ').length === 2"
    )
    assert top.locator(".history-code").inner_text() == "births.ipynb"
    assert "2 runs" in top.inner_text()

    # no files staged any more, another page: opened from the history, it keeps its name and
    # runs with the files it was given
    p.locator("#clear-files").click()
    page.wait_kept()
    page.reload()
    assert staged(page) == []
    p.locator(".history-item").first.click()
    p.wait_for_function(
        "() => document.querySelector('#announcer').textContent.includes('chain of 2 runs')"
    )
    assert p.locator("#notebook-title").inner_text() == "births.ipynb"
    assert "the gateway keeps" in p.locator("#nb-notes").inner_text()
    assert downloaded(p, p.locator("#nb-download").click)[0] == "births.executed.ipynb"
    assert downloaded(p, p.locator("#nb-save").click)[0] == "births.ipynb"
    p.locator("#run-all").click()
    assert finished(page) == "succeeded"
    assert outputs(page) == ["3", "366"]
    page.assert_clean()


def replay(server: GatewayThread, name: str, keep_files: bool) -> str:
    """A replay of the births notebook by the API, given its data file: its run id."""
    response = server.client().request(
        "POST",
        "/v1/notebooks/run",
        {
            "notebook": json.loads(BIRTHS),
            "name": name,
            "files": [
                {
                    "path": "data/births.csv",
                    "content": base64.b64encode(BIRTHS_CSV.encode()).decode(),
                    "encoding": "base64",
                }
            ],
            "keep_files": keep_files,
        },
        timeout=60,
    )
    assert response.status == 200, response.body[:500]
    run = response.json()["run"]
    assert run["status"] == "succeeded" and run["files_given"]["kept"] is keep_files
    return str(run["id"])


def open_item(page: Page, run_id: str) -> None:
    page.page.locator(f".history-item[data-run-id='{run_id}']").click()
    page.page.wait_for_function(
        "(id) => document.querySelector('#notebook-meta').textContent.includes(id)", arg=run_id
    )


def test_files_that_are_gone_are_said_to_be_gone(
    local_page: Page, one_upload_gateway: GatewayThread, tmp_path: Path
) -> None:
    page, p = local_page, local_page.page
    gone = replay(one_upload_gateway, "first.ipynb", keep_files=True)
    kept = replay(one_upload_gateway, "second.ipynb", keep_files=True)  # the first's files go
    page.reload()

    # the kept files of the second: a re-run gets them again
    open_item(page, kept)
    assert p.locator("#notebook-title").inner_text() == "second.ipynb"
    p.locator("#run-all").click()
    assert finished(page) == "succeeded" and outputs(page) == ["3", "366"]

    # the first's went with the quota: said plainly, nothing ran, the files to add again
    open_item(page, gone)
    assert p.locator("#notebook-title").inner_text() == "first.ipynb"
    p.locator("#run-all").click()
    assert finished(page) == "error"
    message = p.locator("#nb-message").inner_text()
    assert f"Nothing ran: the files {gone} was given are gone" in message, message
    assert [c["status"] for c in page.cells()] == ["not_run", "not_run"]
    again = p.locator("#nb-message button")
    assert again.evaluate("(b) => b === document.activeElement")
    add_folder(page, births_folder(tmp_path), "#nb-message button")
    p.wait_for_function("() => document.querySelectorAll('#file-list .file-path').length === 1")
    assert staged(page) == ["data/births.csv"]
    assert p.locator("#notebook-title").inner_text() == "first.ipynb"  # not replaced
    p.locator("#run-all").click()
    assert finished(page) == "succeeded" and outputs(page) == ["3", "366"]

    # files never kept: said when it is opened
    p.locator("#clear-files").click()
    never = replay(one_upload_gateway, "third.ipynb", keep_files=False)
    p.locator("#history-refresh").click()
    open_item(page, never)
    assert "which the gateway did not keep" in p.locator("#nb-message").inner_text()
    page.assert_clean()


def test_staged_files_are_kept_once_and_sent_again_when_they_went(
    local_page: Page, one_upload_gateway: GatewayThread, tmp_path: Path
) -> None:
    """Once the gateway keeps the staged files for a run, the next runs name that run instead
    of sending them again (one copy kept, not one per run); when those went, the page sends
    them again by itself."""
    page, p = local_page, local_page.page
    sent: list[dict[str, Any]] = []
    p.on("websocket", lambda ws: ws.on("framesent", lambda text: sent.append(json.loads(text))))
    p.locator("#tab-notebook").click()
    add_folder(page, births_folder(tmp_path))
    p.wait_for_selector("#notebook-view .code-cell")

    def run_all() -> list[dict[str, Any]]:
        p.locator("#run-all").click()
        assert finished(page) == "succeeded" and outputs(page) == ["3", "366"]
        return [m for m in sent if m.get("type") == "notebook"]

    first = run_all()[-1]
    assert first["keep_files"] is True and "files_from" not in first
    assert [f["path"] for f in first["files"]] == ["data/births.csv"]
    second = run_all()[-1]
    assert second["keep_files"] is True and "files" not in second
    assert second["files_from"].startswith("run_")

    replay(one_upload_gateway, "other.ipynb", keep_files=True)  # the page's kept files go
    *_, gone, again = run_all()
    assert "files" not in gone and gone["files_from"] != second["files_from"]
    assert "files_from" not in again and [f["path"] for f in again["files"]] == ["data/births.csv"]
    assert p.locator("#nb-message").is_hidden()
    page.assert_clean()


def test_a_code_run_is_run_again_with_its_files(local_page: Page, tmp_path: Path) -> None:
    page, p = local_page, local_page.page
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "births.csv").write_text(BIRTHS_CSV)
    add_folder(page, folder)
    p.wait_for_function("() => document.querySelectorAll('#file-list .file-path').length === 1")
    page.type_code("print(open('data/births.csv').read().split()[-1])")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    # the run's own id (the History may list it only a moment later)
    run_id = p.locator("#download").get_attribute("data-run-id")
    assert run_id and run_id.startswith("run_")
    p.locator("#clear-files").click()
    page.type_code("print('something else')")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"

    # from the history, with no files staged: Re-run gets the files it was given
    p.wait_for_selector(f".history-item[data-run-id='{run_id}']:not([aria-current])")
    p.locator(f".history-item[data-run-id='{run_id}']").click()
    p.wait_for_selector("#notes li:has-text('the gateway keeps')")
    p.locator("#rerun").click()
    assert page.wait_status(*FINAL) == "succeeded"
    assert p.locator(".stream.stdout").inner_text() == "2021,131\n"
    page.assert_clean()


def test_a_handbook_notebook_survives_a_reload(page: Page, tmp_path: Path) -> None:
    """04.14 opened with its folder (its marathon data), a cell edited: after a reload the
    notebook, the edit and the file are there, and the cell reads the file."""
    p = page.page
    folder = tmp_path / "handbook"
    (folder / "data").mkdir(parents=True)
    shutil.copy(HANDBOOK, folder / HANDBOOK.name)
    (folder / "data" / "marathon-data.csv").write_text(MARATHON)
    p.locator("#tab-notebook").click()
    add_folder(page, folder)
    p.wait_for_selector("#notebook-view .code-cell")
    page.wait_kept()  # as opened: what the reload has is the edit's doing
    reads = p.locator(".code-cell").filter(has_text="read_csv('data/marathon-data.csv')").first
    index = reads.get_attribute("data-index")
    assert index == "15"
    edited = "data = pd.read_csv('data/marathon-data.csv')\nprint(len(data), 'runners')"
    reads.locator(".cm-content").click()
    p.keyboard.press("Control+a")
    p.keyboard.insert_text(edited)
    page.wait_kept()

    page.reload()
    assert p.locator("#notebook-view").is_visible()
    assert p.locator("#notebook-title").inner_text() == HANDBOOK.name
    cell = p.locator(f".code-cell[data-index='{index}']")
    assert cell.locator(".cm-content").inner_text() == edited
    assert staged(page) == ["data/marathon-data.csv"]
    # the book's cells before it fail for want of the network: go on after errors
    p.locator("#nb-allow-errors").check()
    cell.locator(".cm-content").click()
    p.keyboard.press("Control+Enter")
    finished(page, timeout=240)
    assert cell.get_attribute("data-status") == "ok"
    assert cell.locator(".cell-outputs").inner_text().strip() == "3 runners"

    # closed and cleared: forgotten
    with page.answering(True):
        p.locator("#nb-close").click()
    p.locator("#clear-files").click()
    page.wait_kept()
    page.reload()
    assert p.locator("#notebook-title").inner_text() == "No notebook open"
    assert staged(page) == [] and p.locator(".cell").count() == 0
    page.assert_clean()
