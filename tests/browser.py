"""One headless Chromium for the tests that drive the page (Playwright), and a tab on the
page that records what must not happen there (console errors, CSP violations).

Chromium double-forks its crash handlers, so they are reparented to pytest (the census's
subreaper) rather than to the browser: the whole launch happens inside
`census.harness_owned`, which claims them with the driver, and they end with the browser.
Without Playwright or Chromium the test is skipped, or fails under GATEWAY_REQUIRE=chromium.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat

from tests import census, needs
from tests.support import REPO

ARTIFACTS = REPO / "test-artifacts"
# The README's screenshots (docs/images) are written with GATEWAY_SCREENSHOTS=1, to commit.
SCREENSHOTS = (
    REPO / "docs" / "images" if os.environ.get("GATEWAY_SCREENSHOTS") == "1" else ARTIFACTS
)
FINAL = ("succeeded", "failed", "timed_out", "killed", "cancelled", "error")

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A launched Playwright browser, closed (with its driver) on exit."""
    sync_api = needs.import_module(
        "playwright.sync_api", "chromium", "install the test extras (pip install -e '.[test]')"
    )
    if not CHROMIUM.exists():
        needs.missing("chromium", f"{CHROMIUM} is missing (apt-get install chromium)")
    with census.harness_owned("Playwright's driver, Chromium and its crash handlers"):
        playwright = sync_api.sync_playwright().start()
        try:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        except BaseException:
            playwright.stop()
            raise
    try:
        yield browser
    finally:
        try:
            browser.close()
        finally:
            playwright.stop()


# Records every CSP violation in the page (and in each frame, for its own document).
RECORD_VIOLATIONS = """
window.__violations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  const target = e.target && e.target.nodeType === 1 ? e.target : null;
  window.__violations.push({
    directive: e.violatedDirective,
    source: e.sourceFile || '',
    line: e.lineNumber,
    inEditor: !!(target && target.closest('.cm-editor')),
    target: target ? target.outerHTML.slice(0, 200) : String(e.target && e.target.nodeName),
  });
});
"""


