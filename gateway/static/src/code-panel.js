// The Code view: the editor, Run and Cancel, the run's live outputs, status and notes, the
// run as a notebook to download; and a run from the history shown again, ready to re-run with
// the files it was given (when the gateway kept them). The draft is kept across reloads, and
// whether it is unsaved (neither run nor opened from the history) is what the page asks about
// before it replaces it.
import { byId, byIds, el } from "./dom.js";
import { createEditor } from "./editor.js";
import { formatBytes, formatDuration } from "./format.js";
import { chartsOf, fromBundle } from "./gallery.js";
import { OutputView } from "./render.js";
import { RunPanel } from "./run-panel.js";
import { StatusBar } from "./status.js";

const SAMPLES = {
  python: [
    "import sys, time",
    "print('hello from a fresh kernel')",
    "print('this goes to stderr', file=sys.stderr)",
    "",
    "import matplotlib.pyplot as plt",
    "plt.plot([1, 4, 2, 8, 5])",
    "plt.title('a chart')",
    "plt.show()",
    "",
    "import pandas as pd",
    "pd.DataFrame({'x': [1, 2, 3], 'y': [4.5, 5.5, 6.5]})",
  ].join("\n"),
  bash: ["echo \"hello from $(uname -s)\"", "echo 'to stderr' >&2", "ls -la"].join("\n"),
  javascript: [
    "console.log('hello from Deno', Deno.version.deno);",
    "console.error('this goes to stderr');",
    "const squares = [1, 2, 3].map((n) => n * n);",
    "Deno.jupyter.html`<b>${squares.join(', ')}</b>`",
  ].join("\n"),
  typescript: [
    "const greet = (name: string): string => `hello, ${name}`;",
    "console.log(greet('TypeScript'));",
    "const result: number[] = [1, 2, 3].map((n) => n * n);",
    "result",
  ].join("\n"),
  r: [
    "cat('hello from R', R.version.string, '\\n')",
    "message('this goes to stderr')",
    "library(ggplot2)",
    "ggplot(mtcars, aes(wt, mpg)) + geom_point() + ggtitle('a chart')",
    "head(mtcars)",
  ].join("\n"),
};

const DRAFT_KEY = "gateway-draft"; // the editor's text and language, and the code last run, kept across reloads

export class CodePanel extends RunPanel {
  /**
   * @param {{client, api, files, gallery, history, announcer, auth, onDownload}} app
   *   the page's shared parts (main.js)
   */
  constructor(app) {
    super(app, { noun: "run", failure: "The run failed to start" });
    this.ui = byIds(["language", "timeout", "run", "cancel", "rerun", "download", "runTitle", "message", "outputs", "notes"]);
    this.status = new StatusBar({ status: byId("status"), exitCode: byId("exit-code"), duration: byId("duration") });
    this.view = new OutputView(this.ui.outputs, { onImage: (data, meta) => app.gallery.add(fromBundle(data, meta)) });
    this.shown = null; // the run record on show
    this.filesFrom = null; // the run from the history whose kept files a run gets again

    const draft = readDraft();
    this.ran = typeof draft?.ran === "string" ? draft.ran : null; // the code last run or opened
    this.ui.language.value = draft?.language in SAMPLES ? draft.language : "python";
    this.editor = createEditor(byId("editor"), {
      doc: draft?.code ?? SAMPLES[this.ui.language.value],
      language: this.ui.language.value,
      label: "Code to run",
      onRun: () => this.run(),
      onChange: () => this.saveDraft(),
    });

    this.ui.language.addEventListener("change", () => this.languageChanged());
    this.ui.run.addEventListener("click", () => this.run());
    this.ui.cancel.addEventListener("click", () => this.cancel());
    this.ui.rerun.addEventListener("click", () => this.rerun());
    this.ui.download.addEventListener("click", (event) => app.onDownload(event, this.ui.download));
    this.status.set("idle");
  }

  saveDraft() {
    try {
      localStorage.setItem(DRAFT_KEY, JSON.stringify({ code: this.editor.text, language: this.ui.language.value, ran: this.ran }));
    } catch {
      // storage full or refused: the draft is only a comfort
    }
  }

  /** The editor holds code of the person's own that was neither run nor opened: a draft to ask about. */
  get unsaved() {
    const text = this.editor.text;
    return Boolean(text.trim()) && text !== this.ran && !Object.values(SAMPLES).includes(text);
  }

  languageChanged() {
    // a sample (of any language) is replaced by the new language's; the user's code is kept
    const text = this.editor.text;
    if (!text.trim() || Object.values(SAMPLES).includes(text)) this.editor.text = SAMPLES[this.ui.language.value];
    this.editor.setLanguage(this.ui.language.value);
    this.saveDraft();
  }

  setBusy(busy) {
    this.ui.run.disabled = busy;
    this.ui.cancel.disabled = !busy;
    this.ui.language.disabled = busy;
    this.ui.rerun.disabled = busy;
  }

