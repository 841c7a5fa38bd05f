// The open notebook as a document being edited: its cells added, deleted, moved and made
// markdown or code (each by a button in the cell's head, so by keyboard too), saved as it is on
// show under its own name, and kept in this browser (store.js) as it is now, so that a reload
// opens it again with its edits, outputs and states. Whether it has edits not saved is what the
// page asks about before it replaces or closes it.
//
// A cell added, deleted, moved or converted changes the code that runs from its place on: as
// after an edit there, the code cells from the first place where the order of code differs
// hold no state any more (nor does a deleted one), so none runs from a state its code did not
// make.
import { saveBlob } from "./dom.js";
import { NOTEBOOKS } from "./store.js";

export const KEPT = "open"; // the open notebook's key in the store

export class NotebookEdits {
  /** @param {import("./notebook-panel.js").NotebookPanel} panel */
  constructor(panel) {
    this.panel = panel;
    this.unsaved = false; // edited since it was opened or saved
  }

  get view() {
    return this.panel.view;
  }

  /**
   * True when the open notebook may be replaced (or closed): it has no edits, or the person
   * said yes to losing them (`what`: what would replace it).
   */
  mayReplace(what) {
    if (!this.view.nb || !this.unsaved) return true;
    return window.confirm(`${this.panel.name} has edits you have not saved. ${what} Its edits are lost (Save first to keep them).`);
  }

  /** The notebook differs from what was opened or saved: kept in this browser as it is now. */
  changed() {
    this.unsaved = true;
    this.keep();
  }

  /** A cell's button: add one below, delete, move up or down, make markdown or code, edit. */
  reshape(cell, action) {
    if (action === "edit") {
      cell.edit();
      return;
    }
    const { panel, view } = this;
    if (panel.current) {
      panel.showMessage("Wait for the run in progress to end (or cancel it) before you add, delete or move cells.");
      return;
    }
    const before = view.codeCells;
    const name = cell.name;
    let focus = null;
    let said;
    if (action === "up" || action === "down") {
      if (!view.move(cell, action === "up" ? -1 : 1)) {
        panel.app.announcer.say(`${name} is the ${action === "up" ? "first" : "last"} cell already.`);
        return;
      }
      focus = cell.tools.button(action); // a node moved up loses the focus: given back
      said = `Moved ${name} ${action}.`;
    } else if (action === "add") {
      focus = view.insert(cell.index + 1, "code").editor;
      said = `Added a code cell below ${name}.`;
    } else if (action === "delete") {
      const next = view.items[cell.index + 1] || view.items[cell.index - 1] || null;
      view.remove(cell);
      focus = next ? focusable(next) : panel.ui.addCell;
      said = `Deleted ${name}.`;
    } else if (action === "markdown" || action === "code") {
      focus = focusable(view.convert(cell, action));
      said = `Made ${name} a ${action} cell.`;
    } else {
      return;
    }
    this.reshaped(before);
    focus?.focus();
    panel.app.announcer.say(said);
  }

  /** A code cell at the end (a new notebook's first, when none is open). */
  addCell() {
    const { panel, view } = this;
    if (panel.current) return;
    if (!view.nb) {
      panel.open(emptyNotebook(), "Untitled.ipynb");
      view.codeCells[0].editor.focus();
      return;
    }
    const before = view.codeCells;
    const added = view.insert(view.items.length, "code");
    this.reshaped(before);
    added.editor.focus();
    panel.app.announcer.say("Added a code cell at the end.");
  }

  /**
   * The code cells were `before` a change of the notebook's shape: from the first place where
   * they differ now, no cell holds its state (a deleted one neither).
   */
  reshaped(before) {
    const after = this.view.codeCells;
    let same = 0;
    while (same < before.length && same < after.length && before[same] === after[same]) same += 1;
    const dropped = [];
    for (const cell of new Set([...before.slice(same), ...after.slice(same)])) {
      if (cell.snapshot) dropped.push(cell.snapshot);
      cell.snapshot = null;
    }
    this.panel.forget(dropped);
    this.panel.describe();
    this.changed();
  }

  /** Download the notebook as it is on show, under its own name: it has no unsaved edits now. */
  save() {
    if (!this.view.nb) return;
    saveNotebook(this.view.toSaved(), this.panel.name);
    this.unsaved = false;
    this.keep();
    this.panel.app.announcer.say(`Saved ${this.panel.name}.`);
  }

  /** Keep the notebook as it is now in this browser (after a pause in the changes). */
  keep() {
    this.panel.app.store?.keepLater(NOTEBOOKS, KEPT, () => (this.view.nb ? this.kept() : null));
  }

  /** Keep no notebook (it was closed). */
  forget() {
    this.unsaved = false;
    this.panel.app.store?.delete(NOTEBOOKS, KEPT);
  }

  /** What a reload opens again: the cells as on show, the states they hold, the files to get. */
  kept() {
    return {
      name: this.panel.name,
      nb: this.view.toSaved(),
      states: this.view.codeCells.filter((cell) => cell.snapshot).map((cell) => [cell.cell.id, cell.snapshot]),
      files: this.panel.filesFrom,
      unsaved: this.unsaved,
    };
  }
}

export function saveNotebook(nb, name) {
  const text = JSON.stringify(nb, null, 1) + "\n";
  saveBlob(new Blob([text], { type: "application/x-ipynb+json" }), name);
}

/** A notebook of one empty Python cell (Add cell with no notebook open). */
function emptyNotebook() {
  return {
    nbformat: 4,
    nbformat_minor: 5,
    metadata: {
      kernelspec: { name: "python3", display_name: "Python 3", language: "python" },
      language_info: { name: "python" },
    },
    cells: [{ cell_type: "code", metadata: {}, source: "", outputs: [], execution_count: null }],
  };
}

/** What takes the focus for a cell: a code cell's editor, a text cell's Edit button. */
function focusable(item) {
  return item.kind === "code" ? item.editor : item.tools.button("edit");
}
