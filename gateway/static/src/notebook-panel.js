// The Notebook view: a notebook opened from a file (or a notebook run from the history), Run
// all over the WebSocket with each cell's outputs, status and time as they come, Cancel, and
// the executed notebook to download.
import { byId, byIds, el, saveBlob } from "./dom.js";
import { formatDuration } from "./format.js";
import { chartsOf, fromBundle } from "./gallery.js";
import { executedName, notebookLanguage } from "./notebook-file.js";
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
      ...byIds(["cancel", "download", "progress", "message", "notes", "timeout", "cellTimeout", "allowErrors"], "nb-"),
    };
    this.status = new StatusBar({ status: byId("nb-status"), duration: byId("nb-duration") });
    this.view = new NotebookView(byId("cells"), {
      onImage: (data, meta) => app.gallery.add(fromBundle(data, meta)),
      onRun: () => this.runAll(),
    });
    this.name = null;
    this.executed = null; // the executed notebook of the last replay: {nb, runId}
    this.ui.runAll.addEventListener("click", () => this.runAll());
    this.ui.cancel.addEventListener("click", () => this.cancel());
    this.ui.download.addEventListener("click", () => this.download());
    this.status.set("idle");
  }

  setBusy(busy) {
    this.ui.runAll.disabled = busy || !this.view.nb;
    this.ui.cancel.disabled = !busy;
  }

  /** Show a notebook (opened, or a run's from the history) and make it the one Run all runs. */
  open(nb, name, { executedBy = null } = {}) {
    if (this.current) return false;
    this.name = name;
    this.executed = executedBy ? { nb, runId: executedBy.id } : null;
    const language = notebookLanguage(nb);
    this.view.show(nb, language);
    this.ui.title.textContent = name;
    const meta = nb.metadata || {};
    const kernel = meta.kernelspec?.display_name || meta.kernelspec?.name || language;
    const counts = `${nb.cells.length} cells, ${this.view.codeCells.length} of code`;
    // The notebook's own metadata is untrusted text: set as text, never as markup.
    this.ui.meta.textContent = `Kernel: ${kernel} · ${counts}${executedBy ? ` · run ${executedBy.id}` : ""}`;
    this.ui.meta.hidden = false;
    this.ui.dropZone.classList.add("compact");
    this.showMessage("");
    this.ui.notes.replaceChildren();
    this.ui.progress.textContent = "";
    this.ui.download.hidden = !executedBy;
    if (executedBy) {
      this.status.set(executedBy.status, { ms: executedBy.usage?.wall_ms });
      this.ui.notes.replaceChildren(...(executedBy.notes || []).map((note) => el("li", {}, note)));
    } else {
      this.status.set("idle");
    }
    this.app.gallery.show(chartsOf(nb.cells.flatMap((cell) => cell.outputs || []), executedBy?.charts), baseName(name));
    this.setBusy(false);
    this.app.announcer.say(`Opened ${name}: ${counts}.`);
    return true;
  }

  async runAll() {
    if (this.current || !this.view.nb) return;
    if (!this.app.auth.ready()) return;
    const notebook = this.view.toNotebook();
    const codeCells = this.view.codeCells.length;
    this.view.begin();
    this.showMessage("");
    this.ui.notes.replaceChildren();
    this.ui.download.hidden = true;
    this.executed = null;
    this.app.gallery.clear(baseName(this.name));
    this.status.set("starting");
    this.setBusy(true);
    const mine = (this.current = { ref: null, id: null, started: performance.now(), dropped: 0, ran: 0, codeCells });
    this.app.announcer.say(`Replaying ${this.name}: ${codeCells} code cells.`);
    try {
      const fields = {
        notebook,
        timeout: Number(this.ui.timeout.value) || 300,
        cell_timeout: Number(this.ui.cellTimeout.value) || 120,
        allow_errors: this.ui.allowErrors.checked,
      };
      const files = await this.app.files.payload();
      if (files.length) fields.files = files;
      mine.ref = await this.app.client.notebook(fields, {
        accepted: (event) => this.accepted(mine, event),
        cell_started: (event) => this.cellStarted(mine, event),
        output: (event) => mine === this.current && this.view.output(event),
        cell_finished: (event) => this.cellFinished(mine, event),
        output_dropped: (event) => { mine.dropped += event.dropped || 1; },
        done: (event) => this.done(mine, event),
        ...this.endings(mine),
      });
    } catch (err) {
      this.failed(mine, err.message);
    }
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
    this.view.cellStarted(event);
    this.ui.progress.textContent = `cell ${event.index + 1} · ${run.ran} of ${run.codeCells} code cells`;
  }

  cellFinished(run, event) {
    if (run !== this.current) return;
    const cell = this.view.cellFinished(event);
    const how = event.status === "ok" ? "finished" : `ended: ${event.status.replace("_", " ")}`;
    this.app.announcer.say(`Cell ${event.index + 1} ${how}, ${formatDuration(event.duration_ms)}.`);
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
    this.view.finish(executed, { replaceOutputs: run.dropped > 0 });
    this.status.set(record.status, { ms: record.usage?.wall_ms });
    this.ui.progress.textContent = `${run.ran} of ${run.codeCells} code cells ran`;
    this.ui.notes.replaceChildren(...(record.notes || []).map((note) => el("li", {}, note)));
    this.executed = executed ? { nb: executed, runId: record.id } : null;
    this.ui.download.hidden = !this.executed;
    const outputs = (executed?.cells || []).flatMap((cell) => cell.outputs || []);
    this.app.gallery.show(chartsOf(outputs, record.charts), baseName(this.name));
    this.app.announcer.say(`Replay ${record.status.replace("_", " ")}: ${run.ran} of ${run.codeCells} code cells ran, in ${formatDuration(record.usage?.wall_ms)}.`);
    this.recorded(record);
  }

  failed(run, message) {
    if (run === this.current) this.view.finish(null); // the cells that were to run: not run
    super.failed(run, message);
  }

  download() {
    if (!this.executed) return;
    const text = JSON.stringify(this.executed.nb, null, 1) + "\n";
    saveBlob(new Blob([text], { type: "application/x-ipynb+json" }), executedName(this.name));
  }
}

function baseName(name) {
  return String(name || "notebook").replace(/\.ipynb$/i, "").replace(/[^\w.-]+/g, "_");
}
