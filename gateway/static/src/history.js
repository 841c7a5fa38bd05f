// The side list of the caller's runs (`GET /v1/runs`, newest first, a page at a time): each a
// button that opens the run again. It is the gateway's list, so it survives a reload. Runs
// that continued one another (`continued_from`: a snapshot's id names the run that kept it)
// are one item, a chain, shown at its newest run and opened as one notebook. A notebook's
// replays (and a chain of them) are listed under the notebook's name (`name`, its first run's
// for a chain), a code run under its code's first line.
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
      const items = chains(page.runs || []).map((members) => this.item(members));
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

  /** An item for a run, or for a chain of runs (`members`, the oldest first). */
  item(members) {
    const summary = members.at(-1); // the newest: its status and time
    const root = members[0]; // the first: its name (or code) names the chain
    const status = String(summary.status || "");
    const kind = root.kind === "notebook" ? "notebook" : String(root.language || "");
    const title = itemTitle(root, summary);
    const when = formatWhen(summary.created_at || summary.started_at);
    const runs = members.length > 1 ? `${members.length} runs` : "";
    const button = el(
      "button",
      { type: "button", class: "history-item", "aria-current": summary.id === this.current ? "true" : null },
      el("span", { class: "history-status", dataset: { status }, "aria-hidden": "true" }),
      el("span", { class: "history-code" }, title),
      el("span", { class: "history-meta" }, [kind, runs, status.replace("_", " "), when].filter(Boolean).join(" · ")),
    );
    button.dataset.runId = summary.id; // its name is its text: the notebook's name or the code's first line, then kind, status, time
    button.dataset.runs = members.map((m) => m.id).join(" ");
    button.addEventListener("click", () => this.onOpen(summary, members));
    return el("li", {}, button);
  }

  /** Mark the run on show (aria-current), e.g. after it was opened or has just run. */
  mark(id) {
    this.current = id;
    for (const button of this.parts.list.querySelectorAll(".history-item")) {
      if (button.dataset.runs.split(" ").includes(id)) button.setAttribute("aria-current", "true");
      else button.removeAttribute("aria-current");
    }
  }
}

/** What an item is listed as: its notebook's name, else its code's first line. */
function itemTitle(root, newest = root) {
  if (root.kind === "notebook") return root.name || newest.name || root.first_line || "(notebook)";
  return root.first_line || "(no code)";
}

/** The run a snapshot id names (`snap_<hex of the run's id>_...`), or null. */
export function runOfSnapshot(snapshotId) {
  const found = /^snap_([0-9a-f]{20})_/.exec(String(snapshotId || ""));
  return found ? `run_${found[1]}` : null;
}

/**
 * The runs of a page as items, newest first: a run that continued another of the page joins
 * its chain (each chain's members oldest first), shown where its newest run is.
 */
function chains(runs) {
  const byId = new Map(runs.map((summary) => [summary.id, summary]));
  const rootOf = (summary) => {
    const seen = new Set();
    let at = summary;
    for (;;) {
      const parent = byId.get(runOfSnapshot(at.continued_from));
      if (!parent || seen.has(parent.id)) return at.id;
      seen.add(at.id);
      at = parent;
    }
  };
  const groups = new Map();
  for (const summary of runs) {
    const root = rootOf(summary);
    if (!groups.has(root)) groups.set(root, []);
    groups.get(root).push(summary);
  }
  return [...groups.values()].map((members) => members.reverse());
}
