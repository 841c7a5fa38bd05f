// A notebook on the page: its cells in order (notebook-cells.js), changed as a person edits
// it (cells added, deleted, moved, converted), and the replay's events applied to the cell they
// name.
import { CodeCell, TextCell } from "./notebook-cells.js";
import { newCellId } from "./notebook-file.js";

export class NotebookView {
  /**
   * @param {HTMLElement} container  an <ol> for the cells
   * @param {{onImage: (data: object, metadata: object) => void,
   *          onRunCell: (cell: CodeCell|TextCell, advance: boolean) => void,
   *          onEdit: (cell: CodeCell|TextCell) => void,
   *          onTool: (cell: CodeCell|TextCell, action: string) => void}} hooks
   */
  constructor(container, hooks) {
    this.container = container;
    this.hooks = hooks;
    this.nb = null;
    this.language = "python";
    this.items = []; // the cells in order: CodeCell or TextCell
  }

  /** Per notebook cell: its CodeCell, or null for markdown and raw (indexed as `nb.cells`). */
  get cells() {
    return this.items.map((item) => (item.kind === "code" ? item : null));
  }

  get codeCells() {
    return this.items.filter((item) => item.kind === "code");
  }

  show(nb, language) {
    this.clear();
    this.nb = nb;
    this.language = language;
    this.items = nb.cells.map((cell) => this.make(cell));
    this.container.replaceChildren(...this.items.map((item) => item.node));
    this.renumber();
  }

  /** No notebook: every cell's editor ended. */
  clear() {
    for (const item of this.items) item.destroy();
    this.items = [];
    this.nb = null;
    this.container.replaceChildren();
  }

  make(cell) {
    return cell.cell_type === "code" ? new CodeCell(cell, { language: this.language, ...this.hooks }) : new TextCell(cell, this.hooks);
  }

  renumber() {
    this.items.forEach((item, index) => item.setIndex(index));
  }

  /** A new cell of `kind` ("code" or "markdown") at `index`, with `source`. */
  insert(index, kind, source = "", { id = null, metadata = {} } = {}) {
    const cell = { id: id || newCellId(new Set(this.items.map((item) => item.cell.id))), cell_type: kind, metadata, source };
    if (kind === "code") Object.assign(cell, { outputs: [], execution_count: null });
    const item = this.make(cell);
    this.container.insertBefore(item.node, this.items[index]?.node || null);
    this.items.splice(index, 0, item);
    this.renumber();
    return item;
  }

  remove(item) {
    this.items.splice(this.items.indexOf(item), 1);
    item.node.remove();
    item.destroy();
    this.renumber();
  }

  /** Move `item` one place up (-1) or down (1); false when it is at that end already. */
  move(item, step) {
    const to = item.index + step;
    if (to < 0 || to >= this.items.length) return false;
    const other = this.items[to];
    this.items[to] = item;
    this.items[item.index] = other;
    if (step < 0) this.container.insertBefore(item.node, other.node);
    else this.container.insertBefore(other.node, item.node);
    this.renumber();
    return true;
  }

  /** A code cell made markdown or back: the same id, metadata and text, no outputs. */
  convert(item, kind) {
    const at = item.index;
    const made = this.insert(at + 1, kind, item.kind === "code" ? item.editor.text : item.text, { id: item.cell.id, metadata: item.cell.metadata || {} });
    this.remove(item);
    return made;
  }

  /** The notebook to send: with the code as edited and no outputs. */
  toNotebook() {
    return { ...this.nb, cells: this.items.map((item) => item.toCell()) };
  }

  /** The notebook as it is on show (nbformat 4.5): the cells as edited, their outputs and counts. */
  toSaved() {
    const nbformatMinor = Math.max(5, Number(this.nb.nbformat_minor) || 0);
    return { ...this.nb, nbformat: 4, nbformat_minor: nbformatMinor, metadata: this.nb.metadata || {}, cells: this.items.map((item) => item.toSaved()) };
  }

  /** The notebook of some of its code cells only (for a run of those), with its metadata. */
  notebookOf(cells) {
    return { ...this.nb, cells: cells.map((cell) => cell.toCell()) };
  }

  /** The cell after `item`, if any (`code`: the next code cell). */
  next(item, { code = false } = {}) {
    return this.items.find((c) => c.index > item.index && (!code || c.kind === "code")) || null;
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
    return this.next(cell, { code: true });
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
    const byIndex = this.items[index]?.kind === "code" ? this.items[index] : null;
    if (byIndex && (cellId === undefined || cellId === null || byIndex.cell.id === cellId)) return byIndex;
    return this.codeCells.find((cell) => cell.cell.id === cellId) || null;
  }

  cellStarted(event) {
    const cell = this.cellFor(event.index, event.cell_id);
    cell?.setStatus("running");
    return cell;
  }

  output(event) {
    this.cellFor(event.index)?.addOutput(event.output, event.display_id, event.update);
  }

  cellFinished(event, count = event.execution_count) {
    const cell = this.cellFor(event.index, event.cell_id);
    if (!cell) return null;
    cell.setPrompt(count);
    cell.setStatus(event.status, event.duration_ms);
    return cell;
  }

  /**
   * The replay ended: cells that never ran say so, and the executed notebook's outputs (capped
   * as the record's are) are what the cells that ran keep; shown in place of the live ones
   * when live events were dropped.
   */
  finish(executed, { replaceOutputs = false, positions = null, waiting = [] } = {}) {
    for (const cell of this.codeCells) {
      if (cell.status === "queued" && !waiting.includes(cell)) cell.setStatus("not_run");
      else if (cell.status === "running") cell.setStatus("cancelled");
    }
    if (!executed) return;
    const cells = this.cells;
    executed.cells.forEach((done, index) => {
      const cell = cells[positions ? positions[index] : index];
      if (!cell || done.cell_type !== "code") return;
      cell.showOutputs(done.outputs || [], { redraw: replaceOutputs });
    });
  }
}
