// A notebook on the page: its cells in order (code in editors, markdown rendered and cleaned,
// raw as text), each code cell with its outputs, its status and its time, and the state it
// left (a snapshot, for the next cell to run from); and the replay's events applied to the
// cell they name.
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

class CodeCell {
  constructor(cell, index, number, { language, onImage, onRunCell, onEdit }) {
    this.cell = cell;
    this.index = index;
    this.snapshot = null; // the state this cell left, while its code and the cells before are as run
    this.status = "idle";
    this.started = 0;
    this.timer = null;
    this.prompt = el("span", { class: "prompt" }, promptText(cell.execution_count));
    this.statusBadge = el("span", { class: "cell-status", dataset: { status: "idle" } });
    this.time = el("span", { class: "cell-time" });
    const editorHost = el("div", { class: "cell-editor" });
    const runButton = el(
      "button",
      { type: "button", class: "small cell-run", "aria-label": `Run cell ${number}`, title: "Run this cell (Shift+Enter, Ctrl+Enter)" },
      RUN_SYMBOL,
    );
    runButton.addEventListener("click", () => onRunCell(this, false));
    this.outputs = el("div", { class: "outputs cell-outputs", role: "region", "aria-label": `Output of cell ${number}` });
    this.node = el(
      "li",
      { class: "cell code-cell", "aria-label": `Cell ${number}, code` },
      el("div", { class: "cell-head" }, runButton, this.prompt, this.statusBadge, this.time, idLabel(cell)),
      editorHost,
      this.outputs,
    );
    this.node.dataset.index = String(index);
    this.editor = createEditor(editorHost, {
      doc: joinText(cell.source),
      language,
      label: `Code of cell ${number}`,
      onRun: () => onRunCell(this, false),
      onRunNext: () => onRunCell(this, true),
      onChange: () => onEdit(this),
      lineNumbers: false,
    });
    this.view = new OutputView(this.outputs, { onImage });
    for (const output of cell.outputs || []) this.view.add(output);
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

  clearOutputs() {
    this.view.clear();
    this.prompt.textContent = promptText(null);
  }

  setPrompt(count) {
    this.prompt.textContent = promptText(count);
  }

  /** The cell as it is to be sent: the source as edited, no outputs. */
  toCell() {
    return { ...this.cell, source: this.editor.text, outputs: [], execution_count: null };
  }

  destroy() {
    clearInterval(this.timer);
    this.editor.destroy();
  }
}

function promptText(count) {
  return `[${count ?? " "}]`;
}

function idLabel(cell) {
  // A cell id is the notebook's text like any other: shown as text, never as markup.
  return typeof cell.id === "string" ? el("span", { class: "cell-id" }, `id ${cell.id}`) : null;
}

function markdownCell(cell, number) {
  const body = el("div", { class: "markdown" });
  body.append(renderMarkdown(cell.source, cell.attachments));
  return el("li", { class: "cell markdown-cell", "aria-label": `Cell ${number}, markdown` }, body);
}

function rawCell(cell, number) {
  return el("li", { class: "cell raw-cell", "aria-label": `Cell ${number}, raw` }, el("pre", { class: "raw" }, joinText(cell.source)));
}

export class NotebookView {
  /**
   * @param {HTMLElement} container  an <ol> for the cells
   * @param {{onImage: (data: object, metadata: object) => void,
   *          onRunCell: (cell: CodeCell, advance: boolean) => void,
   *          onEdit: (cell: CodeCell) => void}} hooks
   */
  constructor(container, hooks) {
    this.container = container;
    this.hooks = hooks;
    this.nb = null;
    this.cells = []; // per notebook cell: a CodeCell or null
  }

  get codeCells() {
    return this.cells.filter(Boolean);
  }

  show(nb, language) {
    for (const cell of this.codeCells) cell.destroy();
    this.nb = nb;
    this.cells = [];
    const nodes = nb.cells.map((cell, index) => {
      const number = index + 1;
      if (cell.cell_type === "code") {
        const code = new CodeCell(cell, index, number, { language, ...this.hooks });
        this.cells.push(code);
        return code.node;
      }
      this.cells.push(null);
      return cell.cell_type === "markdown" ? markdownCell(cell, number) : rawCell(cell, number);
    });
    this.container.replaceChildren(...nodes);
  }

  /** The notebook to send: as opened, with the code as edited and no outputs. */
  toNotebook() {
    return { ...this.nb, cells: this.nb.cells.map((cell, i) => (this.cells[i] ? this.cells[i].toCell() : cell)) };
  }

  /** The notebook of some of its code cells only (for a run of those), with its metadata. */
  notebookOf(cells) {
    return { ...this.nb, cells: cells.map((cell) => cell.toCell()) };
  }

  /**
   * What a run of `cell` needs (the cell itself last): the code cells after the nearest one
   * before it that holds its state, and that one's snapshot (null: from nothing).
   */
  chainTo(cell) {
    const before = this.codeCells.filter((c) => c.index < cell.index);
    let start = before.length;
    while (start > 0 && !before[start - 1].snapshot) start -= 1;
    const from = start > 0 ? before[start - 1].snapshot : null;
    return { from, cells: [...before.slice(start), cell] };
  }

  /** The code cell after `cell`, if any. */
  nextCode(cell) {
    return this.codeCells.find((c) => c.index > cell.index) || null;
  }

  /** `cell` and the cells after it no longer hold their states; the snapshots they held. */
  forgetFrom(cell) {
    const dropped = [];
    for (const c of this.codeCells) {
      if (c.index >= cell.index && c.snapshot) {
        dropped.push(c.snapshot);
        c.snapshot = null;
      }
    }
    return dropped;
  }

  /** Every snapshot the cells hold, taken from them (a Restart, another notebook). */
  forgetAll() {
    const first = this.codeCells[0];
    return first ? this.forgetFrom(first) : [];
  }

  /** A replay of `cells` (default: every code cell) begins: their outputs cleared, queued. */
  begin(cells = this.codeCells) {
    for (const cell of cells) {
      cell.clearOutputs();
      cell.setStatus("queued");
    }
  }

  /** The code cell an event names: by its place in `cells`, checked against its id. */
  cellFor(index, cellId) {
    const byIndex = this.cells[index];
    if (byIndex && (cellId === undefined || cellId === null || byIndex.cell.id === cellId)) return byIndex;
    return this.codeCells.find((cell) => cell.cell.id === cellId) || null;
  }

  cellStarted(event) {
    const cell = this.cellFor(event.index, event.cell_id);
    cell?.setStatus("running");
    return cell;
  }

  output(event) {
    this.cellFor(event.index)?.view.add(event.output, event.display_id, event.update);
  }

  cellFinished(event, count = event.execution_count) {
    const cell = this.cellFor(event.index, event.cell_id);
    if (!cell) return null;
    cell.setPrompt(count);
    cell.setStatus(event.status, event.duration_ms);
    return cell;
  }

  /**
   * The replay ended: cells that never ran say so, and when the executed notebook is at
   * hand and live events were dropped, its outputs replace what was shown.
   */
  finish(executed, { replaceOutputs = false, positions = null, waiting = [] } = {}) {
    for (const cell of this.codeCells) {
      if (cell.status === "queued" && !waiting.includes(cell)) cell.setStatus("not_run");
      else if (cell.status === "running") cell.setStatus("cancelled");
    }
    if (!executed || !replaceOutputs) return;
    executed.cells.forEach((done, index) => {
      const cell = this.cells[positions ? positions[index] : index];
      if (!cell || done.cell_type !== "code") return;
      cell.view.showAll(done.outputs || []);
    });
  }
}
