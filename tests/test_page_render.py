"""What the page renders, as JupyterLab would (issue 33), in real Chromium against a real gateway
and real kernels: LaTeX in markdown cells and `text/latex` outputs typeset by KaTeX (its style
sheet and fonts served by the gateway under the page's CSP), code keeping its dollars; HTML
outputs keeping their own styles (inline and `<style>` blocks) in their sandboxed frames, so
that the Handbook's side-by-side DataFrames stand side by side, with JupyterLab's table look.
That untrusted TeX and HTML stay inert: test_page_attacks.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.browser import FINAL, RECORD_VIOLATIONS, Page, ipynb
from tests.support import GatewayThread


@pytest.fixture
def page(chromium_browser: Any, page_gateway: GatewayThread) -> Iterator[Page]:
    context = chromium_browser.new_context(viewport={"width": 1440, "height": 900})
    context.add_init_script(RECORD_VIOLATIONS)
    try:
        yield Page(context.new_page(), f"http://127.0.0.1:{page_gateway.port}")
    finally:
        context.close()


# --- LaTeX ------------------------------------------------------------------------------------

MATH_MARKDOWN = r"""# Fitting $y = f(x)$

The line $y = ax + b$, the mean $\bar{x} = \frac{1}{n}\sum_i x_i$ and, on a line of its own,

$$
\int_0^1 x^2 \, dx = \frac{1}{3}
$$

with \(a_1\) and \[b_{ij}\] as JupyterLab reads them, and $$\frac{p}{q}$$ in a sentence.

Code keeps its dollars: `echo $HOME` and `$x$`, and so does a block:

```
cost = "$5"  # $not math$
```

Prices are prose: $5 and $10, and so is an escaped \$x\$."""

# The TeX of each typeset formula (KaTeX's MathML annotation), in order.
TYPESET = [
    "y = f(x)",
    "y = ax + b",
    r"\bar{x} = \frac{1}{n}\sum_i x_i",
    r"\int_0^1 x^2 \, dx = \frac{1}{3}",
    "a_1",
    "b_{ij}",
    r"\frac{p}{q}",
]

# Where the numerator of a fraction is drawn against its denominator: above it (KaTeX's
# positions are inline styles set through the CSSOM; were they refused, they would stack
# wrongly or not at all).
FRACTION = """(root) => {
  const frac = root.querySelector('.mfrac');
  const [num, den] = [...frac.querySelectorAll('.vlist > span')].filter((s) => s.textContent)
    .sort((a, b) => a.getBoundingClientRect().top - b.getBoundingClientRect().top);
  return {num: num.textContent, den: den.textContent,
          above: num.getBoundingClientRect().bottom <= den.getBoundingClientRect().top + 1};
}"""


def test_latex_in_markdown_is_typeset_and_code_is_not(page: Page) -> None:
    p = page.page
    page.drop({"math.ipynb": ipynb(("markdown", MATH_MARKDOWN), ("code", "print('$x$')"))})
    p.wait_for_selector("#notebook-view .markdown-cell .katex")
    cell = p.locator(".markdown-cell").first
    tex = cell.locator("annotation[encoding='application/x-tex']").all_text_contents()
    assert tex == TYPESET, tex
    assert cell.locator("h1 .katex").count() == 1  # math in a heading
    assert cell.locator(".katex-display").count() == 3  # $$…$$ (twice) and \[…\]
    # what is not math is left as written
    assert cell.locator("code").all_inner_texts()[:2] == ["echo $HOME", "$x$"]
    assert 'cost = "$5"  # $not math$' in cell.locator("pre").inner_text()
    text = cell.inner_text()
    assert "Prices are prose: $5 and $10, and so is an escaped $x$." in text
    assert cell.locator("pre .katex, code .katex").count() == 0
    assert "$x$" in p.locator(".code-cell .cm-content").inner_text()  # a code cell is code
    # typeset, not merely parsed: KaTeX's sheet applies, its fractions are drawn as such
    fraction = cell.evaluate(FRACTION)
    assert fraction == {"num": "1", "den": "n", "above": True}, fraction
    assert "KaTeX_Main" in cell.locator(".katex").first.evaluate(
        "(k) => getComputedStyle(k).fontFamily"
    )
    # its fonts come from the gateway (font-src 'self'), and load
    p.evaluate("document.fonts.ready")
    loaded = p.evaluate(
        "() => [...document.fonts].filter((f) => f.status === 'loaded').map((f) => f.family)"
    )
    assert {'"KaTeX_Main"', '"KaTeX_Math"'} <= set(loaded) or {"KaTeX_Main", "KaTeX_Math"} <= set(
        loaded
    ), loaded
    fonts = p.evaluate(
        "() => performance.getEntriesByType('resource').map((e) => e.name)"
        ".filter((n) => n.endsWith('.woff2'))"
    )
    assert fonts and all(f.startswith(page.base + "/static/dist/KaTeX_") for f in fonts), fonts
    page.assert_clean()


def test_a_latex_output_is_typeset(page: Page) -> None:
    """IPython's Math and Latex send `text/latex` (with `text/plain` beside it)."""
    p = page.page
    page.type_code(
        "from IPython.display import Latex, Math, display\n"
        "display(Math(r'\\frac{1}{2} + x^{2}'))\n"
        "display(Latex(r'Euler: $e^{i\\pi} + 1 = 0$, so there.'))"
    )
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    outputs = p.locator("#outputs .latex-output")
    assert outputs.count() == 2
    fraction = outputs.first.evaluate(FRACTION)
    assert fraction == {"num": "1", "den": "2", "above": True}, fraction
    assert outputs.nth(1).inner_text().startswith("Euler: ")
    assert outputs.nth(1).inner_text().endswith(", so there.")
    assert outputs.nth(1).locator("annotation").text_content() == r"e^{i\pi} + 1 = 0"
    assert "IPython.core.display" not in p.locator("#outputs").inner_text()
    page.assert_clean()


