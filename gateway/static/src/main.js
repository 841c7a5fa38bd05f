// The page: a code editor and a notebook front end over one WebSocket, the caller's history,
// the files a run needs, and a gallery of charts; the open notebook and the staged files kept
// in this browser across reloads. This module only wires the parts together; each part is a
// module of its own.
import "./page.css";
import { Api } from "./api.js";
import { CodePanel } from "./code-panel.js";
import { byId, el, saveBlob } from "./dom.js";
import { EnvironmentPanel } from "./environment.js";
import { FileStage, fromDrop, fromInput, sortPicked } from "./files.js";
import { formatBytes } from "./format.js";
import { Gallery } from "./gallery.js";
import { History } from "./history.js";
import { NotebookError, parseNotebook } from "./notebook-file.js";
import { KEPT } from "./notebook-edits.js";
import { NotebookPanel } from "./notebook-panel.js";
import { joinText } from "./render.js";
import { Announcer, BudgetStatus, GatewayStatus } from "./status.js";
import { NOTEBOOKS, Store } from "./store.js";
import { StreamClient } from "./stream.js";
import { Tabs } from "./tabs.js";

// --- the token ------------------------------------------------------------------------

const TOKEN_KEY = "gateway-token"; // this tab's session only
const needsToken = document.querySelector('meta[name="gateway-auth"]')?.content === "token";
const tokenInput = byId("token");
const token = () => (needsToken ? tokenInput.value.trim() : "");

const auth = {
  /** False (and says why) when this gateway wants a token and none was given. */
  ready() {
    if (!needsToken) return true;
    if (!token()) {
      app.showMessage("This gateway needs a token: paste it into the Token field.");
      tokenInput.focus();
      return false;
    }
    sessionStorage.setItem(TOKEN_KEY, token());
    return true;
  },
};

// --- the shared parts -----------------------------------------------------------------

const api = new Api(token);
const announcer = new Announcer(byId("announcer"));
const gatewayStatus = new GatewayStatus(byId("connection"), announcer); // health, and the socket's state
const budget = new BudgetStatus(byId("budget"), api); // what the user may still spend, if limited

function showConnection(state, detail) {
  gatewayStatus.socket(state);
  if (state === "error" && detail) app.showMessage(detail);
}
const gallery = new Gallery({
  section: byId("gallery"),
  list: byId("gallery-list"),
  dialog: byId("chart-dialog"),
  title: byId("chart-title"),
  figure: byId("chart-figure"),
  png: byId("chart-png"),
  svg: byId("chart-svg"),
  svgHint: byId("chart-svg-hint"),
  close: byId("chart-close"),
});
const files = new FileStage(renderFiles);
const history = new History(
  { list: byId("history-list"), more: byId("history-more"), message: byId("history-message"), refresh: byId("history-refresh") },
  api,
  (summary, members) => (members && members.length > 1 ? openChain(members) : openRun(summary)),
);

const app = {
  client: new StreamClient(token, showConnection),
  api,
  budget,
  auth,
  announcer,
  gallery,
  history,
  files,
  store: null, // the browser's store (store.js), once open
  onDownload: downloadRunNotebook,
  addFilesAgain: () => pickWith(byId("folder-input"), { stageOnly: true }),
  showMessage: (text) => (tabs.selected === "notebook" ? notebook : code).showMessage(text),
};

const code = new CodePanel(app);
const environment = new EnvironmentPanel(app);
const notebook = new NotebookPanel(app);
const tabs = new Tabs([byId("tab-code"), byId("tab-notebook")], { code: byId("code-view"), notebook: byId("notebook-view") });

// --- a run from the history -----------------------------------------------------------

/** Whether what is on show may be replaced by a run of `kind` from the history (asked). */
function mayOpen(kind) {
  if (code.busy || notebook.busy) {
    app.showMessage("Wait for the run in progress to end (or cancel it) before opening another.");
    return false;
  }
  if (kind === "notebook") return notebook.edits.mayReplace("Open the run from your history in its place?");
  return !code.unsaved || window.confirm("The editor has code you have not run. Replace it with the code of the run from your history? Your draft is lost.");
}

/** The files a run was given, for a run from nothing to get again: `{run, given}`, or null. */
function filesOf(record) {
  return record.files_given ? { run: record.id, given: record.files_given } : null;
}

