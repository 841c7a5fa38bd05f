// The cells of a notebook on the page. A code cell: its code in an editor, its outputs, status
// and time, the state it left (a snapshot, for the next cell to run from), and the outputs it
// shows as nbformat (to save the notebook as it is on show). A text cell: markdown rendered and
// cleaned (or raw text), edited in an editor on demand. Each has the buttons that move, add,
// convert and delete it. A code cell is named as Jupyter names it, by its execution count:
// `In [3]`, or `In [ ]` before it ran, wherever the page names it (its prompt shows `[3]`).
import { el } from "./dom.js";
import { createEditor } from "./editor.js";
import { formatDuration } from "./format.js";
import { renderMarkdown } from "./markdown.js";
import { joinText, OutputView } from "./render.js";

const STATUS_TEXT = {
  idle: "",
  queued: "queued",
  running: "running",
  ok: "ok",
  error: "error",
  timeout: "timed out",
  cancelled: "cancelled",
  died: "kernel died",
  output_limit: "output limit",
  exited: "kernel exited",
  not_run: "not run",
};

const RUN_SYMBOL = "\u25B6"; // ▶

/** A code cell's name, by its execution count: `In [3]`, `In [ ]` before it ran. */
export function cellName(count) {
  return `In [${count ?? " "}]`;
}

/** The prompt, as JupyterLab's: `[3]`, `[ ]` (the cell's name, `In [3]`, is its label's). */
function promptText(count) {
  return `[${count ?? " "}]`;
}

/** The buttons of a cell's head, each labelled with the cell's name. */
class Tools {
  constructor(cell, actions, onTool) {
    this.buttons = actions.map(([action, text, label, title]) => {
      const button = el("button", { type: "button", class: `small cell-tool tool-${action}`, title }, text);
      button.dataset.action = action;
      button.addEventListener("click", () => onTool(cell, action));
      return [button, label];
    });
    this.node = el("span", { class: "cell-tools" }, this.buttons.map(([button]) => button));
  }

  relabel(name) {
    for (const [button, label] of this.buttons) button.setAttribute("aria-label", label(name));
  }

  button(action) {
    return this.buttons.find(([button]) => button.dataset.action === action)?.[0] || null;
  }
}

const MOVES = [
  ["up", "\u2191", (name) => `Move ${name} up`, "Move this cell up"],
  ["down", "\u2193", (name) => `Move ${name} down`, "Move this cell down"],
  ["add", "+", (name) => `Add a code cell below ${name}`, "Add a code cell below this one"],
];
const DELETE = ["delete", "\u2715", (name) => `Delete ${name}`, "Delete this cell"];

function idLabel(cell) {
  // A cell id is the notebook's text like any other: shown as text, never as markup.
  return typeof cell.id === "string" ? el("span", { class: "cell-id" }, `id ${cell.id}`) : null;
}

export class CodeCell {
  /**
   * @param {object} cell  the nbformat cell
   * @param {{language: string, onImage, onRunCell: (cell, advance) => void,
   *          onEdit: (cell) => void, onTool: (cell, action: string) => void}} hooks
   */
  constructor(cell, { language, onImage, onRunCell, onEdit, onTool }) {
    this.kind = "code";
    this.cell = cell;
    this.index = 0;
    this.snapshot = null; // the state this cell left, while its code and the cells before are as run
    this.status = "idle";
    this.started = 0;
    this.timer = null;
    this.count = typeof cell.execution_count === "number" ? cell.execution_count : null;
    this.shown = []; // the outputs on show, as nbformat
    this.displays = new Map(); // display_id -> outputs of `shown` it updates
    this.prompt = el("span", { class: "prompt" }, promptText(this.count));
    this.statusBadge = el("span", { class: "cell-status", dataset: { status: "idle" } });
    this.time = el("span", { class: "cell-time" });
    const editorHost = el("div", { class: "cell-editor" });
    this.runButton = el(
      "button",
      { type: "button", class: "small cell-run", title: "Run this cell (Shift+Enter, Ctrl+Enter)" },
      RUN_SYMBOL,
    );
    this.runButton.addEventListener("click", () => onRunCell(this, false));
    this.tools = new Tools(this, [
      ...MOVES,
      ["markdown", "Markdown", (name) => `Make ${name} a markdown cell`, "Make this cell markdown"],
      DELETE,
    ], onTool);
    this.outputs = el("div", { class: "outputs cell-outputs", role: "region" });
    this.node = el(
      "li",
      { class: "cell code-cell" },
      el("div", { class: "cell-head" }, this.runButton, this.prompt, this.statusBadge, this.time, idLabel(cell), this.tools.node),
      editorHost,
      this.outputs,
    );
    this.editor = createEditor(editorHost, {
      doc: joinText(cell.source),
      language,
      label: `Code of ${cellName(this.count)}`,
      onRun: () => onRunCell(this, false),
      onRunNext: () => onRunCell(this, true),
      onChange: () => onEdit(this),
      lineNumbers: false,
    });
    this.view = new OutputView(this.outputs, { onImage });
    for (const output of cell.outputs || []) this.addOutput(output);
    this.relabel();
  }

