"""The web page at `/`, driven in a real headless Chromium (Playwright) against a real gateway
and real kernels: the editor (highlighting, brackets, indentation, search, Ctrl+Enter), a run
with live output, a chart and a table, cancel, the history across a reload, a notebook dropped
on the page and replayed cell by cell, a notebook's own files, the chart gallery, keyboard-only
use and the screen reader's view (axe-core), and a gateway with tokens. Untrusted content
(outputs, markdown, notebook metadata) is attacked in test_page_attacks.py.

Every test fails on a console error or a Content-Security-Policy violation in the page, except
one kind the browser itself causes: Chrome's own contenteditable editing (select all, type)
proposes a `style` attribute on an editor line, which the CSP refuses and CodeMirror redraws.

Screenshots go to test-artifacts/; with GATEWAY_SCREENSHOTS=1 the README's (docs/images/) are
written instead, to be committed. Without Playwright or Chromium the module is skipped, or fails
under GATEWAY_REQUIRE=chromium (as in CI). The page's files and headers need no browser:
test_page_files.py.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests import needs
from tests.browser import (
    FINAL,
    RECORD_VIOLATIONS,
    Page,
    downloaded,
    ipynb,
    screenshot,
)
from tests.support import REPO, GatewayThread, serving

AXE = REPO / "node_modules" / "axe-core" / "axe.min.js"
TOKEN = "page-test-token-0123456789abcdef"

# --- fixtures -----------------------------------------------------------------------------


@pytest.fixture
def context(chromium_browser: Any) -> Iterator[Any]:
    made = chromium_browser.new_context(
        accept_downloads=True, viewport={"width": 1360, "height": 900}
    )
    made.add_init_script(RECORD_VIOLATIONS)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def page(context: Any, page_gateway: GatewayThread) -> Page:
    return Page(context.new_page(), f"http://127.0.0.1:{page_gateway.port}")


# --- the editor ---------------------------------------------------------------------------

COLORS = """(tokens) => {
  const plain = getComputedStyle(document.querySelector('#editor .cm-line')).color;
  const spans = [...document.querySelectorAll('#editor .cm-line span')];
  const colour = (text) => {
    const span = spans.find((s) => s.textContent === text);
    return span ? getComputedStyle(span).color : null;
  };
  return {plain, tokens: Object.fromEntries(tokens.map((t) => [t, colour(t)]))};
}"""


@pytest.mark.parametrize(
    ("language", "code", "kinds"),
    [
        ("python", "def f(x):\n    return 'text'  # note", ["def", "'text'", "# note"]),
        ("bash", 'if true; then echo "hi"; fi # note', ["if", '"hi"', "# note"]),
        ("javascript", "const n = 'text'; // note", ["const", "'text'", "// note"]),
        ("typescript", "const n: number = 1; // note", ["const", "number", "// note"]),
    ],
)
def test_the_editor_highlights_each_language(
    page: Page, language: str, code: str, kinds: list[str]
) -> None:
    p = page.page
    p.select_option("#language", language)
    page.type_code(code)
    seen = p.evaluate(COLORS, kinds)
    colours = seen["tokens"]
    # each kind of token is a span of its own, in a colour of its own, none the plain text's
    assert None not in colours.values(), seen
    assert seen["plain"] not in colours.values(), seen
    assert len(set(colours.values())) == len(kinds), seen
    page.assert_clean()


def test_the_editor_edits_like_an_editor(page: Page) -> None:
    p = page.page
    page.type_code("")
    editor = p.locator("#editor .cm-content")
    # a colon opens a block: Enter indents it; brackets close themselves
    p.keyboard.type("for i in range(2):")
    p.keyboard.press("Enter")
    p.keyboard.type("print(i")
    assert page.code() == "for i in range(2):\n    print(i)"
    # the cursor sits between the brackets it typed: both are marked as a matching pair
    assert p.locator("#editor .cm-matchingBracket").count() == 2
    # Tab indents, Shift+Tab takes it back
    p.keyboard.press("Home")
    p.keyboard.press("Tab")
    assert page.code().split("\n")[1] == "        print(i)"
    p.keyboard.press("Shift+Tab")
    assert page.code().split("\n")[1] == "    print(i)"
    # search: Ctrl+F opens the panel, typing finds, Escape closes it and returns to the text
    p.keyboard.press("Control+f")
    search = p.locator(".cm-search input[name=search]")
    search.wait_for()
    assert search.evaluate("(e) => e === document.activeElement")
    p.keyboard.type("range")
    p.keyboard.press("Enter")
    selected = p.evaluate("() => getSelection().toString()")
    assert selected == "range"
    p.keyboard.press("Escape")
    assert p.locator(".cm-search").count() == 0
    assert editor.evaluate(
        "(e) => e.contains(document.activeElement) || e === document.activeElement"
    )
    # no keyboard trap: Escape then Tab leaves the editor, to the result's side
    p.keyboard.press("Escape")
    p.keyboard.press("Tab")
    assert not editor.evaluate("(e) => e === document.activeElement")
    # the draft survives a reload
    page.reload()
    assert page.code() == "for i in range(2):\n    print(i)"
    page.assert_clean()


# --- runs ---------------------------------------------------------------------------------

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


def test_run_python_live_with_chart_and_table(page: Page) -> None:
    p = page.page
    page.type_code(DEMO)
    p.locator("#editor .cm-content").press("Control+Enter")

    # live: the first line shows while the run is still sleeping
    p.wait_for_selector(".stream.stdout:has-text('hello from stdout')", timeout=20_000)
    assert page.status() == "running"
    assert "after the pause" not in p.locator("#outputs").inner_text()
    p.wait_for_selector(".stream.stderr:has-text('a warning on stderr')", timeout=10_000)
    assert page.status() == "running"
    assert not p.locator("#run").is_enabled() and p.locator("#cancel").is_enabled()

    assert page.wait_status(*FINAL) == "succeeded"
    assert p.locator("#exit-code").inner_text() == "exit 0"
    # its time, then what it used (issue 34): `3.2 s · CPU 89 ms · peak 85.7 MiB`
    shown = p.locator("#duration").inner_text()
    assert re.fullmatch(r"\d+\.\d s · CPU (\d+ ms|\d+\.\d s) · peak \d+\.\d MiB", shown), shown
    assert "succeeded" in page.said()

    # stdout and stderr are told apart (stderr red)
    colors = p.evaluate(
        """() => ['stdout', 'stderr'].map(
            (n) => getComputedStyle(document.querySelector('.stream.' + n)).color)"""
    )
    assert colors[0] != colors[1] and colors[1] == "rgb(198, 40, 40)", colors

    # the chart is an <img> that decoded, and it is in the gallery
    p.wait_for_function(
        "() => { const i = document.querySelector('#outputs img.image-output');"
        " return i && i.complete && i.naturalWidth > 0; }",
        timeout=10_000,
    )
    assert p.evaluate("document.querySelector('#outputs img.image-output').src").startswith(
        "data:image/png;base64,"
    )
    assert p.locator("#gallery-list .thumb").count() == 1
    # the table is in a sandboxed iframe (no scripts; the page's origin, for the page to
    # apply its styles), styled as JupyterLab styles a DataFrame by the page's one allowed
    # frame sheet: even rows shaded
    frame = p.locator("iframe.html-output")
    assert frame.get_attribute("sandbox") == "allow-same-origin"
    cells = p.frame_locator("iframe.html-output").locator("td")
    cells.first.wait_for(timeout=10_000)
    assert "Lima" in cells.all_inner_texts()
    rows = p.frame_locator("iframe.html-output").locator("tbody tr")
    shades = rows.evaluate_all("(rs) => rs.map((r) => getComputedStyle(r).backgroundColor)")
    assert shades == ["rgb(255, 255, 255)", "rgb(245, 245, 245)", "rgb(255, 255, 255)"]

    # the run as a notebook
    name, data = downloaded(p, p.locator("#download").click)
    notebook = nbformat.reads(data.decode(), as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].source == DEMO
    assert name.endswith(".ipynb")

    p.locator("#editor .cm-content").press("Control+Home")  # the code from its first line
    screenshot(p, "page-code.png")
    page.assert_clean()


def test_cancel_a_long_run(page: Page) -> None:
    p = page.page
    page.type_code("import time\nprint('working', flush=True)\ntime.sleep(120)")
    p.locator("#run").click()
    p.wait_for_selector(".stream.stdout:has-text('working')", timeout=20_000)
    asked = time.monotonic()
    p.locator("#cancel").click()
    assert page.wait_status(*FINAL, timeout=15) == "cancelled"
    assert time.monotonic() - asked < 10
    assert p.locator("#run").is_enabled() and not p.locator("#cancel").is_enabled()
    assert "working" in p.locator("#outputs").inner_text()
    page.assert_clean()


def test_bash_with_a_failing_exit_code(page: Page) -> None:
    p = page.page
    p.select_option("#language", "bash")
    page.type_code("echo out\necho err >&2\nexit 3")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "failed"
    assert p.locator("#exit-code").inner_text() == "exit 3"
    assert p.locator(".stream.stdout").inner_text() == "out\n"
    assert p.locator(".stream.stderr").inner_text() == "err\n"


def test_python_errors_show_their_traceback_without_ansi(page: Page) -> None:
    p = page.page
    page.type_code("def f():\n    return 1 / 0\nf()")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "failed"
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
    assert page.wait_status(*FINAL) == "succeeded"
    assert p.locator("#outputs .display").all_inner_texts() == ["'step 3'"]


# --- the gallery --------------------------------------------------------------------------


def test_the_gallery_enlarges_and_downloads_charts(page: Page) -> None:
    p = page.page
    page.type_code(
        "%config InlineBackend.figure_formats = ['png', 'svg']\n"
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(4, 3)); plt.bar(['a', 'b'], [3, 5]); plt.title('votes'); plt.show()\n"
        "plt.figure(figsize=(4, 3)); plt.plot([1, 2, 1]); plt.savefig('saved.png'); plt.close()"
    )
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    thumbs = p.locator("#gallery-list .thumb")
    # the shown chart (PNG and SVG), and the one only saved (savefig, PNG)
    assert thumbs.count() == 2
    assert thumbs.first.get_attribute("aria-label") == "Enlarge Chart 1: votes"

    thumbs.first.click()
    dialog = p.locator("#chart-dialog")
    assert dialog.evaluate("(d) => d.open")
    assert p.locator("#chart-title").inner_text() == "Chart 1: votes"
    p.wait_for_function(
        "() => { const i = document.querySelector('#chart-dialog img');"
        " return i && i.complete && i.naturalWidth > 0; }"
    )
    name, png = downloaded(p, p.locator("#chart-png").click)
    assert name.endswith("-chart-1.png") and png.startswith(b"\x89PNG\r\n\x1a\n")
    name, svg = downloaded(p, p.locator("#chart-svg").click)
    assert name.endswith("-chart-1.svg") and b"<svg" in svg[:500] and b"votes" in svg
    p.keyboard.press("Escape")
    assert not dialog.evaluate("(d) => d.open")
    # focus goes back to the thumbnail that opened it
    assert thumbs.first.evaluate("(t) => t === document.activeElement")

    # a raster-only chart: PNG, and a sentence instead of an SVG button
    thumbs.nth(1).click()
    assert not p.locator("#chart-svg").is_visible()
    assert p.locator("#chart-svg-hint").is_visible()
    _, png = downloaded(p, p.locator("#chart-png").click)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    p.locator("#chart-close").click()
    page.assert_clean()


# --- history ------------------------------------------------------------------------------


def test_the_history_survives_a_reload(page: Page) -> None:
    p = page.page
    marker = f"history-{uuid.uuid4().hex[:8]}"
    code = f"print('{marker}')\nimport matplotlib.pyplot as plt\nplt.plot([1, 3]); plt.show()"
    page.type_code(code)
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    first = p.locator(".history-item").first
    first.locator(f".history-code:text-is(\"print('{marker}')\")").wait_for(timeout=10_000)
    run_id = first.get_attribute("data-run-id")

    # another page, a reload: the history is the gateway's, not the tab's
    page.type_code("print('something else')")
    page.reload()
    item = p.locator(f".history-item[data-run-id='{run_id}']")
    item.wait_for(timeout=10_000)
    assert f"print('{marker}')" in item.inner_text()
    assert "succeeded" in item.inner_text()
    assert p.locator("#outputs").inner_text() == ""

    # open it (in place of the draft never run: yes): its code, outputs, chart, status again
    with page.answering(True) as asked:
        item.click()
    assert len(asked) == 1
    p.wait_for_selector(f"#outputs .stream.stdout:has-text('{marker}')")
    assert page.code() == code
    assert page.status() == "succeeded"
    assert item.get_attribute("aria-current") == "true"
    assert p.locator("#gallery-list .thumb").count() == 1
    _, data = downloaded(p, p.locator("#download").click)
    assert nbformat.reads(data.decode(), as_version=4).cells[0].source == code

    # re-run it: a new run, at the top of the history
    p.locator("#rerun").click()
    assert page.wait_status(*FINAL) == "succeeded"
    p.wait_for_function(
        "(old) => { const top = document.querySelector('.history-item');"
        " return top && top.dataset.runId !== old; }",
        arg=run_id,
    )
    newest = p.locator(".history-item").first
    assert f"print('{marker}')" in newest.inner_text()
    assert newest.get_attribute("aria-current") == "true"
    page.assert_clean()


# --- notebooks ----------------------------------------------------------------------------


def test_a_dropped_notebook_replays_cell_by_cell(page: Page) -> None:
    p = page.page
    text = ipynb(
        ("markdown", "# A replay\nIt prints, **draws**, then waits."),
        ("code", "print('one', flush=True)"),
        (
            "code",
            "import matplotlib.pyplot as plt\nplt.plot([3, 1, 2]); plt.title('drawn')\nplt.show()",
        ),
        ("code", "import time\nprint('three', flush=True)\ntime.sleep(120)"),
        ("code", "print('four')"),
    )
    page.drop({"replay.ipynb": text})
    p.wait_for_selector("#notebook-view:not([hidden]) .code-cell")
    assert p.locator("#notebook-title").inner_text() == "replay.ipynb"
    # markdown rendered (and cleaned), code in editors, highlighted
    assert p.locator(".markdown-cell h1").inner_text() == "A replay"
    assert p.locator(".markdown-cell strong").inner_text() == "draws"
    assert p.locator(".code-cell .cm-editor").count() == 4

    p.locator("#run-all").click()
    # The cells' outputs arrive while the replay runs: cell 3 prints, then waits 120 s; the
    # outputs of cells 1 to 3 are on show, and their times, while cell 3 has not finished.
    p.wait_for_selector(
        ".code-cell[data-index='3'] .cell-outputs:has-text('three')", timeout=30_000
    )
    cells = page.cells()
    assert [c["status"] for c in cells] == ["ok", "ok", "running", "queued"], cells
    assert cells[0]["output"].strip() == "one" and cells[0]["prompt"] == "[1]"
    assert p.locator(".code-cell[data-index='2'] img.image-output").count() == 1
    assert cells[1]["time"].endswith(("ms", " s")) and cells[2]["time"]
    assert page.status("#nb-status") == "running"
    assert "3 of 4 code cells" in p.locator("#nb-progress").inner_text()
    assert p.locator("#gallery-list .thumb").count() == 1  # the chart, live
    assert "In [2] finished" in page.said() or "In [1] finished" in page.said()

    p.locator("#nb-cancel").click()
    assert page.wait_status(*FINAL, which="#nb-status", timeout=20) == "cancelled"
    cells = page.cells()
    assert [c["status"] for c in cells] == ["ok", "ok", "cancelled", "not_run"], cells
    assert "three" in cells[2]["output"] and cells[3]["output"] == ""
    assert p.locator("#run-all").is_enabled() and not p.locator("#nb-cancel").is_enabled()

    # the executed notebook: the cells run so far, with their outputs
    name, data = downloaded(p, p.locator("#nb-download").click)
    assert name == "replay.executed.ipynb"
    executed = nbformat.reads(data.decode(), as_version=4)
    nbformat.validate(executed)
    assert executed.cells[1].outputs[0]["text"] == "one\n"
    assert executed.cells[4].outputs == []
    page.assert_clean()


NOTEBOOK_WITH_DATA = [
    (
        "markdown",
        "## Births by year\nReads `data/births.csv`, next to the notebook: the births $b_y$"
        " of each year $y$, and their total $\\sum_y b_y$.",
    ),
    ("code", "import pandas as pd\nbirths = pd.read_csv('data/births.csv')\nbirths"),
    (
        "code",
        "import matplotlib.pyplot as plt\n"
        "plt.figure(figsize=(5, 3))\n"
        "plt.plot(births.year, births.births, marker='o')\n"
        "plt.xticks(births.year)\n"
        "plt.title('births per year')\n"
        "plt.show()",
    ),
    ("code", "print(open('data/notes/readme.txt').read().strip())\nprint(births.births.sum())"),
]


def test_a_notebook_with_its_folder_of_data(page: Page, tmp_path: Path) -> None:
    p = page.page
    folder = tmp_path / "handbook"
    (folder / "data" / "notes").mkdir(parents=True)
    (folder / ".ipynb_checkpoints").mkdir()
    (folder / "births.ipynb").write_text(ipynb(*NOTEBOOK_WITH_DATA))
    (folder / "data" / "births.csv").write_text("year,births\n2019,120\n2020,115\n2021,131\n")
    (folder / "data" / "notes" / "readme.txt").write_text("data from the test\n")
    (folder / ".ipynb_checkpoints" / "births-checkpoint.ipynb").write_text("{}")

    # Add folder…: the notebook opens, its folder's files are staged relative to it
    p.locator("#tab-notebook").click()
    with p.expect_file_chooser() as chooser:
        p.locator("#add-folder").click()
    chooser.value.set_files(str(folder))
    p.wait_for_selector("#notebook-view .code-cell")
    assert p.locator("#notebook-title").inner_text() == "births.ipynb"
    assert p.locator(".markdown-cell .katex").count() == 3  # its math typeset
    staged = p.locator("#file-list .file-path").all_inner_texts()
    assert staged == ["data/births.csv", "data/notes/readme.txt"]
    assert "hidden" in p.locator("#files-summary").inner_text()

    p.keyboard.press("Control+Enter")  # outside an editor: runs what is on show
    assert page.wait_status(*FINAL, which="#nb-status") == "succeeded"
    cells = page.cells()
    assert [c["status"] for c in cells] == ["ok", "ok", "ok"], cells
    assert [c["prompt"] for c in cells] == ["[1]", "[2]", "[3]"]
    assert cells[2]["output"].split() == ["data", "from", "the", "test", "366"]
    table = p.frame_locator(".code-cell[data-index='1'] iframe.html-output").locator("td")
    table.first.wait_for()
    assert "2020" in table.all_inner_texts()
    assert p.locator("#gallery-list .thumb").count() == 1
    assert "3 of 3 code cells ran" in p.locator("#nb-progress").inner_text()
    screenshot(p, "page-notebook.png")

    _, data = downloaded(p, p.locator("#nb-download").click)
    executed = nbformat.reads(data.decode(), as_version=4)
    nbformat.validate(executed)
    assert [c.execution_count for c in executed.cells if c.cell_type == "code"] == [1, 2, 3]

    # the replay is in the history as a notebook; opening it shows the executed notebook
    p.locator("#tab-code").click()
    page.reload()
    item = p.locator(".history-item").first
    item.wait_for()
    assert "notebook" in item.inner_text()
    item.click()
    # (the notebook this browser kept shows first: the run opened replaces it when it came)
    assert page.wait_status("succeeded", which="#nb-status", timeout=20) == "succeeded"
    assert page.cells()[2]["output"].split()[-1] == "366"
    page.assert_clean()


# --- keyboard and screen reader -------------------------------------------------------------


def axe_violations(p: Any) -> list[dict[str, Any]]:
    """axe-core's WCAG 2 A and AA rules on the page as it is now (serious and critical)."""
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