async function openRun(summary) {
  if (!mayOpen(summary.kind === "notebook" ? "notebook" : "code")) return;
  try {
    const [record, nb] = await Promise.all([api.getRun(summary.id), api.getNotebook(summary.id).catch(() => null)]);
    history.mark(record.id);
    if (summary.kind === "notebook" && nb) {
      const name = record.name || summary.name || `${record.id}.ipynb`;
      notebook.open(nb, name, { executedBy: record, files: filesOf(record) });
      tabs.select("notebook");
    } else {
      const cell = nb?.cells?.find((c) => c.cell_type === "code");
      code.showFromHistory(record, cell ? joinText(cell.source) : null, record.language);
      tabs.select("code");
    }
    announcer.say(`Opened run ${record.id}: ${record.status.replace("_", " ")}.`);
  } catch (err) {
    app.showMessage(`The run could not be opened: ${err.message}`);
  }
}

/**
 * A chain of runs from the history (`members`, the oldest first) as one notebook: the first
 * run's, each later run's cells put in place of those of the same id (or added), and the
 * state each cell's last run kept, for its cells to go on from.
 */
async function openChain(members) {
  if (!mayOpen("notebook")) return;
  try {
    const loaded = await Promise.all(members.map(async (summary) => {
      const [record, nb] = await Promise.all([api.getRun(summary.id), api.getNotebook(summary.id)]);
      return { record, nb, replay: summary.kind === "notebook" };
    }));
    let composed = null;
    const states = new Map();
    for (const { record, nb, replay } of loaded) {
      if (!composed) {
        composed = { ...nb, cells: [...nb.cells] };
      } else {
        let first = composed.cells.length;
        for (const cell of nb.cells) {
          const at = cell.id ? composed.cells.findIndex((c) => c.id === cell.id) : -1;
          if (at >= 0) composed.cells[at] = cell;
          else if (cell.cell_type === "code") composed.cells.push(cell);
          first = Math.min(first, at >= 0 ? at : composed.cells.length - 1);
        }
        // the cells after the first this run ran hold states of the chain before it
        for (const cell of composed.cells.slice(first)) states.delete(cell.id);
      }
      // the states of the page's own runs (replays): a client's session keeps its own
      const kept = replay ? [...(record.snapshots || [])] : [];
      if (replay && !kept.length && record.snapshot) kept.push(record.snapshot);
      const ran = nb.cells.filter((c) => c.cell_type === "code" && c.execution_count !== null);
      for (const state of kept) {
        // a replay's final state (`keep: true`): after the last cell that ran
        const cell = state.cell === null ? ran.at(-1) : nb.cells[state.cell];
        if (cell?.id && !state.gone) states.set(cell.id, state.id);
      }
    }
    const last = loaded.at(-1).record;
    const first = loaded[0].record; // the run from nothing: its name, and the files it was given
    history.mark(last.id);
    const name = first.name || members[0].name || last.name || `${members[0].id}.ipynb`;
    notebook.open(composed, name, { executedBy: last, states, files: filesOf(first) });
    tabs.select("notebook");
    announcer.say(`Opened a chain of ${members.length} runs as one notebook: ${last.status.replace("_", " ")}.`);
  } catch (err) {
    app.showMessage(`The runs could not be opened: ${err.message}`);
  }
}

/** A run's notebook: a plain link without tokens, else fetched with the header. */
async function downloadRunNotebook(event, link) {
  if (!needsToken) return;
  event.preventDefault();
  const id = link.dataset.runId;
  try {
    saveBlob(await api.blob(`/v1/runs/${encodeURIComponent(id)}/notebook`), `${id}.ipynb`);
  } catch (err) {
    app.showMessage(`Download failed: ${err.message}`);
  }
}

// --- notebooks and files: picked or dropped -------------------------------------------

let choices = []; // the notebooks of the last pick or drop: [{path, file}]
const choice = byId("notebook-choice");

async function openNotebookFile(entry) {
  let nb;
  try {
    nb = parseNotebook(await entry.file.text());
  } catch (err) {
    tabs.select("notebook");
    notebook.showMessage(err instanceof NotebookError ? `${entry.path}: ${err.message}` : String(err));
    return;
  }
  if (notebook.open(nb, entry.path.split("/").pop())) tabs.select("notebook");
  else notebook.showMessage("Wait for the replay in progress to end (or cancel it) before opening another notebook.");
}

/**
 * What was picked or dropped: its files staged, its first notebook opened (unless only the
 * files are wanted again: `stageOnly`), when the open notebook may be replaced.
 */