class Page:
    """A browser tab on the gateway's page, recording console errors and CSP violations."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.base = base
        self.errors: list[str] = []
        self.earlier: list[dict[str, Any]] = []  # violations seen before a reload
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        # Intercept file choosers from the start: turning it on when a test first waits for a
        # chooser is asynchronous, and a key press right after could open a native one.
        page.on("filechooser", lambda chooser: None)
        self.open()

    def open(self) -> None:
        self.page.goto(self.base + "/")
        self.page.wait_for_selector("body[data-ready=true]")

    def reload(self) -> None:
        self.earlier += self.page.evaluate("window.__violations")  # a reload forgets them
        self.page.reload()
        self.page.wait_for_selector("body[data-ready=true]")

    # --- the editor

    def type_code(self, code: str) -> None:
        """Replace the editor's text as a person would: select all, type (one input event)."""
        self.page.locator("#editor .cm-content").click()
        self.page.keyboard.press("Control+a")
        self.page.keyboard.insert_text(code)
        assert self.code() == code

    def code(self) -> str:
        return str(
            self.page.evaluate(
                "() => [...document.querySelectorAll('#editor .cm-line')]"
                ".map((line) => line.textContent).join('\\n')"
            )
        )

    # --- status

    def status(self, which: str = "#status") -> str:
        return str(self.page.locator(which).get_attribute("data-status"))

    def wait_status(self, *statuses: str, which: str = "#status", timeout: float = 90) -> str:
        self.page.wait_for_function(
            "([s, which]) => s.includes(document.querySelector(which).dataset.status)",
            arg=[list(statuses), which],
            timeout=timeout * 1000,
        )
        return self.status(which)

    def said(self) -> str:
        """What the live region says now."""
        return str(self.page.locator("#announcer").inner_text())

    def listen(self) -> None:
        """From now on, everything the live region says is kept in `window.__said`."""
        self.page.evaluate(
            """() => {
                window.__said = [];
                const region = document.querySelector('#announcer');
                new MutationObserver(() => region.textContent && window.__said.push(region.textContent))
                  .observe(region, {childList: true, characterData: true, subtree: true});
            }"""
        )

    def all_said(self) -> list[str]:
        """What the live region said since `listen`."""
        return list(self.page.evaluate("window.__said"))

    # --- kept in the browser, asked of the person

    def wait_kept(self) -> None:
        """Until the page has written what it keeps across a reload (IndexedDB)."""
        self.page.wait_for_selector("body[data-kept=true]", state="attached")

    @contextlib.contextmanager
    def answering(self, accept: bool) -> Iterator[list[str]]:
        """Answer the page's dialogs (a confirm) in the block, yes or no; yields their messages.
        Outside such a block Playwright dismisses them: a test sees a question it did not
        expect as the page going on as if the person said no."""
        asked: list[str] = []

        def answer(dialog: Any) -> None:
            asked.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()

        self.page.on("dialog", answer)
        try:
            yield asked
        finally:
            self.page.remove_listener("dialog", answer)

    # --- notebooks

    def drop(self, files: dict[str, str]) -> None:
        """Drop files on the page (a DataTransfer, as a drag from the desktop makes)."""
        transfer = self.page.evaluate_handle(
            """(files) => {
                const dt = new DataTransfer();
                for (const [name, text] of Object.entries(files)) {
                  dt.items.add(new File([text], name, {type: 'application/octet-stream'}));
                }
                return dt;
            }""",
            files,
        )
        self.page.dispatch_event("#main", "dragover", {"dataTransfer": transfer})
        self.page.dispatch_event("#main", "drop", {"dataTransfer": transfer})

    def cells(self) -> list[dict[str, str]]:
        return list(
            self.page.evaluate(
                """() => [...document.querySelectorAll('.code-cell')].map((c) => ({
                    status: c.dataset.status || '',
                    time: c.querySelector('.cell-time').textContent,
                    prompt: c.querySelector('.prompt').textContent,
                    output: c.querySelector('.cell-outputs').innerText,
                }))"""
            )
        )

    # --- what must not happen

    def all_violations(self) -> list[dict[str, Any]]:
        return self.earlier + list(self.page.evaluate("window.__violations"))

    def violations(self) -> list[dict[str, Any]]:
        """The CSP violations, but for the browser's own: Chrome's contenteditable editing
        proposes a `style` attribute on an editor line, which the policy refuses and CodeMirror
        redraws."""
        return [v for v in self.all_violations() if not _browser_editing(v)]

    def console_errors(self) -> list[str]:
        """The console's errors, less one report per violation `violations` leaves out."""
        excused = len(self.all_violations()) - len(self.violations())
        errors = []
        for error in self.errors:
            if excused and "Applying inline style violates" in error and "style attr" in error:
                excused -= 1
                continue
            errors.append(error)
        return errors

    def assert_clean(self) -> None:
        assert self.violations() == []
        assert self.console_errors() == [], self.errors


def _browser_editing(violation: dict[str, Any]) -> bool:
    return violation["directive"] == "style-src-attr" and violation["inEditor"]


def ipynb(*cells: tuple[str, str], **metadata: Any) -> str:
    """An nbformat 4.5 notebook's text: cells as (type, source), ids c0, c1, ..."""
    nb = nbformat.v4.new_notebook(metadata=metadata or {})
    nb.metadata.setdefault(
        "kernelspec", {"name": "python3", "display_name": "Python 3", "language": "python"}
    )
    for i, (kind, source) in enumerate(cells):
        make = nbformat.v4.new_code_cell if kind == "code" else nbformat.v4.new_markdown_cell
        nb.cells.append(make(source, id=f"c{i}"))
    return nbformat.writes(nb)


def downloaded(p: Any, click: Any) -> tuple[str, bytes]:
    with p.expect_download() as download:
        click()
    return download.value.suggested_filename, Path(download.value.path()).read_bytes()


def screenshot(p: Any, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    p.screenshot(path=str(SCREENSHOTS / name), full_page=True)


AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"


def wcag_violations(p: Any) -> list[dict[str, Any]]:
    """axe-core's WCAG 2 A and AA rules on the page as it is now (serious and critical), as
    test_page.py's keyboard test checks them."""
    if not AXE.exists():
        needs.missing("chromium", f"{AXE} is missing (scripts/page.sh install)")
    p.evaluate(AXE.read_text())
    found = p.evaluate(
        """async () => (await axe.run(document, {
            runOnly: {type: 'tag', values: ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']},
        })).violations.map((v) => ({id: v.id, impact: v.impact,
            nodes: v.nodes.map((n) => n.target.join(' ')).slice(0, 5)}))"""
    )
    return [v for v in found if v["impact"] in ("serious", "critical")]
