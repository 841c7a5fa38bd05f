// The Notebook view: a notebook opened from a file (or a notebook run from the history), run
// as JupyterLab runs one: a cell at a time (Shift+Enter runs it and goes on to the next,
// Ctrl+Enter runs it and stays), or all of it (Run all), over the WebSocket, with each cell's
// outputs, status and time as they come; Cancel; Restart; the executed notebook to download.
// Its cells are edited (notebook-edits.js) and it is kept in this browser until it is closed.
//
// No kernel outlives its run here: a cell runs in a continuation of the state the cell
// before it left (a snapshot, docs/API.md "Snapshots"), kept after each cell that runs
// (`keep: "cells"`). A cell whose code is edited, and every cell after it, no longer hold a
// state; running a cell first runs the cells between it and the nearest one before it that
// holds one. Restart forgets every state: the next cell runs from nothing. Where the gateway
// cannot keep states (its backend or the notebook's language), a cell runs with every cell
// before it, as a replay of them.
//
// A replay is sent with the notebook's `name` (the history lists it so) and `keep_files` when
// files are staged; a notebook from the history runs from nothing with the files its run was
// given (`files_from`), or says plainly that they are gone.
import { byId, byIds, el } from "./dom.js";
import { formatBytes, formatDuration } from "./format.js";
import { chartsOf, fromBundle } from "./gallery.js";
import { cellName } from "./notebook-cells.js";
import { NotebookEdits, saveNotebook } from "./notebook-edits.js";
import { executedName, giveIds, notebookLanguage, sendableName } from "./notebook-file.js";
import { NotebookView } from "./notebook-view.js";
import { RunPanel } from "./run-panel.js";
import { StatusBar } from "./status.js";

export class NotebookPanel extends RunPanel {
  /** @param {object} app  the page's shared parts (main.js) */
  constructor(app) {
    super(app, { noun: "replay", failure: "The replay failed" });
    this.ui = {
      title: byId("notebook-title"),
      meta: byId("notebook-meta"),
      ...byIds(["dropZone", "runAll"]),
      ...byIds(["cancel", "restart", "download", "save", "close", "addCell", "progress", "message", "notes", "timeout", "cellTimeout", "allowErrors"], "nb-"),
    };
    this.status = new StatusBar({ status: byId("nb-status"), duration: byId("nb-duration") });
    this.view = new NotebookView(byId("cells"), {
      onImage: (data, meta) => app.gallery.add(fromBundle(data, meta)),
      onRunCell: (cell, advance) => this.runCell(cell, advance),
      onEdit: (cell) => this.edited(cell),
      onTool: (cell, action) => this.edits.reshape(cell, action),
    });
    this.edits = new NotebookEdits(this);
    this.name = null;
    this.executed = null; // the last run of the cells on show: {runId, metadata} (its notebook's)
    this.filesFrom = null; // {run, given}: the run from the history whose kept files a run from nothing gets
    this.keeps = true; // whether this gateway keeps states (false once it said it cannot)
    this.count = 0; // the execution count of the last cell run since the last Restart
    this.queue = []; // cells asked to run while another run goes on, in order
    this.deleted = new Set(); // snapshots this page let go of (never asked twice, never held again)
    this.generation = 0; // counts the times states were let go of: a run's states stand only if none was since it began
    this.ui.runAll.addEventListener("click", () => this.runAll());
    this.ui.cancel.addEventListener("click", () => this.cancel());
    this.ui.restart.addEventListener("click", () => this.restart());
    this.ui.download.addEventListener("click", () => this.download());
    this.ui.save.addEventListener("click", () => this.edits.save());
    this.ui.close.addEventListener("click", () => this.close());
    this.ui.addCell.addEventListener("click", () => this.edits.addCell());
    this.status.set("idle");
    this.setBusy(false);
  }

