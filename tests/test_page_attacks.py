"""Untrusted content never runs in the page's origin, in real Chromium (Playwright).

What a run prints and displays, and everything in a notebook someone sends you (its markdown
cells, its stored outputs, its metadata, its cell ids), is the attacker's. Each payload here
would, if it ran in the page, set `document.title` (or `parent.document.title` from a frame) or
`window.pwned`. The layers are held to account one by one. What reaches the page's DOM is inert
(no script element, no event handler attribute, no javascript: URL, no style, form or frame of
the attacker's): DOMPurify's work, checked on the DOM itself; math is KaTeX's, untrusting (no
link, id, class, style or data of the author's, sizes capped). An HTML output's frame runs no
script (sandboxed with allow-same-origin only: the page applies the output's styles), and its
styles stay in it. Every test runs twice: with the
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
    // an output's frame: no scripts (no allow-scripts), its only flag allow-same-origin
    if (el.tagName === 'IFRAME' && el.getAttribute('sandbox') !== 'allow-same-origin')
      bad.push('iframe sandbox=' + el.getAttribute('sandbox'));
  }
  for (const el of document.querySelectorAll('.markdown *')) {
    if (el.closest('.katex-display, .katex, .katex-error')) continue; // KaTeX's own nodes, made by the page: below
    if (['STYLE', 'FORM', 'INPUT', 'BUTTON', 'SVG', 'MATH', 'OBJECT', 'EMBED', 'BASE', 'IFRAME']
        .includes(el.tagName.toUpperCase())) bad.push('markdown ' + el.tagName);
    for (const name of ['style', 'id', 'class']) if (el.hasAttribute(name)) bad.push('markdown @' + name);
  }
  // Math typeset by KaTeX (untrusted): its classes and styles are KaTeX's, never the author's;
  // no link, image, id or data of the author's.
  for (const el of document.querySelectorAll('.katex-display, .katex, .katex *, .katex-error')) {
    if (['A', 'IMG', 'IFRAME', 'FORM', 'SCRIPT', 'STYLE', 'LINK', 'OBJECT', 'EMBED']
        .includes(el.tagName.toUpperCase())) bad.push('katex ' + el.tagName);
    for (const name of el.getAttributeNames()) {
      if (['id', 'href', 'src', 'xlink:href'].includes(name) || name.startsWith('data-'))
        bad.push('katex @' + name);
    }
    for (const name of el.classList) if (['top', 'skip-link', 'pwned'].includes(name)) bad.push('katex .' + name);
    if (/position|url\\(|inset/i.test(el.getAttribute('style') || '')) bad.push('katex style ' + el.getAttribute('style'));
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
    assert p.locator(".code-cell .cell-id").inner_text().startswith('id <img src=x onerror="')
    # a stored HTML output is in the sandbox, a stored SVG an <img>, JavaScript not shown
    frame = p.locator(".code-cell iframe.html-output")
    assert frame.get_attribute("sandbox") == "allow-same-origin"
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
    assert p.locator("#outputs iframe.html-output").get_attribute("sandbox") == "allow-same-origin"
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


# TeX is code for KaTeX: what a markdown cell's math could do if KaTeX trusted it (links,
# classes, ids, styles, data attributes, images from elsewhere), sizes to cover the page,
# macros that never end, and markup smuggled through math or through forged placeholders.
MATH_ATTACKS = [
    f"$\\href{{javascript:{RUN}}}{{click me}}$",
    f"$$\\url{{javascript:{RUN}}}$$",
    "$\\htmlClass{top}{\\text{dressed as the page's header}}$",
    "$\\htmlId{run}{\\text{a second Run}}$",
    "$\\htmlStyle{position:fixed;inset:0;background:white}{\\text{an overlay}}$",
    "$\\htmlData{pwned=1}{x}$",
    "$\\includegraphics[height=1em]{https://tracker.example/pixel.png}$",
    "$\\rule{100000em}{100000em}$ and $\\raisebox{100000em}{up}$",
    "$\\def\\a{\\a\\a}\\a$",
    f'$x</span><img src=x onerror="{RUN}"><span>$',
    f'<span data-math="0">forged</span><div data-math="0 onclick={RUN}">x</div>'
    f'<a data-math="1" href="javascript:{RUN}">a</a>',
    f"\\(\\href{{javascript:{RUN}}}{{x}}\\) and `$\\href{{javascript:{RUN}}}{{x}}$`",
]


def test_math_runs_nothing(page: Page) -> None:
    """KaTeX runs untrusted (`trust: false`): what needs trust is shown as red text, sizes
    are capped, and the page stays the page's."""
    p = page.page
    title = p.title()
    asked: list[str] = []
    p.on("request", lambda request: asked.append(request.url))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell(tex, id=f"m{i}") for i, tex in enumerate(MATH_ATTACKS)
    ]
    # and a stored text/latex output: the same TeX, with markup around it
    code = nbformat.v4.new_code_cell("print(1)", id="latex")
    latex = (
        f'<img src=x onerror="{RUN}"> $\\href{{javascript:{RUN}}}{{x}}$ \\(\\htmlId{{run}}{{y}}\\)'
    )
    code.outputs = [nbformat.v4.new_output("display_data", data={"text/latex": latex})]
    nb.cells.append(code)
    page.drop({"math.ipynb": nbformat.writes(nb)})
    p.wait_for_selector("#notebook-view .markdown-cell .katex")
    p.wait_for_timeout(500)
    cells = p.locator(".markdown-cell")
    assert cells.count() == len(MATH_ATTACKS)
    # typeset, but what wants trust is the TeX itself, in KaTeX's error colour
    refused = p.evaluate(
        """() => [...document.querySelectorAll('.markdown-cell .katex')].flatMap((k) =>
            [...k.querySelectorAll('.katex-html *')].filter((e) =>
              !e.children.length && /^\\\\(href|url|htmlClass|htmlId|htmlStyle|htmlData|includegraphics)$/
                .test(e.textContent) && getComputedStyle(e).color === 'rgb(204, 0, 0)')
            .map((e) => e.textContent))"""
    )
    assert set(refused) >= {
        "\\href",
        "\\url",
        "\\htmlClass",
        "\\htmlId",
        "\\htmlStyle",
        "\\htmlData",
        "\\includegraphics",
    }, refused
    assert p.locator(".markdown-cell a[href]").count() == 0  # no link survived
    assert p.locator(".markdown-cell img").count() == 0
    assert p.locator("#run").count() == 1 and p.locator(".top").count() == 1
    assert p.locator("[data-pwned], [data-math]").count() == 0
    # sizes capped (KaTeX's maxSize, 20 em): nothing as big as the page, nothing raised out
    # of its cell (the cells clip what leaves them up or down)
    big = p.evaluate(
        """() => Math.max(...[...document.querySelectorAll('.markdown-cell .katex *')].map(
            (e) => Math.max(e.getBoundingClientRect().width, e.getBoundingClientRect().height)))"""
    )
    assert big < 1000, big
    assert p.evaluate(
        "() => [...document.querySelectorAll('.markdown')].every("
        "(m) => getComputedStyle(m).overflowY === 'clip')"
    )
    # the endless macro is an error in place, not a hung page; the smuggled markup is text
    error = cells.nth(8).locator(".katex-error")
    assert "Too many expansions" in (error.get_attribute("title") or "")
    assert error.evaluate("(e) => getComputedStyle(e).color") == "rgb(204, 0, 0)"
    assert '<img src=x onerror="' in cells.nth(9).locator(".katex").text_content()
    # the forged placeholders are plain elements again; the code span keeps its TeX as text
    assert "forged" in cells.nth(10).inner_text()
    assert cells.nth(11).locator("code").inner_text().startswith("$\\href{javascript:")
    output = p.locator(".code-cell .latex-output")
    assert output.locator(".katex").count() == 2
    assert output.inner_text().startswith('<img src=x onerror="')  # text, as written
    assert all(url.startswith(page.base + "/") or url.startswith("data:") for url in asked), asked
    assert_nothing_ran(page, title)
    assert page.violations() == []  # KaTeX's own nodes included: nothing the CSP refused