# --- HTML outputs keep their styles ----------------------------------------------------------

# The Python Data Science Handbook's `display` (chapter 3: 03.06, 03.07, 03.08), which shows
# DataFrames side by side, each a float with its name above it in Courier; and the markup
# pandas' Styler makes (a `<style>` block of id selectors), set inline with display_html, as
# people show two styled tables side by side. (Styler needs jinja2, which these kernels may
# lack: its markup is written out here.)
SIDE_BY_SIDE = '''import pandas as pd
from IPython.display import display_html

class display(object):
    """Display HTML representation of multiple objects"""
    template = """<div style="float: left; padding: 10px;">
    <p style='font-family:"Courier New", Courier, monospace'>{0}</p>{1}
    </div>"""
    def __init__(self, *args):
        self.args = args

    def _repr_html_(self):
        return '\\n'.join(self.template.format(a, eval(a)._repr_html_())
                         for a in self.args)

    def __repr__(self):
        return '\\n\\n'.join(a + '\\n' + repr(eval(a)) for a in self.args)

def styled(uid, rows):
    cells = "".join(
        f'<tr><th class="row_heading">{i}</th>'
        f'<td id="T_{uid}_row{i}_col0" class="data">{v}</td></tr>' for i, v in enumerate(rows))
    return (f'<style type="text/css">\\n#T_{uid}_row1_col0 {{\\n  background-color: yellow;\\n}}\\n'
            f'</style>\\n<table id="T_{uid}" style=\\'display:inline\\'>'
            f'<thead><tr><th class="blank">&nbsp;</th><th class="col_heading">x</th></tr></thead>'
            f'<tbody>{cells}</tbody></table>')

display_html(styled("a", [1, 9]) + styled("b", [2, 8]), raw=True)
df1 = pd.DataFrame({'A': ['A0', 'A1'], 'B': ['B0', 'B1']})
df2 = pd.DataFrame({'A': ['A2', 'A3'], 'B': ['B2', 'B3']})
display('df1', 'df2')
'''

TABLES = """(frame) => {
  const doc = frame.contentDocument;
  const box = (node) => node.getBoundingClientRect();
  return {
    tables: [...doc.querySelectorAll('table')].map((t) => [Math.round(box(t).top), Math.round(box(t).left)]),
    labels: [...doc.querySelectorAll('p')].map((p) => getComputedStyle(p).fontFamily),
    marked: [...doc.querySelectorAll('td')].filter(
      (td) => getComputedStyle(td).backgroundColor === 'rgb(255, 255, 0)').map((td) => td.textContent),
    stripes: [...doc.querySelectorAll('table.dataframe')].map((t) => [...t.tBodies[0].rows].map(
      (r) => getComputedStyle(r).backgroundColor)),
    // what it shows ends at its bottom (not cut off, no blank space under it)
    spare: frame.clientHeight - Math.max(...[...doc.body.querySelectorAll('*')].map(
      (e) => box(e).bottom + parseFloat(getComputedStyle(e).marginBottom))),
  };
}"""


def test_html_outputs_keep_their_styles_side_by_side(page: Page) -> None:
    p = page.page
    page.type_code(SIDE_BY_SIDE)
    p.locator("#run").click()
    assert page.wait_status(*FINAL) == "succeeded"
    frames = p.locator("#outputs iframe.html-output")
    assert frames.count() == 2
    # still sandboxed: no scripts (no allow-scripts), the page's origin only for its styles
    assert {frames.nth(i).get_attribute("sandbox") for i in range(2)} == {"allow-same-origin"}
    p.frame_locator("#outputs iframe.html-output >> nth=1").locator("table").last.wait_for()
    p.wait_for_function(
        "() => [...document.querySelectorAll('#outputs iframe.html-output')].every("
        "(f) => f.contentDocument && f.contentDocument.querySelector('table') &&"
        " !f.contentDocument.querySelector('[data-output-style]'))"
    )
    styled, handbook = (frames.nth(i).evaluate(TABLES) for i in range(2))

    # the Handbook's two DataFrames: side by side (one top, two lefts), named in Courier
    (top1, left1), (top2, left2) = handbook["tables"]
    assert top1 == top2 and left2 > left1, handbook
    assert all("Courier New" in family for family in handbook["labels"]), handbook
    # JupyterLab's table look: even rows shaded, odd ones white
    assert handbook["stripes"] == [["rgb(255, 255, 255)", "rgb(245, 245, 245)"]] * 2, handbook
    # the Styler's tables: inline, side by side, and its <style> block's rule applies
    (top1, left1), (top2, left2) = styled["tables"]
    assert top1 == top2 and left2 > left1, styled
    assert styled["marked"] == ["9", "8"], styled
    # each frame is as tall as what it shows (and the body's margin)
    assert 0 <= styled["spare"] <= 16 and 0 <= handbook["spare"] <= 16, (styled, handbook)
    page.assert_clean()
