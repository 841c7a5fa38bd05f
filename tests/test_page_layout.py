"""The page's layout as its users meet it (issue 33), in real Chromium against a real gateway:
the files and the charts stay on screen beside a long notebook (a column at the side of a wide
window, a strip at the bottom of a narrow one), toolbar buttons keep their text on one line
and beside one another, and the header shows the gateway's health from the first moment (not
the WebSocket's state, which is unknown until the first run), then that it is draining, then
that it is gone."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest

from tests import census
from tests.browser import RECORD_VIOLATIONS, Page
from tests.support import REPO, GatewayThread

HANDBOOK = REPO / "notebooks" / "handbook" / "05.02-Introducing-Scikit-Learn.ipynb"


def chart_png(n: int) -> str:
    """A small real chart (matplotlib, as a kernel draws one), base64."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure = plt.figure(figsize=(3, 2))
    plt.plot([1, n, 2])
    plt.title(f"chart {n}")
    data = io.BytesIO()
    figure.savefig(data, format="png")
    plt.close(figure)
    return base64.b64encode(data.getvalue()).decode()


def long_notebook() -> str:
    """The Handbook's 05.02 (32 code cells), its first cells with a chart each, as if run."""
    nb = nbformat.read(HANDBOOK, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    for n, cell in enumerate(code[:3]):
        cell.outputs = [
            nbformat.v4.new_output(
                "display_data", data={"image/png": chart_png(n), "text/plain": "<Figure>"}
            )
        ]
    return str(nbformat.writes(nb))


@pytest.fixture
def browser_context(chromium_browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    width = getattr(request, "param", 1440)
    context = chromium_browser.new_context(viewport={"width": width, "height": 900})
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        yield context
    finally:
        context.close()


@pytest.fixture
def page(browser_context: Any, page_gateway: GatewayThread) -> Page:
    return Page(browser_context.new_page(), f"http://127.0.0.1:{page_gateway.port}")


# Whether an element is on screen and not covered: wholly inside the window, and what is drawn
# at its centre is itself (or inside it).
ON_SCREEN = """(selector) => {
  const node = document.querySelector(selector);
  if (!node) return `${selector}: none`;
  const box = node.getBoundingClientRect();
  if (box.width === 0 || box.height === 0) return `${selector}: not shown`;
  if (box.top < 0 || box.left < 0 || box.bottom > innerHeight || box.right > innerWidth)
    return `${selector}: off screen at ${JSON.stringify(box)} in ${innerWidth}x${innerHeight}`;
  const hit = document.elementFromPoint(box.left + box.width / 2, box.top + box.height / 2);
  if (!hit || !(node === hit || node.contains(hit)))
    return `${selector}: covered by ${hit && hit.outerHTML.slice(0, 80)}`;
  return '';
}"""

REACHABLE = ["#add-folder", "#add-files", "#gallery-list .thumb", "#history-refresh"]


@pytest.mark.parametrize("browser_context", [1440, 800], indirect=True)
def test_files_and_charts_stay_on_screen_beside_a_long_notebook(page: Page) -> None:
    p = page.page
    p.locator("#tab-notebook").click()
    page.drop({"05.02-Introducing-Scikit-Learn.ipynb": long_notebook()})
    p.wait_for_selector("#notebook-view .code-cell")
    assert p.locator("#gallery-list .thumb").count() == 3
    height = p.evaluate("document.documentElement.scrollHeight")
    assert height > 4 * 900, height  # a long page: the notebook is what scrolls
    wide = p.evaluate("innerWidth") > 1000
    # From the notebook's top to its end, the controls are where they were: no scrolling to
    # reach them, nothing over them.
    for at in (0.0, 0.5, 1.0):
        p.evaluate("(at) => window.scrollTo(0, at * document.documentElement.scrollHeight)", at)
        p.wait_for_function("() => true")  # a frame, for sticky positions
        problems = [p.evaluate(ON_SCREEN, selector) for selector in REACHABLE]
        assert [problem for problem in problems if problem] == [], at
        # the layout holds: no sideways scrolling; on a wide window the notebook is beside the
        # side panel, not under it (on a narrow one it scrolls under the strip)
        assert p.evaluate("document.documentElement.scrollWidth <= innerWidth")
        if wide:
            main = p.locator("#main").bounding_box()
            side = p.locator(".side").bounding_box()
            assert main and side and main["x"] + main["width"] <= side["x"]
    # one click away: Add folder… opens the folder picker where the notebook is
    with p.expect_file_chooser() as chooser:
        p.locator("#add-folder").click()
    assert chooser.value.element.get_attribute("id") == "folder-input"
    page.assert_clean()


BUTTON_LINES = """(ids) => ids.map((id) => {
  const button = document.getElementById(id);
  const text = document.createRange();
  text.selectNodeContents(button);
  const lines = new Set([...text.getClientRects()].map((r) => Math.round(r.top)));
  const box = button.getBoundingClientRect();
  return {id, lines: lines.size, top: Math.round(box.top), height: Math.round(box.height)};
})"""


def test_toolbar_buttons_keep_their_text_on_one_line(page: Page) -> None:
    """At 1440 px, Cancel beside Run (not wrapped to a row of its own), every button's text on
    one line; so in the notebook's toolbar."""
    p = page.page
    p.wait_for_selector("#environment[data-loaded=true]")  # the picker's labels are longest
    run, cancel = p.evaluate(BUTTON_LINES, ["run", "cancel"])
    assert run["lines"] == cancel["lines"] == 1, (run, cancel)
    assert cancel["top"] == run["top"] and cancel["height"] == run["height"], (run, cancel)
    # and on the toolbar's one row, with the language picker
    picker = p.locator("#language").bounding_box()
    assert picker and abs(picker["y"] + picker["height"] / 2 - (run["top"] + run["height"] / 2)) < 4

    p.locator("#tab-notebook").click()
    page.drop({"05.02-Introducing-Scikit-Learn.ipynb": long_notebook()})
    p.wait_for_selector("#notebook-view .code-cell")
    toolbar = p.evaluate(
        "() => [...document.querySelectorAll('#notebook-view .toolbar button')]"
        ".filter((b) => b.offsetParent && b.id).map((b) => b.id)"
    )
    assert {"run-all", "nb-cancel"} <= set(toolbar), toolbar
    shown = {b["id"]: b for b in p.evaluate(BUTTON_LINES, toolbar)}
    assert all(b["lines"] == 1 for b in shown.values()), shown
    assert shown["nb-cancel"]["top"] == shown["run-all"]["top"], shown
    page.assert_clean()


# --- the gateway's health in the header ------------------------------------------------------


@pytest.fixture
def own_gateway() -> Iterator[GatewayThread]:
    """A gateway of this test's own, to drain and stop under the page (stopped at the end if
    the test did not get that far)."""
    server = GatewayThread(backend="local").start()
    try:
        yield server
    finally:
        if server in census.LIVE_GATEWAYS:
            server.stop()


def test_the_header_shows_the_gateways_health(
    browser_context: Any, own_gateway: GatewayThread
) -> None:
    page = Page(browser_context.new_page(), f"http://127.0.0.1:{own_gateway.port}")
    p = page.page
    status = p.locator("#connection")
    # before any run (no WebSocket yet): the gateway is up, said at once
    p.wait_for_selector("#connection[data-health=up]", timeout=5_000)
    assert status.inner_text() == "gateway up"
    assert status.get_attribute("data-state") == "up"
    page.assert_clean()

    # draining (SIGTERM's first step): within the poll interval (10 s while up)
    services = own_gateway.gateway.services
    assert services is not None
    own_gateway.call(services.runs.drain())
    p.wait_for_selector("#connection[data-health=draining]", timeout=12_000)
    assert "draining" in status.inner_text()
    p.wait_for_function(
        "() => document.querySelector('#announcer').textContent.includes('draining')"
    )

    # gone: within the poll interval (10 s while up; 3 s while not, and an ask that hangs on a
    # connection the stopping gateway had open is given up after 5 s)
    own_gateway.stop()
    p.wait_for_selector("#connection[data-health=unreachable]", timeout=10_000)
    assert status.inner_text() == "gateway unreachable"
    assert status.get_attribute("data-state") == "unreachable"
    p.wait_for_function(
        "() => document.querySelector('#announcer').textContent.includes('unreachable')"
    )
    # (the refused fetches are the console's only errors)
    assert all("ERR_CONNECTION_REFUSED" in e or "Failed to fetch" in e for e in page.errors)
