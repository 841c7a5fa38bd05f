// Renders nbformat outputs into the page without ever running them in the page's origin:
// text goes in as text, images as <img> data URLs (SVG too), HTML in a sandboxed iframe,
// markdown cleaned (markdown.js).
import FRAME_STYLE from "./frame.css" with { type: "text" };
import { renderMarkdown } from "./markdown.js";

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

// The untrusted HTML is never parsed in the page (a parse here would also report its inline
// styles as CSP violations of the page): it is only measured and trimmed as text.

// A sandboxed iframe cannot tell us its height (no scripts run in it), so estimate it from
// the markup; the user can resize.
function estimateHeight(html) {
  const count = (pattern) => (html.match(pattern) || []).length;
  const rows = count(/<tr\b/gi);
  const blocks = count(/<(p|div|li|h[1-4]|br|pre)\b/gi);
  const lines = html.replace(/<[^>]*>/g, "").split("\n").length;
  const guess = 20 + rows * 25 + blocks * 18 + (rows ? 0 : Math.min(lines, 20) * 4);
  return Math.max(48, Math.min(guess, 480));
}

// The frame's one inline style is allowed by its hash in the page's CSP (which a srcdoc frame
// inherits); the output's own styles would be refused there, so they are left out rather than
// reported as violations (one that escapes these patterns is refused all the same). Its
// scripts stay: the sandbox (no allow-scripts) is what stops them.
const STYLE_ELEMENT = /<style\b[^>]*>[\s\S]*?<\/style\s*>/gi;
const LINK_ELEMENT = /<link\b[^>]*>/gi;
const STYLE_ATTRIBUTE = /(<[a-z][^>]*?)\s+style\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'>]+)/gi;

function withoutStyles(html) {
  let out = html.replace(STYLE_ELEMENT, "").replace(LINK_ELEMENT, "");
  for (let before = null; before !== out;) {
    before = out;
    out = out.replace(STYLE_ATTRIBUTE, "$1");
  }
  return out;
}

function htmlFrame(html) {
  const frame = el("iframe", "html-output");
  frame.setAttribute("sandbox", ""); // no scripts, opaque origin, no forms, no popups
  frame.setAttribute("referrerpolicy", "no-referrer");
  frame.setAttribute("title", "HTML output");
  const trimmed = withoutStyles(html);
  frame.srcdoc = `<!doctype html><meta charset="utf-8"><style>${FRAME_STYLE}</style>${trimmed}`;
  frame.style.height = `${estimateHeight(trimmed)}px`;
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
