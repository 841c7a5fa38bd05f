// LaTeX math, typeset by KaTeX into the page's own DOM: `$…$`, `$$…$$`, `\(…\)` and `\[…\]` in
// markdown (a `marked` extension, so that markdown's own syntax never touches the TeX: `_`, `*`
// and `\\` stay as written), and `text/latex` outputs.
//
// The TeX is the attacker's (a notebook someone sent), so KaTeX runs untrusted: `trust: false`
// refuses \href, \url, \includegraphics, \htmlClass, \htmlId, \htmlStyle and \htmlData (they
// are shown as red text), sizes are capped (`maxSize`: no \rule or \kern the size of the page)
// and so are macro expansions. KaTeX builds its nodes itself, after the markdown around them
// was cleaned by DOMPurify: classes set as properties, styles through the CSSOM (which the CSP's
// style-src does not govern, unlike a style attribute), never parsed from markup. (A few of its
// nodes get a `style` attribute, which the CSP would refuse: an error's colour, a stretchy
// arrow's width; while KaTeX builds, those go through the CSSOM too.)
import { renderTex } from "./vendor.js";

const OPTIONS = {
  throwOnError: false, // a mistake in the TeX is shown, in red, where it is
  trust: false,
  strict: "ignore",
  maxSize: 20, // em
  maxExpand: 500,
  output: "htmlAndMathml", // the MathML for screen readers
};

/** Typeset `tex` into `node` (its children replaced); on any failure, the TeX as text. */
export function typeset(tex, node, display = false) {
  const setAttribute = Element.prototype.setAttribute;
  // (KaTeX builds synchronously: nothing else runs while this is in place)
  Element.prototype.setAttribute = function styleThroughCssom(name, value) {
    if (String(name).toLowerCase() === "style" && this.style) this.style.cssText = String(value);
    else setAttribute.call(this, name, value);
  };
  try {
    renderTex(tex, node, { ...OPTIONS, displayMode: display });
  } catch {
    node.textContent = display ? `$$${tex}$$` : `$${tex}$`;
  } finally {
    Element.prototype.setAttribute = setAttribute;
  }
}

// --- in markdown ---------------------------------------------------------------------------

// Inline math as pandoc reads it: `$` then no space, up to a `$` after no space and before no
// digit, so that "$5 and $10" stays prose. A backslash escapes the next character (`\$`).
const INLINE = [
  [/^\$\$(?!\$)((?:\\[\s\S]|[^\\$]|\$(?!\$))+?)\$\$/, true],
  [/^\\\[([\s\S]+?)\\\]/, true],
  [/^\\\(([\s\S]+?)\\\)/, false],
  [/^\$(?=[^\s$])((?:\\[\s\S]|[^\\$])+?)(?<=[^\s\\])\$(?!\d)/, false],
];
const BLOCK = [/^ {0,3}\$\$([\s\S]+?)\$\$[ \t]*(?:\n+|$)/, /^ {0,3}\\\[([\s\S]+?)\\\][ \t]*(?:\n+|$)/];

let pending = []; // the math of the markdown being parsed, by placeholder number

function placeholder(tag, token) {
  pending.push({ tex: token.tex, display: token.display });
  return `<${tag} data-math="${pending.length - 1}"></${tag}>`;
}

/**
 * `marked` extensions: math becomes an empty placeholder element, `data-math="<number>"`
 * (DOMPurify lets that one data attribute through); `takeMath` hands over its TeX.
 */
export const MATH_EXTENSIONS = [
  {
    name: "mathBlock",
    level: "block",
    start: (src) => /^ {0,3}(\$\$|\\\[)/m.exec(src)?.index,
    tokenizer(src) {
      for (const pattern of BLOCK) {
        const match = pattern.exec(src);
        if (match) return { type: "mathBlock", raw: match[0], tex: match[1].trim(), display: true };
      }
      return undefined;
    },
    renderer: (token) => placeholder("div", token),
  },
  {
    name: "math",
    level: "inline",
    start: (src) => /\$|\\[([]/.exec(src)?.index,
    tokenizer(src) {
      for (const [pattern, display] of INLINE) {
        const match = pattern.exec(src);
        if (match) return { type: "math", raw: match[0], tex: match[1].trim(), display };
      }
      return undefined;
    },
    renderer: (token) => placeholder("span", token),
  },
];

/** The math of the markdown parsed since the last call, by placeholder number. */
export function takeMath() {
  const taken = pending;
  pending = [];
  return taken;
}

/**
 * Typeset the (cleaned) placeholders of `root` with `math` (from `takeMath`); no `data-math`
 * is left, whoever wrote it.
 */
export function typesetPlaceholders(root, math) {
  for (const node of root.querySelectorAll("[data-math]")) {
    const found = math[Number(node.getAttribute("data-math"))];
    node.removeAttribute("data-math");
    if (found) typeset(found.tex, node, found.display);
  }
}

// --- text/latex outputs --------------------------------------------------------------------

// What IPython's Math and Latex, and sympy, send: math between delimiters (or an environment),
// with prose around it at times.
const LATEX_MATH = new RegExp(
  [
    String.raw`\$\$([\s\S]+?)\$\$`,
    String.raw`\\\[([\s\S]+?)\\\]`,
    String.raw`\\\(([\s\S]+?)\\\)`,
    String.raw`\$((?:\\[\s\S]|[^\\$])+?)\$`,
    String.raw`(\\begin\{([A-Za-z]+\*?)\}[\s\S]*?\\end\{\6\})`,
  ].join("|"),
  "g",
);

/** A `text/latex` output: its math typeset, the rest as text. */
export function latexOutput(text) {
  const node = document.createElement("div");
  node.className = "latex-output";
  let at = 0;
  for (const match of text.matchAll(LATEX_MATH)) {
    if (match.index > at) node.append(text.slice(at, match.index));
    const [, display, bracket, paren, inline, environment] = match;
    const span = document.createElement("span");
    const tex = display ?? bracket ?? paren ?? inline ?? environment;
    typeset(tex.trim(), span, display !== undefined || bracket !== undefined || environment !== undefined);
    node.append(span);
    at = match.index + match[0].length;
  }
  if (at < text.length) node.append(text.slice(at));
  return node;
}