  /** Clear the result side for a new run (or a run from the history). */
  reset() {
    this.showMessage("");
    this.view.clear();
    this.ui.notes.replaceChildren();
    this.ui.download.hidden = true;
    this.ui.rerun.hidden = true;
    this.ui.runTitle.hidden = true;
    this.app.gallery.clear();
  }

  async run() {
    if (this.current) return;
    if (!this.app.auth.ready()) return;
    const code = this.editor.text;
    this.ran = code;
    this.saveDraft();
    this.reset();
    this.status.set("starting");
    this.setBusy(true);
    this.app.announcer.say("Run starting.");
    const mine = (this.current = { ref: null, id: null, started: performance.now(), dropped: 0 });
    try {
      const fields = { code, language: this.ui.language.value, timeout: Number(this.ui.timeout.value) || 30 };
      Object.assign(fields, await this.filesFields(mine, this.filesFrom));
      mine.ref = await this.app.client.run(fields, {
        accepted: (event) => this.accepted(mine, event),
        output: (event) => mine === this.current && this.view.add(event.output, event.display_id, event.update),
        output_dropped: (event) => { mine.dropped += event.dropped || 1; },
        done: (event) => this.done(mine, event.run),
        ...this.endings(mine),
        error: (event) => this.refused(mine, event),
      });
    } catch (err) {
      this.failed(mine, err.message);
    }
  }

  refused(run, event) {
    const code = event.error?.code;
    if (run.reused && (code === "files_gone" || code === "not_found") && run === this.current) {
      // the staged files, kept for a run before, went: the same run with them sent again
      this.app.files.notKeptBy(run.reused);
      this.current = null;
      this.setBusy(false);
      this.run();
      return;
    }
    if (run.filesFrom && (code === "files_gone" || code === "not_found")) {
      if (run === this.current) this.filesFrom = null;
      this.filesGone(run, event);
      return;
    }
    this.failed(run, event.error?.message || "The run was refused.");
  }

  accepted(run, event) {
    run.id = event.id;
    this.status.set("running");
    this.status.startTimer(run.started);
    this.app.announcer.say("Running.");
    if (run.cancelRequested) this.app.client.cancel(run.id);
  }

  done(run, record) {
    if (run !== this.current) return;
    this.status.stop();
    // The live view equals the record unless live outputs were dropped or cut.
    const cut = run.dropped || record.output_truncated || record.stdout_truncated || record.stderr_truncated;
    this.current = null;
    this.setBusy(false);
    this.showRecord(record, { replaceOutputs: cut });
    this.filesKept(run, record);
    this.app.announcer.say(`Run ${record.status.replace("_", " ")}${record.exit_code === null || record.exit_code === undefined ? "" : `, exit code ${record.exit_code}`}, in ${formatDuration(record.usage?.wall_ms)}.`);
    this.recorded(record);
  }

  /** Show a finished run's record: status, notes, download, charts (and its outputs). */
  showRecord(record, { replaceOutputs = true } = {}) {
    this.shown = record;
    if (replaceOutputs) this.view.showAll(record.outputs);
    this.status.set(record.status, { exitCode: record.exit_code, ms: record.usage?.wall_ms, usage: record.usage });
    this.app.budget?.refresh();
    this.ui.notes.replaceChildren(...(record.notes || []).map((note) => el("li", {}, note)));
    this.ui.download.hidden = false;
    this.ui.download.href = `/v1/runs/${encodeURIComponent(record.id)}/notebook`;
    this.ui.download.download = `${record.id}.ipynb`;
    this.ui.download.dataset.runId = record.id;
    this.ui.rerun.hidden = false;
    this.app.gallery.show(chartsOf(record.outputs, record.charts), record.id);
  }

  /**
   * A run from the history: its code in the editor, its record and outputs on show, and the
   * files it was given to go with a re-run (or, when they were not kept, an offer to add them).
   */
  showFromHistory(record, code, language) {
    if (this.current) return;
    this.reset();
    if (code !== null) {
      this.ui.language.value = language in SAMPLES ? language : "python";
      this.editor.setLanguage(this.ui.language.value);
      this.ran = code;
      this.editor.text = code;
    }
    this.ui.runTitle.textContent = `${record.id}, from your history`;
    this.ui.runTitle.hidden = false;
    this.showRecord(record);
    this.filesFrom = null;
    const given = record.files_given;
    if (given?.count) {
      const what = `${given.count} file${given.count === 1 ? "" : "s"} (${formatBytes(given.bytes)})`;
      if (given.kept) {
        this.filesFrom = record.id;
        this.ui.notes.append(el("li", {}, `This run was given ${what}, which the gateway keeps: a re-run gets them again.`));
      } else {
        this.offerFiles(`This run was given ${what}, which the gateway did not keep: add them again before you re-run it.`);
      }
    }
  }

  rerun() {
    if (!this.current) this.run();
  }
}

function readDraft() {
  try {
    const draft = JSON.parse(localStorage.getItem(DRAFT_KEY) || "null");
    return draft && typeof draft.code === "string" ? draft : null;
  } catch {
    return null;
  }
}