  get name() {
    return cellName(this.count);
  }

  relabel() {
    const name = this.name;
    this.node.setAttribute("aria-label", `${name}, code`);
    this.runButton.setAttribute("aria-label", `Run ${name}`);
    this.outputs.setAttribute("aria-label", `Output of ${name}`);
    this.tools.relabel(name);
  }

  setIndex(index) {
    this.index = index;
    this.node.dataset.index = String(index);
  }

  setStatus(status, durationMs) {
    this.status = status;
    this.statusBadge.dataset.status = status;
    this.statusBadge.textContent = STATUS_TEXT[status] ?? status;
    this.node.dataset.status = status;
    if (status === "running") {
      this.started = performance.now();
      this.time.textContent = formatDuration(0);
      this.timer = setInterval(() => { this.time.textContent = formatDuration(performance.now() - this.started); }, 100);
    } else {
      clearInterval(this.timer);
      this.timer = null;
      if (durationMs !== undefined) this.time.textContent = formatDuration(durationMs);
      else if (status === "queued" || status === "idle" || status === "not_run") this.time.textContent = "";
    }
  }

  /** An output arrives: shown, and kept as the notebook will save it. */
  addOutput(output, displayId = null, update = false) {
    this.view.add(output, displayId, update);
    const kind = output.output_type;
    if (kind === "clear_output") {
      this.shown = [];
      this.displays.clear();
    } else if (update && displayId) {
      for (const shown of this.displays.get(displayId) || []) Object.assign(shown, { data: output.data, metadata: output.metadata || {} });
    } else if (kind === "stream" && this.shown.at(-1)?.output_type === "stream" && this.shown.at(-1).name === output.name) {
      const last = this.shown.at(-1);
      last.text = joinText(last.text) + joinText(output.text);
    } else {
      const copy = { ...output };
      this.shown.push(copy);
      if (displayId) this.displays.set(displayId, [...(this.displays.get(displayId) || []), copy]);
    }
  }

  /** The run's final outputs (capped as its record is) in place of what arrived live. */
  showOutputs(outputs, { redraw = true } = {}) {
    if (redraw) this.view.clear();
    this.shown = [];
    this.displays.clear();
    for (const output of outputs || []) {
      if (redraw) this.view.add(output);
      this.shown.push({ ...output });
    }
  }

  clearOutputs() {
    this.view.clear();
    this.shown = [];
    this.displays.clear();
    this.setPrompt(null);
  }

  setPrompt(count) {
    this.count = typeof count === "number" ? count : null;
    this.prompt.textContent = promptText(this.count);
    this.relabel();
    this.editor.setLabel(`Code of ${this.name}`);
  }

  /** The cell as it is to be sent: the source as edited, no outputs. */
  toCell() {
    return { ...this.cell, source: this.editor.text, outputs: [], execution_count: null };
  }

  /** The cell as it is on show, as nbformat 4: its code as edited, its outputs, its count. */
  toSaved() {
    return {
      id: this.cell.id,
      cell_type: "code",
      metadata: this.cell.metadata || {},
      source: this.editor.text,
      outputs: this.shown.map((output) => savedOutput(output, this.count)),
      execution_count: this.count,
    };
  }

  destroy() {
    clearInterval(this.timer);
    this.editor.destroy();
  }
}

