"""The web page at `/`, driven in a real headless Chromium (Playwright): type code, run it,
see output arrive live, stdout and stderr apart, a chart and a table inline, cancel, and
download the run as a notebook. A screenshot is kept in test-artifacts/page.png.

Without Playwright or Chromium the module is skipped, or fails under
GATEWAY_REQUIRE=chromium (as in CI). The page's files and headers (CSP, path traversal) need
no browser: test_page_files.py."""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.api import write_tokens
from tests.browser import chromium
from tests.support import REPO, GatewayThread

ARTIFACTS = REPO / "test-artifacts"
TOKEN = "page-test-token-0123456789abcdef"

# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def server() -> Iterator[GatewayThread]:
    gateway = GatewayThread(backend="local").start()
    try:
        yield gateway
    finally:
        gateway.stop()


class Page:
    """A browser tab on the gateway's page, recording console errors."""

    def __init__(self, page: Any, base: str) -> None:
        self.page = page
        self.errors: list[str] = []
        page.on("console", lambda m: m.type == "error" and self.errors.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))
        page.goto(base + "/")
        page.wait_for_selector("body[data-ready=true]")

    def type_code(self, code: str) -> None:
        editor = self.page.locator("#code")
        editor.fill("")
        editor.focus()
        # typed line by line: the editor keeps indentation on Enter, so start each at col 0
        for i, line in enumerate(code.split("\n")):
            if i:
                self.page.keyboard.press("Shift+Enter")
            self.page.keyboard.insert_text(line)
        assert editor.input_value() == code

    def status(self) -> str:
        return str(self.page.locator("#status").inner_text())

    def wait_status(self, *statuses: str, timeout: float = 90) -> str:
        self.page.wait_for_function(
            "(s) => s.includes(document.querySelector('#status').dataset.status)",
            arg=list(statuses),
            timeout=timeout * 1000,
        )
        return self.status()


@pytest.fixture
def page(browser: Any, server: GatewayThread) -> Iterator[Page]:
    context = browser.new_context(accept_downloads=True, viewport={"width": 1360, "height": 900})
    try:
        yield Page(context.new_page(), f"http://127.0.0.1:{server.port}")
    finally:
        context.close()


# --- tests --------------------------------------------------------------------------------

DEMO = """import sys, time
print('hello from stdout', flush=True)
print('a warning on stderr', file=sys.stderr, flush=True)
time.sleep(3)
print('after the pause')

import matplotlib.pyplot as plt
plt.figure(figsize=(5, 3))
plt.plot([1, 4, 2, 8, 5], marker='o')
plt.title('a chart')
plt.show()

import pandas as pd
pd.DataFrame({'city': ['Oslo', 'Lima', 'Pune'], 'temp': [4.5, 19.0, 31.2]})"""


def test_run_python_live_with_chart_and_table(page: Page, server: GatewayThread) -> None:
    p = page.page
    page.type_code(DEMO)
    p.locator("#code").press("Control+Enter")

    # live: the first line shows while the run is still sleeping
    p.wait_for_selector(".stream.stdout:has-text('hello from stdout')", timeout=20_000)
    assert page.status() == "running"
    assert "after the pause" not in p.locator("#outputs").inner_text()
    p.wait_for_selector(".stream.stderr:has-text('a warning on stderr')", timeout=10_000)
    assert page.status() == "running"
    assert not p.locator("#run").is_enabled() and p.locator("#cancel").is_enabled()

    assert page.wait_status("succeeded", "failed", "error") == "succeeded"
    assert p.locator("#exit-code").inner_text() == "exit 0"
    assert p.locator("#duration").inner_text().endswith(" s")

    # stdout and stderr are told apart (stderr red)
    colors = p.evaluate(
        """() => ['stdout', 'stderr'].map(
            (n) => getComputedStyle(document.querySelector('.stream.' + n)).color)"""
    )
    assert colors[0] != colors[1] and colors[1] == "rgb(198, 40, 40)", colors

    # the chart is an <img> that decoded
    p.wait_for_function(
        "() => { const i = document.querySelector('img.image-output');"
        " return i && i.complete && i.naturalWidth > 0; }",
        timeout=10_000,
    )
    assert p.evaluate("document.querySelector('img.image-output').src").startswith(
        "data:image/png;base64,"
    )
    # the table is in a sandboxed iframe (no scripts, opaque origin)
    frame = p.locator("iframe.html-output")
    assert frame.get_attribute("sandbox") == ""
    cells = p.frame_locator("iframe.html-output").locator("td")
    cells.first.wait_for(timeout=10_000)
    assert "Lima" in cells.all_inner_texts()

    # the run as a notebook
    with p.expect_download() as download:
        p.locator("#download").click()
    notebook = nbformat.reads(Path(download.value.path()).read_text(), as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].source == DEMO
    assert download.value.suggested_filename.endswith(".ipynb")

    ARTIFACTS.mkdir(exist_ok=True)
    p.screenshot(path=str(ARTIFACTS / "page.png"), full_page=True)
    assert page.errors == []