def tab_to(p: Any, selector: str, limit: int = 40) -> list[str]:
    """Press Tab until `selector` has the focus; the ids (or classes) passed on the way."""
    passed = []
    for _ in range(limit):
        p.keyboard.press("Tab")
        if p.evaluate("(s) => document.activeElement.matches(s)", selector):
            return passed
        passed.append(
            p.evaluate("() => document.activeElement.id || document.activeElement.className")
        )
    raise AssertionError(f"{selector} never got the focus; passed {passed}")


def test_keyboard_only_and_a_screen_reader(page: Page, tmp_path: Path) -> None:
    p = page.page
    assert axe_violations(p) == []
    # the live region is where status changes are spoken
    assert p.locator("#announcer").get_attribute("role") == "status"
    assert p.locator("#announcer").get_attribute("aria-live") == "polite"

    # From the top: the skip link first, then the views' tabs, the toolbar, the editor.
    p.keyboard.press("Tab")
    assert p.evaluate("document.activeElement.textContent") == "Skip to the editor"
    p.keyboard.press("Enter")
    passed = tab_to(p, "#editor .cm-content")
    assert passed == ["tab-code", "language", "timeout", "run"], passed
    p.keyboard.press("Control+a")
    p.keyboard.insert_text(
        "import matplotlib.pyplot as plt\nplt.plot([2, 1]); plt.show()\nprint('by keys')"
    )
    p.keyboard.press("Control+Enter")
    assert page.wait_status(*FINAL) == "succeeded"
    p.wait_for_function(
        "() => document.querySelector('#announcer').textContent.includes('succeeded')"
    )

    # Escape, Tab: out of the editor, on to what the kernels have, the result, the files, the
    # chart, the history
    p.keyboard.press("Escape")
    passed = tab_to(p, "#gallery-list .thumb")
    assert passed[:3] == ["environment-toggle", "rerun", "download"], passed
    p.keyboard.press("Enter")
    assert p.locator("#chart-dialog").evaluate("(d) => d.open")
    assert p.evaluate("document.activeElement.id") in ("chart-png", "chart-close")
    assert axe_violations(p) == []
    p.keyboard.press("Escape")
    tab_to(p, ".history-item")
    p.keyboard.press("Enter")  # the run just made, opened again
    p.wait_for_function(
        "() => document.querySelector('#announcer').textContent.includes('Opened run')"
    )

    # The notebook view by keys: the tabs move with the arrows, the file picker opens on Enter.
    p.locator("#tab-code").focus()
    p.keyboard.press("ArrowRight")
    assert p.evaluate("document.activeElement.id") == "tab-notebook"
    assert p.locator("#notebook-view").is_visible() and not p.locator("#code-view").is_visible()
    tab_to(p, "#open-notebook")
    with p.expect_file_chooser() as chooser:
        p.keyboard.press("Enter")
    path = tmp_path / "keys.ipynb"
    path.write_text(ipynb(("markdown", "# Keys"), ("code", "print('cell by keys')")))
    chooser.value.set_files(str(path))
    p.wait_for_selector("#notebook-view .code-cell")
    assert "Opened" in page.said()
    tab_to(p, "#run-all")
    p.keyboard.press("Enter")
    assert page.wait_status(*FINAL, which="#nb-status") == "succeeded"
    p.wait_for_function("() => document.querySelector('#announcer').textContent.includes('Replay')")
    assert axe_violations(p) == []
    page.assert_clean()


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
def secured() -> Iterator[GatewayThread]:
    yield from serving(GatewayThread(backend="local", users={TOKEN: ("pat", "user")}).start())