def test_an_html_outputs_styles_stay_in_its_frame(
    page: Page, request: pytest.FixtureRequest
) -> None:
    """An output's own styles apply now, in its frame only: nothing it styles reaches the page,
    its frame stops growing at 1200 px, and what its CSS names elsewhere is never loaded: not
    its @import or <link> (dropped), not its fonts or images (the CSP's font-src and img-src,
    which the frame inherits; as for an <img> in an output, the CSP is the layer that stops
    them, so with the CSP off they are asked for)."""
    p = page.page
    title = p.title()
    loaded: list[str] = []
    refused: list[str] = []
    p.on("requestfinished", lambda r: loaded.append(r.url))
    p.on("requestfailed", lambda r: refused.append(f"{r.url} {r.failure}"))
    html = (
        "<style>@import url(https://tracker.example/a.css);"
        "body { background: url(https://tracker.example/b.png); }"
        "@font-face { font-family: x; src: url(https://tracker.example/c.woff2); }"
        "p { font-family: x; } .top { display: none; }</style>"
        '<link rel="stylesheet" href="https://tracker.example/d.css">'
        '<div style="position:fixed;inset:0;background:red;z-index:99999">an overlay</div>'
        '<p style="height:100000px;background-image:url(https://tracker.example/e.png)">tall</p>'
        f'<img src=x onerror="{FRAME_RUN}"><script>{FRAME_RUN}</script>'
    )
    cell = nbformat.v4.new_code_cell("print(1)", id="c")
    cell.outputs = [nbformat.v4.new_output("display_data", data={"text/html": html})]
    nb = nbformat.v4.new_notebook()
    nb.cells = [cell]
    page.drop({"styles.ipynb": nbformat.writes(nb)})
    frame = p.locator(".code-cell iframe.html-output")
    frame.wait_for()
    p.wait_for_function(
        "() => { const f = document.querySelector('iframe.html-output');"
        " return f.contentDocument && f.contentDocument.querySelector('p[style]'); }"
    )
    p.wait_for_timeout(500)
    # the styles did apply, in the frame
    assert (
        frame.evaluate("(f) => getComputedStyle(f.contentDocument.querySelector('div')).position")
        == "fixed"
    )
    # the overlay covers its frame, not the page: the page's header and Run all are on top
    assert (
        p.evaluate(
            "() => { const b = document.querySelector('#run-all').getBoundingClientRect();"
            " return document.elementFromPoint(b.x + 3, b.y + 3).id; }"
        )
        == "run-all"
    )
    assert p.locator("header.top").is_visible()
    assert 24 < (frame.bounding_box() or {}).get("height", 0) <= 1202
    elsewhere = [url for url in loaded if not url.startswith((page.base + "/", "data:", "about:"))]
    assert elsewhere == [], elsewhere
    named = " ".join(refused)
    assert "a.css" not in named and "d.css" not in named  # never even asked for
    if request.node.callspec.params["page"] == "csp":
        assert all(r.endswith(" csp") for r in refused if "tracker" in r), refused
    assert_nothing_ran(page, title)
