// What the Code and Notebook views share: one run (a replay, in the Notebook view) at a time
// over the WebSocket, its status bar and message line, Cancel, and how a run that could not
// start or was refused ends (files it was to get again that are gone: said plainly, with an
// offer to add them again).
import { el } from "./dom.js";

export class RunPanel {
  /**
   * @param {object} app  the page's shared parts (main.js)
   * @param {{noun: string, failure: string}} words  what a run is called ("run", "replay"),
   *   and what is announced before the message of one that failed
   */
  constructor(app, { noun, failure }) {
    this.app = app;
    this.noun = noun;
    this.failure = failure;
    this.current = null; // the run in progress: {ref, id, started, dropped, cancelRequested, ...}
  }

  get busy() {
    return this.current !== null;
  }

  showMessage(text) {
    this.ui.message.textContent = text;
    this.ui.message.hidden = !text;
  }

  /**
   * A run's files, kept for a later run (`keep_files`): the staged ones over those `given`
   * (the run from the history on show) was given, by `files_from`; or, when a run had the
   * gateway keep exactly the staged ones, that run named instead of the files sent again (the
   * gateway keeps one copy of them, not one per run).
   */
  async filesFields(run, given) {
    const stage = this.app.files;
    run.version = stage.version;
    const fields = {};
    if (!given && stage.keptRun) {
      run.reused = fields.files_from = stage.keptRun;
    } else {
      const files = await stage.payload();
      if (files.length) fields.files = files;
      run.staged = files.length > 0 && !given;
      if (given) run.filesFrom = fields.files_from = given;
    }
    if (fields.files || fields.files_from) fields.keep_files = true;
    return fields;
  }

  /** The run's record says the gateway keeps the files it was given: named by later runs. */
  filesKept(run, record) {
    if (record.files_given?.kept && (run.reused || run.staged)) this.app.files.keptBy(run.version, record.id);
  }

  /**
   * A message with a button that adds the files again (a folder, as Add folder… does, but
   * without opening its notebook); `focus`: the button takes the focus.
   */
  offerFiles(text, { focus = false } = {}) {
    const again = el("button", { type: "button", class: "small" }, "Add the files again…");
    again.addEventListener("click", () => this.app.addFilesAgain());
    this.ui.message.replaceChildren(`${text} `, again);
    this.ui.message.hidden = false;
    if (focus) again.focus();
  }

  /**
   * The files an earlier run was given, which `run` was to get again (`files_from`), are gone
   * (410 `files_gone`; 404 when that run's record is): nothing ran without them.
   */
  filesGone(run, event) {
    const why = event.error?.message ? ` (${event.error.message.replace(/\.$/, "")})` : "";
    const text = `Nothing ran: the files ${run.filesFrom} was given are gone${why}. Add them again, then run it again.`;
    this.failed(run, text);
    this.offerFiles(text, { focus: true });
  }

  /** The stream callbacks of `run` for the gateway refusing it and the connection closing. */
  endings(run) {
    return {
      error: (event) => this.failed(run, event.error?.message || `The ${this.noun} was refused.`),
      onClosed: () => this.failed(run, `The connection closed; the ${this.noun} was cancelled.`),
    };
  }

  /** A finished run's record: marked in the history, which is read again. */
  recorded(record) {
    this.app.history.mark(record.id);
    this.app.history.reload();
  }

  failed(run, message) {
    if (run !== this.current) return;
    this.status.stop();
    this.status.set("error");
    this.showMessage(message);
    this.app.announcer.say(`${this.failure}: ${message}`);
    this.current = null;
    this.setBusy(false);
  }

  cancel() {
    if (!this.current) return;
    this.current.cancelRequested = true;
    this.status.set("cancelling");
    if (this.current.id) this.app.client.cancel(this.current.id);
  }
}