def test_with_tokens_the_page_asks_for_one(context: Any, secured: GatewayThread) -> None:
    page = Page(context.new_page(), f"http://127.0.0.1:{secured.port}")
    p = page.page
    assert p.locator("#token-row").is_visible()
    assert "token" in p.locator("#history-message").inner_text()
    page.type_code("print(6 * 7)")
    p.locator("#run").click()
    assert "token" in p.locator("#message").inner_text()

    p.fill("#token", "not-the-right-token-at-all")
    p.locator("#run").click()
    assert page.wait_status("error") == "error"
    assert p.locator("#connection").get_attribute("data-state") == "failed"

    p.fill("#token", TOKEN)
    p.locator("#token").dispatch_event("change")
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    assert p.locator(".stream.stdout").inner_text() == "42\n"
    assert p.evaluate("sessionStorage.getItem('gateway-token')") == TOKEN
    _, data = downloaded(p, p.locator("#download").click)
    assert nbformat.reads(data.decode(), as_version=4).cells[0].outputs[0]["text"] == "42\n"
    # the history is read with the token, and again after a reload (the tab keeps it)
    p.locator(".history-item").first.wait_for()
    page.reload()
    p.locator(".history-item").first.wait_for()
    assert "print(6 * 7)" in p.locator(".history-item").first.inner_text()
    # the refused handshake and the history read without a token are the only errors
    assert all("WebSocket" in e or "401" in e for e in page.console_errors()), page.errors
    assert page.violations() == []


def test_the_page_never_loads_anything_from_elsewhere(page: Page) -> None:
    """Everything the page loads is the gateway's own (no CDN, no fonts, no analytics)."""
    p = page.page
    loaded = p.evaluate("() => performance.getEntriesByType('resource').map((e) => e.name)")
    assert loaded and all(name.startswith(page.base + "/") for name in loaded), loaded
    assert {name.split("/")[3] for name in loaded} == {"static", "v1"}, loaded
    scripts = p.evaluate("() => [...document.scripts].map((s) => s.src)")
    assert len(scripts) == 1 and scripts[0].startswith(page.base + "/static/dist/page-")