def test_cancel_a_long_run(page: Page) -> None:
    p = page.page
    page.type_code("import time\nprint('working', flush=True)\ntime.sleep(120)")
    p.locator("#run").click()
    p.wait_for_selector(".stream.stdout:has-text('working')", timeout=20_000)
    asked = time.monotonic()
    p.locator("#cancel").click()
    assert page.wait_status("cancelled", "succeeded", "failed", "error", timeout=15) == "cancelled"
    assert time.monotonic() - asked < 10
    assert p.locator("#run").is_enabled() and not p.locator("#cancel").is_enabled()
    assert "working" in p.locator("#outputs").inner_text()
    assert page.errors == []


def test_bash_with_a_failing_exit_code(page: Page) -> None:
    p = page.page
    p.select_option("#language", "bash")
    page.type_code("echo out\necho err >&2\nexit 3")
    p.locator("#run").click()
    assert page.wait_status("succeeded", "failed", "error") == "failed"
    assert p.locator("#exit-code").inner_text() == "exit 3"
    assert p.locator(".stream.stdout").inner_text() == "out\n"
    assert p.locator(".stream.stderr").inner_text() == "err\n"


def test_python_errors_show_their_traceback_without_ansi(page: Page) -> None:
    p = page.page
    page.type_code("def f():\n    return 1 / 0\nf()")
    p.locator("#run").click()
    assert page.wait_status("succeeded", "failed", "error") == "failed"
    text = p.locator(".error-output").inner_text()
    assert "ZeroDivisionError" in text and "\x1b" not in text and "[0;31m" not in text
    assert p.locator("#exit-code").inner_text() == "exit 1"


def test_display_updates_replace_what_is_shown(page: Page) -> None:
    p = page.page
    page.type_code(
        "import time\nfrom IPython.display import display\n"
        "h = display('step 0', display_id=True)\n"
        "for i in range(1, 4):\n"
        "    time.sleep(0.4)\n"
        "    h.update(f'step {i}')"
    )
    p.locator("#run").click()
    p.wait_for_selector(".display:has-text('step')", timeout=20_000)
    assert page.wait_status("succeeded", "failed", "error") == "succeeded"
    assert p.locator(".display").all_inner_texts() == ["'step 3'"]


def test_untrusted_html_and_svg_never_run_in_the_page(page: Page) -> None:
    p = page.page
    title = p.title()
    code = (
        "from IPython.display import HTML, SVG, display\n"
        'display(HTML(\'<b>bold</b><script>parent.document.title="pwned"</script>'
        "<img src=x onerror=\"parent.document.title=\\'pwned\\'\">'))\n"
        'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40"'
        ' onload="parent.document.title=1"><script>parent.document.title=2</script>'
        '<rect width="40" height="40" fill="teal"/></svg>\'))'
    )
    page.type_code(code)
    p.locator("#run").click()
    assert page.wait_status("succeeded", "failed", "error") == "succeeded"
    p.frame_locator("iframe.html-output").locator("b").wait_for(timeout=10_000)
    # two layers: the iframe is sandboxed, and it inherits the page's CSP (no inline script)
    assert p.locator("iframe.html-output").get_attribute("sandbox") == ""
    p.wait_for_function(
        "() => [...document.querySelectorAll('img.image-output')].some("
        "i => i.complete && i.naturalWidth > 0)",
        timeout=10_000,
    )
    svg = p.locator("img.image-output").get_attribute("src") or ""
    assert svg.startswith("data:image/svg+xml")
    time.sleep(0.5)
    assert p.title() == title
    assert p.evaluate("document.querySelectorAll('#outputs script, #outputs svg').length") == 0