  setBusy(busy) {
    const none = !this.view.nb;
    this.ui.runAll.disabled = busy || none;
    this.ui.restart.disabled = busy || none;
    this.ui.cancel.disabled = !busy;
    this.ui.close.disabled = busy || none;
    this.ui.save.disabled = none;
    this.ui.addCell.disabled = busy;
  }

  /**
   * Show a notebook (opened, or a run's from the history) and make it the one that runs.
   * `states` (cell id -> snapshot id): the states its cells hold (a chain from the history, a
   * notebook kept across a reload); else those `executedBy`, the run it shows, kept. `files`
   * ({run, given}): the files that run was given, for a run from nothing to get again.
   */
  open(nb, name, { executedBy = null, states = null, files = null, unsaved = false } = {}) {
    if (this.current) return false;
    this.forget(this.view.forgetAll());
    giveIds(nb);
    this.queue = [];
    this.count = 0;
    this.name = name;
    this.edits.unsaved = unsaved;
    this.executed = executedBy ? { runId: executedBy.id, metadata: nb.metadata } : null;
    const language = notebookLanguage(nb);
    this.view.show(nb, language);
    this.ui.title.textContent = name;
    this.describe();
    this.ui.dropZone.classList.add("compact");
    this.showMessage("");
    this.ui.notes.replaceChildren();
    this.ui.progress.textContent = "";
    this.ui.download.hidden = !executedBy;
    if (executedBy) {
      this.status.set(executedBy.status, { ms: executedBy.usage?.wall_ms, usage: executedBy.usage });
      this.ui.notes.replaceChildren(...(executedBy.notes || []).map((note) => el("li", {}, note)));
    } else {
      this.status.set("idle");
    }
    this.withFiles(files);
    this.app.gallery.show(chartsOf(nb.cells.flatMap((cell) => cell.outputs || []), executedBy?.charts), baseName(name));
    // the states a run from the history kept, for its cells to go on from
    for (const cell of this.view.codeCells) {
      if (states) cell.snapshot = this.holdable(states.get(cell.cell.id));
    }
    for (const kept of states ? [] : executedBy?.snapshots || []) {
      const cell = this.view.cells[kept.cell];
      if (cell && !kept.gone) cell.snapshot = this.holdable(kept.id);
    }
    this.count = Math.max(0, ...this.view.codeCells.map((c) => c.count || 0));
    this.setBusy(false);
    this.edits.keep();
    this.app.announcer.say(`Opened ${name}: ${this.counts()}.`);
    return true;
  }

  counts() {
    return `${this.view.items.length} cells, ${this.view.codeCells.length} of code`;
  }

  /** The line under the title: the kernel, the cells, the run it shows. */
  describe() {
    const meta = this.view.nb.metadata || {};
    const kernel = meta.kernelspec?.display_name || meta.kernelspec?.name || this.view.language;
    const run = this.executed ? ` · run ${this.executed.runId}` : "";
    // The notebook's own metadata is untrusted text: set as text, never as markup.
    this.ui.meta.textContent = `Kernel: ${kernel} · ${this.counts()}${run}`;
    this.ui.meta.hidden = false;
  }

  /**
   * The files the run on show was given: kept by the gateway, a run from nothing gets them
   * again (`files_from`); not kept, the page says so and offers to add them again.
   */
  withFiles(files) {
    this.filesFrom = null;
    const given = files?.given;
    if (!given?.count) return;
    const what = `${given.count} file${given.count === 1 ? "" : "s"} (${formatBytes(given.bytes)})`;
    if (given.kept) {
      this.filesFrom = files;
      this.ui.notes.append(el("li", {}, `Its run was given ${what}, which the gateway keeps: a run from the start gets them again.`));
    } else {
      this.offerFiles(`Its run was given ${what}, which the gateway did not keep: add them again before you run it.`);
    }
  }

  /** Every cell, from nothing (a fresh kernel), each cell's state kept for the next. */
  runAll() {
    if (this.current || !this.view.nb || !this.app.auth.ready()) return;
    this.queue = [];
    this.forget(this.view.forgetAll());
    this.count = 0;
    this.start({ cells: this.view.codeCells, from: null, all: true });
  }

