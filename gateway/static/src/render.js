// Renders nbformat outputs into the page without ever running them in the page's origin:
// text goes in as text, images as <img> data URLs (SVG too), HTML in a sandboxed iframe,
// markdown cleaned (markdown.js), LaTeX typeset by KaTeX (math.js).
import FRAME_STYLE from "./frame.css" with { type: "text" };
import { renderMarkdown } from "./markdown.js";
import { latexOutput } from "./math.js";

const ANSI = /\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]/g;

export function stripAnsi(text) {
  return String(text).replace(ANSI, "");
}

export function joinText(value) {
  return Array.isArray(value) ? value.join("") : String(value ?? "");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function image(mime, data) {
  const img = el("img", "image-output");
  img.alt = "image output";
  if (mime === "image/svg+xml") {
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(joinText(data));
  } else {
    img.src = `data:${mime};base64,` + joinText(data).replace(/\s+/g, "");
  }
  return img;
}

// An HTML output is the attacker's markup: it goes into an iframe sandboxed with one flag,
// allow-same-origin, so that no script of it ever runs (the sandbox, and the page's CSP, which
// a srcdoc frame inherits) while the page can still reach into the frame to do what the
// markup's own styles would do and to size the frame to its content. It is never parsed in
// the page (Chrome would report its inline styles as violations of the page's CSP, whatever
// document it parsed them into); it is trimmed as text first:
// - `style="…"` attributes become `data-output-style="…"`, which the page then applies
//   through the CSSOM (`style.cssText`), which style-src does not govern;
// - `<style>` elements are taken out, their rules parsed by a constructed sheet of the page's
//   (never adopted by it) and added to the frame's own sheet, by the CSSOM again;
// - `<link>` elements are dropped (nothing is loaded from elsewhere).
// Its scripts stay: the sandbox (no allow-scripts) is what stops them.
const STYLE_ELEMENT = /<style\b[^>]*>([\s\S]*?)<\/style\s*>/gi;
const LINK_ELEMENT = /<link\b[^>]*>/gi;
const STYLE_ATTRIBUTE = /(<[a-z][^>]*?\s)style(\s*=)/gi;
const KEPT_STYLE = "data-output-style";

/** The markup without its styles, and the styles to apply once the frame has it. */
function liftStyles(html) {
  const sheets = [];
  let markup = html.replace(STYLE_ELEMENT, (_, css) => {
    sheets.push(css);
    return "";
  });
  markup = markup.replace(LINK_ELEMENT, "");
  for (let before = null; before !== markup;) {
    before = markup;
    markup = markup.replace(STYLE_ATTRIBUTE, `$1${KEPT_STYLE}$2`);
  }
  return { markup, sheets };
}

const MAX_FRAME_HEIGHT = 1200; // px: a taller output scrolls inside its frame

// Until the frame has loaded: a guess at its height from the markup.
function estimateHeight(html) {
  const count = (pattern) => (html.match(pattern) || []).length;
  const rows = count(/<tr\b/gi);
  const blocks = count(/<(p|div|li|h[1-4]|br|pre)\b/gi);
  const guess = 20 + rows * 25 + blocks * 18;
  return Math.max(48, Math.min(guess, 480));
}

/**
 * Give the loaded frame its output's styles (through the CSSOM); false when what loaded is not
 * the output (a frame's first, empty document).
 */
function dress(frame, sheets) {
  const doc = frame.contentDocument;
  if (doc?.URL !== "about:srcdoc" || !doc.body) return false;
  for (const node of doc.querySelectorAll(`[${KEPT_STYLE}]`)) {
    node.style.cssText = node.getAttribute(KEPT_STYLE);
    node.removeAttribute(KEPT_STYLE);
  }
  const own = doc.styleSheets[0];
  if (own && sheets.length) {
    const parsed = new CSSStyleSheet();
    for (const css of sheets) {
      try {
        parsed.replaceSync(css); // @import rules are dropped, as in any constructed sheet
      } catch {
        continue;
      }
      for (const rule of parsed.cssRules) {
        try {
          own.insertRule(rule.cssText, own.cssRules.length);
        } catch {
          // a rule the frame's sheet does not take: left out
        }
      }
    }
  }
  return true;
}

/** The frame as tall as its content (floats too), up to MAX_FRAME_HEIGHT. */
function fit(frame) {
  const root = frame.contentDocument?.documentElement;
  if (!root || !frame.isConnected || !frame.clientWidth) return;
  // The root's scroll height is at least the frame's own: measured in a frame of no height
  // (in one task: nothing is drawn in between).
  frame.style.height = "0px";
  const content = Math.ceil(root.scrollHeight);
  frame.style.height = `${Math.max(24, Math.min(content, MAX_FRAME_HEIGHT)) + 2}px`; // + borders
}

function htmlFrame(html) {
  const frame = el("iframe", "html-output");
  // no scripts, no forms, no popups, no navigation of the page; same origin, so that the page
  // can apply the output's styles and measure it
  frame.setAttribute("sandbox", "allow-same-origin");
  frame.setAttribute("referrerpolicy", "no-referrer");
  frame.setAttribute("title", "HTML output");
  const { markup, sheets } = liftStyles(html);
  frame.srcdoc = `<!doctype html><meta charset="utf-8"><style>${FRAME_STYLE}</style>${markup}`;
  frame.style.height = `${estimateHeight(markup)}px`;
  let width = 0;
  let dressed = false;
  // Its content reflows when its width changes (the window resized, its view shown).
  const resized = new ResizeObserver(([entry]) => {
    if (!dressed || entry.contentRect.width === width) return;
    width = entry.contentRect.width;
    fit(frame);
  });
  // (on every load: a frame moved in the page loads its document anew)
  frame.addEventListener("load", () => {
    dressed = dress(frame, sheets);
    if (!dressed) return;
    fit(frame);
    resized.observe(frame);
  });
  return frame;
}

export const IMAGE_TYPES = ["image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"];

// The richest representation we can show safely.
export function renderBundle(data) {
  data = data || {};
  for (const mime of IMAGE_TYPES) {
    if (data[mime] !== undefined) return image(mime, data[mime]);
  }
  if (data["text/html"] !== undefined) return htmlFrame(joinText(data["text/html"]));
  if (data["text/markdown"] !== undefined) {
    const node = el("div", "markdown markdown-output");
    node.append(renderMarkdown(data["text/markdown"]));
    return node;
  }
  if (data["text/latex"] !== undefined) return latexOutput(joinText(data["text/latex"]));
  if (data["application/json"] !== undefined) {
    return el("pre", "text-output", JSON.stringify(data["application/json"], null, 2));
  }
  if (data["text/plain"] !== undefined) {
    return el("pre", "text-output", stripAnsi(joinText(data["text/plain"])));
  }
  const kinds = Object.keys(data).join(", ") || "nothing";
  return el("pre", "text-output muted", `[output of type ${kinds} not shown]`);
}

function renderError(output) {
  const trace = Array.isArray(output.traceback) && output.traceback.length
    ? output.traceback.join("\n")
    : `${output.ename}: ${output.evalue}`;
  return el("pre", "error-output", stripAnsi(trace));
}

/** The outputs of one run, live: streams merge, displays update, clear_output clears. */
export class OutputView {
  /**
   * @param {HTMLElement} container  where the outputs go
   * @param {{onImage?: (data: object) => void}} options  told of every image shown (the gallery)
   */
  constructor(container, { onImage } = {}) {
    this.container = container;
    this.onImage = onImage || (() => {});
    this.displays = new Map(); // display_id -> [wrapper elements]
    this.lastStream = null;
  }

  clear() {
    this.container.replaceChildren();
    this.displays.clear();
    this.lastStream = null;
  }

  add(output, displayId = null, update = false) {
    const kind = output.output_type;
    if (kind === "clear_output") {
      this.clear();
      return;
    }
    if (update && displayId) {
      for (const wrapper of this.displays.get(displayId) || []) {
        wrapper.replaceChildren(renderBundle(output.data));
      }
      return;
    }
    if (kind === "stream") {
      this.addStream(output.name === "stderr" ? "stderr" : "stdout", joinText(output.text));
      return;
    }
    this.lastStream = null;
    let node;
    if (kind === "error") {
      node = renderError(output);
    } else if (kind === "display_data" || kind === "execute_result") {
      node = el("div", `display ${kind}`);
      node.append(renderBundle(output.data));
      if (IMAGE_TYPES.some((mime) => output.data?.[mime] !== undefined)) this.onImage(output.data, output.metadata);
      if (displayId) {
        const shown = this.displays.get(displayId) || [];
        shown.push(node);
        this.displays.set(displayId, shown);
      }
    } else {
      node = el("pre", "text-output muted", `[${kind} output]`);
    }
    this.container.append(node);
  }

  addStream(name, text) {
    if (!text) return;
    const atBottom = this.container.scrollHeight - this.container.scrollTop
      <= this.container.clientHeight + 24;
    if (!this.lastStream || this.lastStream.dataset.stream !== name) {
      this.lastStream = el("pre", `stream ${name}`);
      this.lastStream.dataset.stream = name;
      this.container.append(this.lastStream);
    }
    this.lastStream.append(document.createTextNode(stripAnsi(text)));
    if (atBottom) this.container.scrollTop = this.container.scrollHeight;
  }

  /** Replace whatever was shown live with the final, capped outputs of the run record. */
  showAll(outputs) {
    this.clear();
    for (const output of outputs || []) this.add(output);
  }
}