async function picked(entries, { stageOnly = false } = {}) {
  const { notebooks, files: staged, skipped, folder } = sortPicked(entries);
  const opens = notebooks.length && !stageOnly;
  if (opens && !notebook.edits.mayReplace(`Open ${notebooks[0].path.split("/").pop()} in its place?`)) return;
  files.add(staged, skipped);
  if (opens) {
    choices = notebooks;
    choice.replaceChildren(...notebooks.map((nb, i) => el("option", { value: String(i) }, nb.path)));
    byId("notebook-choice-label").hidden = notebooks.length < 2;
    await openNotebookFile(notebooks[0]);
  }
  if (staged.length) {
    const where = folder ? ` from ${folder}/` : "";
    announcer.say(`Staged ${staged.length} file${staged.length === 1 ? "" : "s"}${where}.`);
  }
}

choice.addEventListener("change", () => {
  const entry = choices[Number(choice.value)];
  if (notebook.edits.mayReplace(`Open ${entry.path.split("/").pop()} in its place?`)) openNotebookFile(entry);
});

let pickOptions = {}; // how the file input's next pick is taken
function pickWith(input, options = {}) {
  pickOptions = options;
  input.value = "";
  input.click();
}

byId("open-notebook").addEventListener("click", () => pickWith(byId("notebook-input")));
byId("add-files").addEventListener("click", () => pickWith(byId("files-input")));
byId("add-folder").addEventListener("click", () => pickWith(byId("folder-input")));
byId("clear-files").addEventListener("click", () => files.clear());
for (const id of ["notebook-input", "files-input", "folder-input"]) {
  const input = byId(id);
  input.addEventListener("change", () => picked(fromInput(input.files), pickOptions));
}

function renderFiles() {
  const list = byId("file-list");
  list.replaceChildren(
    ...files.list().map(([path, file]) => {
      const remove = el("button", { type: "button", class: "small remove", "aria-label": `Remove ${path}` }, "×");
      remove.addEventListener("click", () => files.remove(path));
      return el("li", {}, el("span", { class: "file-path" }, path), el("span", { class: "meta" }, formatBytes(file.size)), remove);
    }),
  );
  const count = files.files.size;
  const skipped = files.skipped;
  byId("clear-files").disabled = !count;
  byId("files-summary").textContent = [
    count ? `${count} file${count === 1 ? "" : "s"}, ${formatBytes(files.size)}.` : "No files: runs start in an empty folder.",
    skipped.length ? `Left out: ${skipped.slice(0, 5).join(", ")}${skipped.length > 5 ? ` and ${skipped.length - 5} more` : ""}.` : "",
  ].filter(Boolean).join(" ");
}

// Drop anywhere on the page.
const overlay = byId("drop-overlay");
const carriesFiles = (event) => [...(event.dataTransfer?.types || [])].includes("Files");
document.addEventListener("dragover", (event) => {
  if (!carriesFiles(event)) return;
  event.preventDefault();
  event.dataTransfer.dropEffect = "copy";
  overlay.hidden = false;
});
document.addEventListener("dragleave", (event) => {
  if (event.relatedTarget === null) overlay.hidden = true;
});
document.addEventListener("drop", async (event) => {
  overlay.hidden = true;
  if (!carriesFiles(event)) return;
  event.preventDefault();
  picked(await fromDrop(event.dataTransfer));
});

// --- keys, token, start ---------------------------------------------------------------

document.addEventListener("keydown", (event) => {
  // Ctrl+Enter outside an editor runs what is on show (inside one, the editor's own key does).
  if (event.key !== "Enter" || !(event.ctrlKey || event.metaKey) || event.defaultPrevented) return;
  if (event.target.closest?.(".cm-editor")) return;
  event.preventDefault();
  if (tabs.selected === "notebook") notebook.runAll();
  else code.run();
});

if (needsToken) {
  byId("token-row").hidden = false;
  tokenInput.value = sessionStorage.getItem(TOKEN_KEY) || "";
  tokenInput.addEventListener("change", () => {
    sessionStorage.setItem(TOKEN_KEY, token());
    history.reload();
    environment.load();
  });
}
/** What this browser kept before a reload: the staged files, the open notebook. */
async function restore() {
  const store = await Store.open();
  if (!store) return;
  store.onError = (err) => announcer.say(`This browser could not keep the notebook or the files: ${err?.message || err}.`);
  app.store = store;
  files.store = store;
  addEventListener("pagehide", () => store.flush());
  await files.restore();
  try {
    if (notebook.restore(await store.get(NOTEBOOKS, KEPT))) tabs.select("notebook");
  } catch (err) {
    notebook.showMessage(`The notebook kept in this browser could not be opened again: ${err.message}`);
  }
}

renderFiles();
gatewayStatus.start();
budget.refresh();
history.reload();
environment.load();
restore().finally(() => {
  document.body.dataset.ready = "true";
});