  /** Run one cell (Shift+Enter: and go on to the next one, as JupyterLab does). */
  runCell(cell, advance) {
    if (!this.view.nb) return;
    if (advance) this.view.nextCode(cell)?.editor.focus();
    if (cell.kind !== "code") return; // a markdown cell shown again: nothing runs
    if (this.current) {
      if (!this.queue.includes(cell)) {
        this.queue.push(cell);
        cell.setStatus("queued");
      }
      return;
    }
    this.runQueued(cell);
  }

  runQueued(cell) {
    if (!this.app.auth.ready()) {
      this.queue = [];
      return;
    }
    if (!this.keeps) {
      // Nothing is kept: the cell runs with every cell before it, from nothing.
      const cells = this.view.codeCells.filter((c) => c.index <= cell.index);
      this.start({ cells, from: null, all: false });
      return;
    }
    const { from, cells } = this.view.chainTo(cell);
    this.forget(this.view.forgetFrom(cells[0]));
    if (!from) this.count = 0; // from nothing: a new kernel counts from 1
    this.start({ cells, from, all: false });
  }

  /**
   * An edited cell no longer holds the state its code left, nor do the cells after it; a run
   * going on now keeps none of the states it makes (they may stand on the old code).
   */
  edited(cell) {
    if (cell.kind === "code") this.forget(this.view.forgetFrom(cell));
    this.edits.changed();
  }

  /** Close the notebook: its states let go of, and no longer kept in this browser. */
  close() {
    if (this.current || !this.view.nb || !this.edits.mayReplace("Close it?")) return;
    this.forget(this.view.forgetAll());
    const name = this.name;
    this.view.clear();
    this.edits.forget();
    this.name = null;
    this.executed = null;
    this.filesFrom = null;
    this.queue = [];
    this.ui.title.textContent = "No notebook open";
    this.ui.meta.hidden = true;
    this.ui.dropZone.classList.remove("compact");
    this.showMessage("");
    this.ui.notes.replaceChildren();
    this.ui.progress.textContent = "";
    this.ui.download.hidden = true;
    this.status.set("idle");
    this.app.gallery.clear();
    this.setBusy(false);
    this.app.announcer.say(`Closed ${name}.`);
  }

  /** The notebook kept in this browser before a reload, opened again. */
  /** The notebook this browser kept, opened again after a reload; never over one the user
   * opened meanwhile (a History item clicked while the page was still loading). */
  restore(kept) {
    if (!kept?.nb || !Array.isArray(kept.nb.cells) || typeof kept.name !== "string") return false;
    if (this.view.nb) return false;
    return this.open(kept.nb, kept.name, { states: new Map(kept.states || []), files: kept.files, unsaved: Boolean(kept.unsaved) });
  }

  /** Forget every state: the next cell runs from nothing. */
  restart() {
    if (this.current || !this.view.nb) return;
    this.forget(this.view.forgetAll());
    this.count = 0;
    this.ui.progress.textContent = "";
    this.app.announcer.say("Restarted: the next cell runs from nothing.");
  }

  /** Let the gateway free snapshots no cell holds any more. */
  forget(ids) {
    this.generation += 1;
    if (ids.length) this.edits.keep();
    for (const id of ids) {
      if (this.deleted.has(id)) continue;
      this.deleted.add(id);
      this.app.api.deleteSnapshot(id).catch(() => {});
    }
  }

  /** A state a cell may hold: not one this page let go of. */
  holdable(id) {
    return id && !this.deleted.has(id) ? id : null;
  }