/** An output as nbformat 4 wants it saved (live events may leave out empty fields). */
function savedOutput(output, count) {
  const kind = output.output_type;
  if (kind === "display_data" || kind === "execute_result") {
    const saved = { ...output, data: output.data || {}, metadata: output.metadata || {} };
    if (kind === "execute_result" && typeof saved.execution_count !== "number") saved.execution_count = count;
    return saved;
  }
  if (kind === "stream") return { output_type: "stream", name: output.name === "stderr" ? "stderr" : "stdout", text: joinText(output.text) };
  return output;
}

/** A markdown or raw cell: rendered, or in an editor while it is edited. */
export class TextCell {
  constructor(cell, { onEdit, onTool, onRunCell }) {
    this.kind = cell.cell_type === "raw" ? "raw" : "markdown";
    this.cell = cell;
    this.index = 0;
    this.source = joinText(cell.source);
    this.editor = null;
    this.hooks = { onEdit, onRunCell };
    this.body = el("div", { class: this.kind === "raw" ? "raw-body" : "markdown" });
    this.editorHost = el("div", { class: "cell-editor", hidden: true });
    const convert = this.kind === "markdown"
      ? [["code", "Code", (name) => `Make ${name} a code cell`, "Make this cell code"]]
      : [];
    this.tools = new Tools(this, [
      ["edit", "Edit", (name) => `Edit ${name}`, "Edit this cell (Shift+Enter shows it again)"],
      ...MOVES,
      ...convert,
      DELETE,
    ], onTool);
    this.node = el(
      "li",
      { class: `cell ${this.kind}-cell` },
      el("div", { class: "cell-head text-head" }, idLabel(cell), this.tools.node),
      this.body,
      this.editorHost,
    );
    this.body.addEventListener("dblclick", () => this.edit());
    this.render();
  }

  get text() {
    return this.editor ? this.editor.text : this.source;
  }

  /** A name for labels: its kind and the first words of its text (a heading, mostly). */
  get name() {
    const first = this.text.split("\n").find((line) => line.trim()) || "";
    const words = first.replace(/^[#>\s*-]+/, "").trim();
    const short = words.length > 40 ? `${words.slice(0, 40)}…` : words;
    return short ? `${this.kind} cell “${short}”` : `empty ${this.kind} cell`;
  }

  relabel() {
    this.node.setAttribute("aria-label", this.name);
    this.tools.relabel(this.name);
  }

  setIndex(index) {
    this.index = index;
    this.node.dataset.index = String(index);
  }

  render() {
    if (this.kind === "markdown") this.body.replaceChildren(renderMarkdown(this.source, this.cell.attachments));
    else this.body.replaceChildren(el("pre", { class: "raw" }, this.source));
    this.relabel();
  }

  /** Edit the text in an editor (Shift+Enter or Ctrl+Enter shows it rendered again). */
  edit() {
    if (!this.editor) {
      this.editor = createEditor(this.editorHost, {
        doc: this.source,
        language: "text",
        label: `Text of the ${this.name}`,
        onRun: () => this.done(false),
        onRunNext: () => this.done(true),
        onChange: () => this.hooks.onEdit(this),
        lineNumbers: false,
      });
    }
    this.editorHost.hidden = false;
    this.body.hidden = true;
    this.node.dataset.editing = "true";
    this.editor.focus();
  }

  /** Editing ends: the text rendered; `advance` goes on to the next cell, as a run does. */
  done(advance) {
    if (!this.editor) return;
    this.source = this.editor.text;
    this.editor.destroy();
    this.editor = null;
    this.editorHost.replaceChildren();
    this.editorHost.hidden = true;
    this.body.hidden = false;
    delete this.node.dataset.editing;
    this.render();
    if (advance) this.hooks.onRunCell(this, true);
    else this.tools.button("edit")?.focus();
  }

  toSaved() {
    const saved = { id: this.cell.id, cell_type: this.kind, metadata: this.cell.metadata || {}, source: this.text };
    if (this.cell.attachments) saved.attachments = this.cell.attachments;
    return saved;
  }

  /** As sent with the notebook: as saved (it does not run). */
  toCell() {
    return this.toSaved();
  }

  destroy() {
    this.editor?.destroy();
  }
}
