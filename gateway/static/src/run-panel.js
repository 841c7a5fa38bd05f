// What the Code and Notebook views share: one run (a replay, in the Notebook view) at a time
// over the WebSocket, its status bar and message line, Cancel, and how a run that could not
// start or was refused ends.
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
