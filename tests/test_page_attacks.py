"""Untrusted content never runs in the page's origin, in real Chromium (Playwright).

What a run prints and displays, and everything in a notebook someone sends you (its markdown
cells, its stored outputs, its metadata, its cell ids), is the attacker's. Each payload here
would, if it ran in the page, set `document.title` (or `parent.document.title` from a frame) or
`window.pwned`. The layers are held to account one by one. What reaches the page's DOM is inert
(no script element, no event handler attribute, no javascript: URL, no style, form or frame of
the attacker's): DOMPurify's work, checked on the DOM itself. Every test runs twice: with the
page's CSP, and with the CSP switched off in the browser (Playwright's bypass_csp), where
nothing runs either, so that the sanitizer and the sandboxed iframes (no allow-scripts) are
each enough alone. Under the CSP, the only refusals allowed are those Chrome reports as DOMPurify
parses the attacker's markup into an inert document of its own (Chrome checks a handler or a
style attribute as it is parsed, whatever the document), never one from the page's own code.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import nbformat
import pytest

from tests.browser import FINAL, RECORD_VIOLATIONS, Page, ipynb
from tests.support import GatewayThread

pytestmark = pytest.mark.attack

RUN = "document.title='pwned';window.pwned=1"
FRAME_RUN = "parent.document.title='pwned';parent.pwned=1"
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

MARKDOWN_ATTACKS = [
    f"<script>{RUN}</script>",
    f'<img src=x onerror="{RUN}">',
    f"[a javascript: link](javascript:{RUN})",
    f'<a href="javascript:{RUN}">a raw javascript: link</a>',
    f'<a href="JaVaScRiPt&colon;{RUN}">an encoded one</a>',
    f'<a href="data:text/html,<script>{RUN}</script>">a data: link</a>',
    f"<iframe src=\"javascript:{RUN}\"></iframe><iframe srcdoc='<script>{FRAME_RUN}</script>'>",
    f'<svg onload="{RUN}"><script>{RUN}</script></svg>',
    f'<math><mtext><table><mglyph><style><img src=x onerror="{RUN}">',
    f'<details open ontoggle="{RUN}"><summary>x</summary></details>',
    f'<form action="javascript:{RUN}"><button>Send</button><input name=token></form>',
    f'<object data="javascript:{RUN}"></object><embed src="javascript:{RUN}">',
    '<div style="position:fixed;inset:0;background:white" class="top" id="run">'
    "a full-page overlay that dresses up as the page</div>",
    f"<base href='javascript:{RUN}//'><a href='x'>relative</a>",
    '<img src="https://tracker.example/pixel.png" alt="remote">',
    "![attached](attachment:dot.png) and `code` and **bold**",
]

# What a notebook carries besides its cells' text: metadata and ids the page shows.
HOSTILE_METADATA = {
    "title": f'<img src=x onerror="{RUN}">',
    "kernelspec": {
        "name": "python3",
        "language": "python",
        "display_name": f'<script>{RUN}</script><img src=x onerror="{RUN}">',
    },
    "authors": [{"name": f"<svg onload='{RUN}'>"}],
}


def hostile_notebook() -> str:
    nb = nbformat.v4.new_notebook(metadata=HOSTILE_METADATA)
    for i, attack in enumerate(MARKDOWN_ATTACKS):
        cell = nbformat.v4.new_markdown_cell(attack, id=f"md{i}")
        if "attachment:" in attack:
            cell.attachments = {"dot.png": {"image/png": PNG}}
        nb.cells.append(cell)
    code = nbformat.v4.new_code_cell("print(1)", id="code")
    code.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={
                "text/html": f'<b>stored</b><script>{FRAME_RUN}</script><img src=x onerror="{FRAME_RUN}">',
            },
        ),
        nbformat.v4.new_output(
            "display_data",
            data={"text/markdown": f'<img src=x onerror="{RUN}"><script>{RUN}</script>'},
        ),
        nbformat.v4.new_output(
            "display_data",
            data={
                "image/svg+xml": '<svg xmlns="http://www.w3.org/2000/svg" onload="'
                + FRAME_RUN
                + '"><script>'
                + FRAME_RUN
                + "</script></svg>"
            },
        ),
        nbformat.v4.new_output("display_data", data={"application/javascript": RUN}),
    ]
    nb.cells.append(code)
    text = json.loads(nbformat.writes(nb))
    # An id nbformat would refuse: the page shows a notebook before the gateway checks it.
    text["cells"][-1]["id"] = f'<img src=x onerror="{RUN}">'
    return json.dumps(text)


@pytest.fixture(params=["csp", "csp-off"])
def page(
    chromium_browser: Any, page_gateway: GatewayThread, request: pytest.FixtureRequest
) -> Iterator[Page]:
    context = chromium_browser.new_context(
        viewport={"width": 1360, "height": 900}, bypass_csp=request.param == "csp-off"
    )
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        yield Page(context.new_page(), f"http://127.0.0.1:{page_gateway.port}")
    finally:
        context.close()


INERT = """() => {
  // The page's own DOM (frames are the sandbox's): what the attacker's markup became.
  const bad = [];
  const ours = document.querySelector('script[type=module]');
  for (const el of document.querySelectorAll('*')) {
    if (el.tagName === 'SCRIPT' && el !== ours) bad.push('script');
    for (const attr of el.attributes) {
      if (/^on/i.test(attr.name)) bad.push(el.tagName + ' ' + attr.name);
      if (/^\\s*(javascript:|vbscript:|data:text)/i.test(attr.value))
        bad.push(el.tagName + ' ' + attr.name + '=' + attr.value.slice(0, 40));
    }
    if (el.tagName === 'IFRAME' && el.getAttribute('sandbox') !== '') bad.push('unsandboxed iframe');
  }
  for (const el of document.querySelectorAll('.markdown *')) {
    if (['STYLE', 'FORM', 'INPUT', 'BUTTON', 'SVG', 'MATH', 'OBJECT', 'EMBED', 'BASE', 'IFRAME']
        .includes(el.tagName.toUpperCase())) bad.push('markdown ' + el.tagName);
    for (const name of ['style', 'id', 'class']) if (el.hasAttribute(name)) bad.push('markdown @' + name);
  }
  return bad;
}"""


def assert_nothing_ran(page: Page, title: str) -> None:
    p = page.page
    assert p.title() == title
    assert p.evaluate("window.pwned") is None
    assert p.evaluate(INERT) == []
    # What the CSP refused, it refused while DOMPurify parsed the markup (Chrome checks a
    # handler or style attribute as it is parsed, in any document): never from our own code.
    refused = [v for v in page.violations() if "/static/dist/vendor-" not in v["source"]]
    assert refused == [], json.dumps(refused, indent=1)


def test_a_hostile_notebook_is_shown_inert(page: Page) -> None:
    p = page.page
    title = p.title()
    page.drop({"hostile.ipynb": hostile_notebook()})
    p.wait_for_selector("#notebook-view .code-cell")
    p.wait_for_timeout(500)  # give any handler its chance (an image's error, a toggle)

    # the markup became text or nothing; what is legitimate still renders
    cells = p.locator(".markdown-cell")
    assert cells.count() == len(MARKDOWN_ATTACKS)
    assert p.locator(".markdown-cell strong").inner_text() == "bold"
    attached = p.locator(".markdown-cell img")
    assert attached.count() == 1 and (attached.get_attribute("src") or "").startswith(
        "data:image/png;base64,"
    )
    assert "[image: remote]" in p.locator("#cells").inner_text()  # not loaded from elsewhere
    links = p.locator(".markdown-cell a")
    for i in range(links.count()):
        href = links.nth(i).get_attribute("href")
        assert href is None or href.startswith(("http:", "https:", "x")), href
        if href:
            assert links.nth(i).get_attribute("rel") == "noopener noreferrer nofollow"
    # metadata and the cell id are shown as the text they are
    assert "<script>document.title" in p.locator("#notebook-meta").inner_text()
    assert p.locator(".cell-id").inner_text().startswith('id <img src=x onerror="')
    # a stored HTML output is in the sandbox, a stored SVG an <img>, JavaScript not shown
    frame = p.locator(".code-cell iframe.html-output")
    assert frame.get_attribute("sandbox") == ""
    p.frame_locator(".code-cell iframe.html-output").locator("b").wait_for()
    assert (
        p.locator(".code-cell img.image-output")
        .get_attribute("src")
        .startswith("data:image/svg+xml")
    )
    assert "application/javascript" in p.locator(".code-cell .cell-outputs").inner_text()

    # clicking every link (the javascript: ones are hrefless now) runs nothing either
    for i in range(links.count()):
        if links.nth(i).get_attribute("href") is None:
            links.nth(i).click()
    assert p.locator("#run").is_visible() is False  # the overlay did not replace our #run
    assert p.locator("#run").count() == 1
    assert_nothing_ran(page, title)


def test_a_replayed_notebook_whose_outputs_attack(page: Page) -> None:
    """The same payloads as a run's live outputs: markdown, HTML, SVG, JavaScript."""
    p = page.page
    title = p.title()
    payloads = [f'<img src=x onerror="{RUN}">', f"<script>{RUN}</script>", f"[x](javascript:{RUN})"]
    text = ipynb(
        ("markdown", "# Outputs that attack"),
        (
            "code",
            "from IPython.display import HTML, Javascript, Markdown, SVG, display\n"
            + "".join(f"display(Markdown({payload!r}))\n" for payload in payloads)
            + f"display(HTML({'<b>live</b><script>' + FRAME_RUN + '</script>'!r}))\n"
            + 'display(SVG(\'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9">'
            + '<rect width="9" height="9"/></svg>\'))\n'
            + f"display(Javascript({RUN!r}))",
        ),
        kernel_title=f'<img src=x onerror="{RUN}">',
    )
    page.drop({"outputs.ipynb": text})
    p.wait_for_selector("#notebook-view .code-cell")
    p.locator("#run-all").click()
    assert page.wait_status(*FINAL, which="#nb-status") == "succeeded"
    p.frame_locator(".code-cell iframe.html-output").locator("b").wait_for()
    assert p.locator(".code-cell .markdown-output").count() == len(payloads)
    p.wait_for_timeout(500)
    assert_nothing_ran(page, title)


