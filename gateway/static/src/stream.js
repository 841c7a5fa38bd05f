// A client for WebSocket /v1/stream: one connection, many runs and notebook replays, events
// routed by `ref` to the handlers of the run that asked (one per event type).

export class StreamClient {
  /**
   * @param {() => string} token  the token to present (empty: none)
   * @param {(state: string, detail?: string) => void} onState  connection state changes
   */
  constructor(token, onState) {
    this.token = token;
    this.onState = onState;
    this.socket = null;
    this.opening = null;
    this.runs = new Map(); // ref -> handlers
    this.counter = 0;
  }

  url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const token = this.token();
    const query = token ? `?token=${encodeURIComponent(token)}` : "";
    return `${scheme}//${location.host}/v1/stream${query}`;
  }

  /** Resolve when connected (opening a connection if there is none). */
  connect() {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) return Promise.resolve();
    if (this.opening) return this.opening;
    this.onState("connecting");
    this.opening = new Promise((resolve, reject) => {
      const socket = new WebSocket(this.url());
      let opened = false;
      socket.addEventListener("open", () => {
        opened = true;
        this.socket = socket;
        this.opening = null;
        this.onState("open");
        resolve();
      });
      socket.addEventListener("message", (event) => this.dispatch(event.data));
      socket.addEventListener("close", (event) => {
        this.opening = null;
        if (this.socket === socket) this.socket = null;
        if (!opened) {
          // A refused handshake (401, 403) shows up as a close before open, code 1006.
          this.onState("failed");
          reject(new Error("The gateway refused the connection (is the token right?)."));
          return;
        }
        this.onState("closed", event.reason || `code ${event.code}`);
        for (const handlers of this.runs.values()) handlers.onClosed?.();
        this.runs.clear();
      });
    });
    return this.opening;
  }

  dispatch(text) {
    let event;
    try {
      event = JSON.parse(text);
    } catch {
      return;
    }
    const handlers = event.ref !== null && event.ref !== undefined
      ? this.runs.get(event.ref)
      : null;
    if (!handlers) {
      if (event.type === "error") this.onState("error", event.error?.message || "error");
      return;
    }
    if (event.type === "done" || event.type === "error") this.runs.delete(event.ref);
    handlers[event.type]?.(event);
  }

  /** Start a run; `handlers` has accepted, output, output_dropped, done, error, onClosed. */
  run(fields, handlers) {
    return this.start("run", fields, handlers);
  }

  /**
   * Replay a notebook; `handlers` also has cell_started and cell_finished, and outputs carry
   * the cell's `index`. `done` brings the run record and the executed notebook.
   */
  notebook(fields, handlers) {
    return this.start("notebook", fields, handlers);
  }

  async start(type, fields, handlers) {
    await this.connect();
    const ref = `${type[0]}${Date.now().toString(36)}-${++this.counter}`;
    this.runs.set(ref, handlers);
    this.socket.send(JSON.stringify({ type, ref, ...fields }));
    return ref;
  }

  cancel(id) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) {
      this.socket.send(JSON.stringify({ type: "cancel", id }));
    }
  }
}