def test_editor_comfort(page: Page) -> None:
    p = page.page
    editor = p.locator("#code")
    editor.fill("")
    editor.focus()
    p.keyboard.insert_text("for i in range(2):")
    p.keyboard.press("Enter")  # keeps indentation, adds a level after a colon
    p.keyboard.insert_text("print(i)")
    p.keyboard.press("Enter")
    p.keyboard.press("Tab")
    assert editor.input_value() == "for i in range(2):\n    print(i)\n        "
    assert p.evaluate("document.activeElement.id") == "code"
    p.keyboard.press("Escape")
    p.keyboard.press("Tab")  # after Escape, Tab leaves the editor
    assert p.evaluate("document.activeElement.id") != "code"


def test_the_language_picker_and_what_the_kernels_have(page: Page) -> None:
    """The page asks GET /v1/environment: the picker shows each language's version, a
    language the kernels lack cannot be picked, and the packages are listed."""
    p = page.page
    p.wait_for_selector("#environment[data-loaded=true]")
    options = {
        value: (disabled, text)
        for value, disabled, text in p.eval_on_selector_all(
            "#language option", "els => els.map(e => [e.value, e.disabled, e.textContent])"
        )
    }
    assert set(options) == {"python", "bash", "javascript", "typescript", "r"}
    assert options["python"] == (False, f"Python {platform.python_version()}")
    if shutil.which("R") is None:  # the local backend runs kernels from this machine
        assert options["r"] == (True, "R (not installed)")
    p.locator("#environment summary").click()
    p.fill("#package-filter", "numpy")
    shown = p.locator("#environment li:visible").all_inner_texts()
    assert f"numpy {importlib.metadata.version('numpy')}" in shown
    assert all("numpy" in item for item in shown)
    assert not page.errors


# --- a gateway with tokens ----------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayThread]:
    tokens = write_tokens(tmp_path_factory.mktemp("tokens"), {TOKEN: ("pat", "user")})
    gateway = GatewayThread(backend="local", tokens=tokens).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def test_with_tokens_the_page_asks_for_one(browser: Any, secured: GatewayThread) -> None:
    context = browser.new_context(accept_downloads=True)
    try:
        page = Page(context.new_page(), f"http://127.0.0.1:{secured.port}")
        p = page.page
        assert p.locator("#token-row").is_visible()
        page.type_code("print(6 * 7)")
        p.locator("#run").click()
        assert "token" in p.locator("#message").inner_text()

        p.fill("#token", "not-the-right-token-at-all")
        p.locator("#run").click()
        assert page.wait_status("error") == "error"
        assert p.locator("#connection").get_attribute("data-state") == "failed"

        p.fill("#token", TOKEN)
        p.locator("#run").click()
        assert page.wait_status("succeeded", "failed", "error") == "succeeded"
        assert p.locator(".stream.stdout").inner_text() == "42\n"
        assert p.evaluate("sessionStorage.getItem('gateway-token')") == TOKEN
        with p.expect_download() as download:
            p.locator("#download").click()
        notebook = nbformat.reads(Path(download.value.path()).read_text(), as_version=4)
        assert notebook.cells[0].outputs[0]["text"] == "42\n"
        # the refused handshake is the only console error
        assert all("WebSocket" in e or "401" in e for e in page.errors), page.errors
    finally:
        context.close()
