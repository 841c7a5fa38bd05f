// The side list of the caller's runs (`GET /v1/runs`, newest first, a page at a time): each a
// button that opens the run again. It is the gateway's list, so it survives a reload.
import { el } from "./dom.js";
import { formatWhen } from "./format.js";

const PAGE = 30;

export class History {
  /**
   * @param {{list: HTMLElement, more: HTMLButtonElement, message: HTMLElement,
   *          refresh: HTMLButtonElement}} parts
   * @param {import("./api.js").Api} api
   * @param {(summary: object) => void} onOpen  a run was chosen
   */
  constructor(parts, api, onOpen) {
    this.parts = parts;
    this.api = api;
    this.onOpen = onOpen;
    this.next = null;
    this.current = null; // the id of the run on show
    this.loading = null;
    parts.more.addEventListener("click", () => this.loadMore());
    parts.refresh.addEventListener("click", () => this.reload());
  }

  /** The first page again (after a run, a reload, a new token). */
  async reload() {
    await this.load(null);
  }

  async loadMore() {
    if (this.next) await this.load(this.next);
  }

  async load(cursor) {
    const mine = (this.loading = Symbol("load"));
    try {
      const page = await this.api.listRuns({ cursor, limit: PAGE });
      if (mine !== this.loading) return; // a newer load replaced this one
      const items = (page.runs || []).map((summary) => this.item(summary));
      // A keyboard user on an item keeps the focus on it when the list is read again.
      const focused = this.parts.list.contains(document.activeElement) ? document.activeElement.dataset.runId : null;
      if (cursor) this.parts.list.append(...items);
      else this.parts.list.replaceChildren(...items);
      if (focused) this.parts.list.querySelector(`[data-run-id="${CSS.escape(focused)}"]`)?.focus();
      this.next = page.next || null;
      this.parts.more.hidden = !this.next;
      this.say(this.parts.list.children.length ? "" : "No runs yet: the runs you start appear here.");
    } catch (err) {
      if (mine !== this.loading) return;
      this.say(err.status === 401 ? "Enter your token to see your runs." : `The history could not be read: ${err.message}`);
    }
  }

  say(text) {
    this.parts.message.textContent = text;
    this.parts.message.hidden = !text;
  }

  item(summary) {
    const status = String(summary.status || "");
    const kind = summary.kind === "notebook" ? "notebook" : String(summary.language || "");
    const firstLine = summary.first_line || (summary.kind === "notebook" ? "(notebook)" : "(no code)");
    const when = formatWhen(summary.created_at || summary.started_at);
    const button = el(
      "button",
      { type: "button", class: "history-item", "aria-current": summary.id === this.current ? "true" : null },
      el("span", { class: "history-status", dataset: { status }, "aria-hidden": "true" }),
      el("span", { class: "history-code" }, firstLine),
      el("span", { class: "history-meta" }, [kind, status.replace("_", " "), when].filter(Boolean).join(" · ")),
    );
    button.dataset.runId = summary.id; // its name is its text: the code's first line, then kind, status, time
    button.addEventListener("click", () => this.onOpen(summary));
    return el("li", {}, button);
  }

  /** Mark the run on show (aria-current), e.g. after it was opened or has just run. */
  mark(id) {
    this.current = id;
    for (const button of this.parts.list.querySelectorAll(".history-item")) {
      if (button.dataset.runId === id) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
    }
  }
}
