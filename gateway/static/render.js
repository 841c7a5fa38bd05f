// Renders nbformat outputs into the page without ever running them in the page's origin:
// text goes in as text, images as <img> data URLs (SVG too), HTML in a sandboxed iframe.

const ANSI = /\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[@-Z\\-_]/g;

export function stripAnsi(text) {
  return String(text).replace(ANSI, "");
}

function joinText(value) {
  return Array.isArray(value) ? value.join("") : String(value ?? "");
}

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function image(mime, data) {
  const img = el("img", "image-output");
  img.alt = "image output";
  if (mime === "image/svg+xml") {
    img.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(joinText(data));
  } else {
    img.src = `data:${mime};base64,` + joinText(data).replace(/\s+/g, "");
  }
  return img;
}

// A sandboxed iframe cannot tell us its height (no scripts run in it), so estimate it from
// an inert parse (DOMParser runs no scripts and loads nothing); the user can resize.
function estimateHeight(html) {
  const doc = new DOMParser().parseFromString(html, "text/html");
  const rows = doc.querySelectorAll("tr").length;
  const blocks = doc.querySelectorAll("p, div, li, h1, h2, h3, h4, br, pre").length;
  const lines = (doc.body?.textContent || "").split("\n").length;
  const guess = 20 + rows * 25 + blocks * 18 + (rows ? 0 : Math.min(lines, 20) * 4);
  return Math.max(48, Math.min(guess, 480));
}

const FRAME_STYLE = `<style>
  body { font: 13px/1.4 system-ui, sans-serif; margin: 6px; color: #1d2330; }
  table { border-collapse: collapse; border: 0; }
  th, td { padding: 3px 8px; border: 0; border-bottom: 1px solid #e3e6ee; text-align: right; }
  thead th { border-bottom: 1px solid #9aa3b5; }
  tbody tr:nth-child(odd) { background: #f6f7fb; }
</style>`;

function htmlFrame(html) {
  const frame = el("iframe", "html-output");
  frame.setAttribute("sandbox", ""); // no scripts, opaque origin, no forms, no popups
  frame.setAttribute("referrerpolicy", "no-referrer");
  frame.setAttribute("title", "HTML output");
  frame.srcdoc = `<!doctype html><meta charset="utf-8">${FRAME_STYLE}${html}`;
  frame.style.height = `${estimateHeight(html)}px`;
  return frame;
}

// The richest representation we can show safely.
export function renderBundle(data) {
  data = data || {};
  for (const mime of ["image/png", "image/jpeg", "image/gif", "image/webp", "image/svg+xml"]) {
    if (data[mime] !== undefined) return image(mime, data[mime]);
  }
  if (data["text/html"] !== undefined) return htmlFrame(joinText(data["text/html"]));
  if (data["text/markdown"] !== undefined) {
    return el("pre", "text-output", joinText(data["text/markdown"]));
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
  constructor(container) {
    this.container = container;
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