  async start({ cells, from, all }) {
    const notebook = all ? this.view.toNotebook() : this.view.notebookOf(cells);
    // where each cell of what is sent is in the notebook on show
    const positions = all ? null : cells.map((cell) => cell.index);
    this.view.begin(cells);
    this.showMessage("");
    this.ui.notes.replaceChildren();
    if (all) {
      this.ui.download.hidden = true;
      this.executed = null;
      this.app.gallery.clear(baseName(this.name));
    }
    this.status.set("starting");
    this.setBusy(true);
    const mine = (this.current = {
      ref: null, id: null, started: performance.now(), dropped: 0, ran: 0,
      codeCells: cells.length, cells, positions, all, from,
      sources: cells.map((cell) => cell.editor.text), // a cell edited meanwhile keeps no state
      generation: this.generation,
    });
    const what = all || cells.length > 1 ? `${cells.length} code cells` : "a code cell";
    this.app.announcer.say(`${all ? "Replaying" : "Running"} ${what} of ${this.name}.`);
    try {
      const fields = {
        notebook,
        timeout: Number(this.ui.timeout.value) || 300,
        cell_timeout: Number(this.ui.cellTimeout.value) || 120,
        allow_errors: this.ui.allowErrors.checked,
      };
      const name = sendableName(this.name);
      if (name) fields.name = name; // the history lists the replay by it
      if (this.keeps) fields.keep = "cells";
      // a state that went (its TTL, its owner's limits) is rebuilt from its chain's code
      if (from) Object.assign(fields, { from, rebuild: true });
      // a continuation has the working folder the state had: the files go with a run from
      // nothing, and are kept for the next (`keep_files`)
      if (!from) Object.assign(fields, await this.filesFields(mine, this.filesFrom?.run));
      mine.ref = await this.app.client.notebook(fields, {
        accepted: (event) => this.accepted(mine, event),
        cell_started: (event) => this.cellStarted(mine, event),
        output: (event) => mine === this.current && this.view.output(this.located(mine, event)),
        cell_finished: (event) => this.cellFinished(mine, event),
        output_dropped: (event) => { mine.dropped += event.dropped || 1; },
        done: (event) => this.done(mine, event),
        ...this.endings(mine),
        error: (event) => this.refused(mine, event),
      });
    } catch (err) {
      this.failed(mine, err.message);
    }
  }

  /** An event of `run` with its cell's index in the notebook on show. */
  located(run, event) {
    if (!run.positions || typeof event.index !== "number") return event;
    return { ...event, index: run.positions[event.index] ?? -1 };
  }

  refused(run, event) {
    const code = event.error?.code;
    const filesWent = code === "files_gone" || (code === "not_found" && !run.from);
    if (run.reused && filesWent && run === this.current) {
      // the staged files, kept for a run before, went: the same run with them sent again
      this.app.files.notKeptBy(run.reused);
      this.current = null;
      this.setBusy(false);
      if (run.all) this.runAll();
      else this.runQueued(run.cells.at(-1));
      return;
    }
    if (run.filesFrom && filesWent) {
      // the files the run from the history was given went: nothing ran without them
      if (run === this.current) this.filesFrom = null;
      this.filesGone(run, event);
      this.edits.keep();
      return;
    }
    if (run === this.current && run.from && !run.retried && ["not_found", "snapshot_gone"].includes(code)) {
      // the state before these cells is gone for good (even its chain): run from earlier
      const holder = this.view.codeCells.find((cell) => cell.snapshot === run.from);
      if (holder) this.forget(this.view.forgetFrom(holder));
      this.current = null;
      this.setBusy(false);
      this.runQueued(run.cells.at(-1));
      if (this.current) this.current.retried = true;
      return;
    }
    if (code === "snapshot_unsupported" && this.keeps && run === this.current) {
      // This gateway keeps no states: the same run without them.
      this.keeps = false;
      this.current = null;
      this.setBusy(false);
      if (run.all) this.runAll();
      else this.runQueued(run.cells.at(-1));
      return;
    }
    this.failed(run, event.error?.message || "The replay was refused.");
  }

  accepted(run, event) {
    run.id = event.id;
    this.status.set(run.cancelRequested ? "cancelling" : "running");
    this.status.startTimer(run.started);
    if (run.cancelRequested) this.app.client.cancel(run.id);
  }