def test_a_run_whose_outputs_attack(page: Page) -> None:
    p = page.page
    title = p.title()
    html = f'<b>bold</b><script>{FRAME_RUN}</script><img src=x onerror="{FRAME_RUN}">'
    markdown = f'<img src=x onerror="{RUN}"> [x](javascript:{RUN})'
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="40" height="40"'
        f' onload="{FRAME_RUN}"><script>{FRAME_RUN}</script>'
        '<rect width="40" height="40" fill="teal"/></svg>'
    )
    code = (
        "from IPython.display import HTML, Markdown, SVG, display\n"
        f"display(HTML({html!r}))\ndisplay(Markdown({markdown!r}))\ndisplay(SVG({svg!r}))"
    )
    page.type_code(code)
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    p.frame_locator("#outputs iframe.html-output").locator("b").wait_for(timeout=10_000)
    # two layers: the iframe is sandboxed, and it inherits the page's CSP (no inline script)
    assert p.locator("#outputs iframe.html-output").get_attribute("sandbox") == ""
    p.wait_for_function(
        "() => [...document.querySelectorAll('#outputs img.image-output')].some("
        "i => i.complete && i.naturalWidth > 0)",
        timeout=10_000,
    )
    svg = p.locator("#outputs img.image-output").get_attribute("src") or ""
    assert svg.startswith("data:image/svg+xml")
    p.wait_for_timeout(500)
    assert_nothing_ran(page, title)
    assert p.evaluate("document.querySelectorAll('#outputs script, #outputs svg').length") == 0