  cellStarted(run, event) {
    if (run !== this.current) return;
    run.ran += 1;
    const located = this.located(run, event);
    this.view.cellStarted(located);
    this.ui.progress.textContent = `${cellName(this.count + 1)} · ${run.ran} of ${run.codeCells} code cells`;
  }

  cellFinished(run, event) {
    if (run !== this.current) return;
    this.count += 1;
    const located = this.located(run, event);
    const cell = this.view.cellFinished(located, this.count);
    const how = event.status === "ok" ? "finished" : `ended: ${event.status.replace("_", " ")}`;
    this.app.announcer.say(`${cellName(this.count)} ${how}, ${formatDuration(event.duration_ms)}.`);
    if (cell && event.status !== "ok") cell.node.scrollIntoView({ block: "nearest" });
  }

  async done(run, event) {
    if (run !== this.current) return;
    const record = event.run;
    this.status.stop();
    let executed = event.notebook;
    if (!executed) {
      // Too large for one event: the gateway keeps it.
      try {
        executed = await this.app.api.getNotebook(record.id);
      } catch {
        executed = null;
      }
    }
    this.current = null;
    this.setBusy(false);
    if (run.cancelRequested) this.queue = []; // a cancel stops what waits, too
    this.view.finish(executed, { replaceOutputs: run.dropped > 0, positions: run.positions, waiting: this.queue });
    // each cell that ran holds the state it left, for the next cell to run from: unless a
    // state was let go of since the run began (an edit), or a cell before it was edited
    let stands = run.generation === this.generation;
    const kept = [...(record.snapshots || [])].sort((a, b) => a.cell - b.cell);
    const dropped = [];
    for (const state of kept) {
      const cell = this.view.cells[run.positions ? run.positions[state.cell] : state.cell];
      const which = cell ? run.cells.indexOf(cell) : -1;
      stands = stands && which >= 0 && !state.gone && cell.editor.text === run.sources[which];
      if (stands) cell.snapshot = state.id;
      else dropped.push(state.id);
    }
    this.forget(dropped);
    if (run.from && record.continued_by === "replay") {
      this.ui.notes.append(el("li", {}, "The state before this cell had gone: the cells before it were run again to make it."));
    }
    this.filesKept(run, record);
    this.status.set(record.status, { ms: record.usage?.wall_ms, usage: record.usage });
    this.app.budget?.refresh();
    this.ui.progress.textContent = `${run.ran} of ${run.codeCells} code cells ran`;
    this.ui.notes.append(...(record.notes || []).map((note) => el("li", {}, note)));
    this.executed = { runId: record.id, metadata: executed?.metadata || this.view.nb.metadata };
    this.ui.download.hidden = false;
    this.describe();
    const outputs = this.view.codeCells.flatMap((cell) => cell.shown);
    this.app.gallery.show(chartsOf(outputs, run.all ? record.charts : null), baseName(this.name));
    this.app.announcer.say(`${run.all ? "Replay" : "Run"} ${record.status.replace("_", " ")}: ${run.ran} of ${run.codeCells} code cells ran, in ${formatDuration(record.usage?.wall_ms)}.`);
    this.recorded(record);
    this.edits.keep();
    const next = this.queue.shift();
    if (next) this.runQueued(next);
  }

  failed(run, message) {
    if (run === this.current) {
      this.queue = [];
      this.view.finish(null); // the cells that were to run: not run
    }
    super.failed(run, message);
  }

  /** The executed copy: the notebook as on show, with its last run's metadata. */
  download() {
    if (!this.executed || !this.view.nb) return;
    saveNotebook({ ...this.view.toSaved(), metadata: this.executed.metadata || {} }, executedName(this.name));
  }
}

function baseName(name) {
  return String(name || "notebook").replace(/\.ipynb$/i, "").replace(/[^\w.-]+/g, "_");
}
