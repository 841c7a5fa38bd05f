// The page: an editor, Run / Cancel, live outputs, status, and the run as a notebook.
import { OutputView } from "./render.js";
import { StreamClient } from "./stream.js";

const $ = (id) => document.getElementById(id);
const ui = {
  language: $("language"),
  timeout: $("timeout"),
  code: $("code"),
  run: $("run"),
  cancel: $("cancel"),
  tokenRow: $("token-row"),
  token: $("token"),
  connection: $("connection"),
  status: $("status"),
  exitCode: $("exit-code"),
  duration: $("duration"),
  download: $("download"),
  message: $("message"),
  outputs: $("outputs"),
  notes: $("notes"),
  environment: $("environment"),
  environmentSummary: $("environment-summary"),
  environmentLanguages: $("environment-languages"),
  packageFilter: $("package-filter"),
};

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

const needsToken = document.querySelector('meta[name="gateway-auth"]')?.content === "token";
const TOKEN_KEY = "gateway-token";

const view = new OutputView(ui.outputs);
const client = new StreamClient(() => (needsToken ? ui.token.value.trim() : ""), showConnection);

let current = null; // {ref, id, started, timer, dropped, cancelRequested}

// --- connection and messages ---------------------------------------------------------

function showConnection(state, detail) {
  const labels = {
    connecting: "connecting…",
    open: "connected",
    closed: "disconnected",
    failed: "connection refused",
    error: "error",
  };
  ui.connection.dataset.state = state;
  ui.connection.textContent = labels[state] || state;
  if (state === "error" && detail) showMessage(detail);
}

function showMessage(text) {
  ui.message.textContent = text;
  ui.message.hidden = !text;
}

// --- status --------------------------------------------------------------------------

function setStatus(status, { exitCode, ms } = {}) {
  ui.status.dataset.status = status;
  ui.status.textContent = status;
  ui.exitCode.textContent = exitCode === undefined || exitCode === null ? "" : `exit ${exitCode}`;
  ui.duration.textContent = ms === undefined || ms === null ? "" : formatDuration(ms);
}

function formatDuration(ms) {
  return ms < 1000 ? `${Math.round(ms)} ms` : `${(ms / 1000).toFixed(2)} s`;
}

function setBusy(busy) {
  ui.run.disabled = busy;
  ui.cancel.disabled = !busy;
  ui.language.disabled = busy;
}

function stopTimer() {
  if (current?.timer) clearInterval(current.timer);
}

// --- running -------------------------------------------------------------------------

async function run() {
  if (current) return;
  const code = ui.code.value;
  if (needsToken && !ui.token.value.trim()) {
    showMessage("This gateway needs a token: paste it into the Token field.");
    ui.token.focus();
    return;
  }
  if (needsToken) sessionStorage.setItem(TOKEN_KEY, ui.token.value.trim());
  showMessage("");
  view.clear();
  ui.notes.replaceChildren();
  ui.download.hidden = true;
  setStatus("starting");
  setBusy(true);
  const timeout = Number(ui.timeout.value) || 30;
  current = { ref: null, id: null, started: performance.now(), dropped: 0 };
  const mine = current;
  try {
    mine.ref = await client.run(
      { code, language: ui.language.value, timeout },
      {
        accepted: (event) => accepted(mine, event),
        output: (event) => mine === current && view.add(event.output, event.display_id, event.update),
        output_dropped: (event) => { mine.dropped += event.dropped; },
        done: (event) => done(mine, event.run),
        error: (event) => failed(mine, event.error?.message || "The run was refused."),
        onClosed: () => failed(mine, "The connection closed; the run was cancelled."),
      },
    );
  } catch (err) {
    failed(mine, err.message);
  }
}

function accepted(run, event) {
  run.id = event.id;
  setStatus("running");
  run.timer = setInterval(() => {
    ui.duration.textContent = formatDuration(performance.now() - run.started);
  }, 100);
  if (run.cancelRequested) client.cancel(run.id);
}

function done(run, record) {
  if (run !== current) return;
  stopTimer();
  // The live view equals the record unless live outputs were dropped or cut.
  if (run.dropped || record.output_truncated || record.stdout_truncated || record.stderr_truncated) {
    view.showAll(record.outputs);
  }
  setStatus(record.status, { exitCode: record.exit_code, ms: record.usage?.wall_ms });
  for (const note of record.notes || []) {
    const li = document.createElement("li");
    li.textContent = note;
    ui.notes.append(li);
  }
  ui.download.hidden = false;
  ui.download.href = `/v1/runs/${encodeURIComponent(record.id)}/notebook`;
  ui.download.download = `${record.id}.ipynb`;
  ui.download.dataset.runId = record.id;
  current = null;
  setBusy(false);
}

function failed(run, message) {
  if (run !== current) return;
  stopTimer();
  setStatus("error");
  showMessage(message);
  current = null;
  setBusy(false);
}

function cancel() {
  if (!current) return;
  current.cancelRequested = true;
  setStatus("cancelling");
  if (current.id) client.cancel(current.id);
}

// With a token the notebook must be fetched with the header, then saved from a blob.
async function download(event) {
  if (!needsToken) return; // a plain link works
  event.preventDefault();
  const id = ui.download.dataset.runId;
  const response = await fetch(`/v1/runs/${encodeURIComponent(id)}/notebook`, {
    headers: { Authorization: `Bearer ${ui.token.value.trim()}` },
  });
  if (!response.ok) {
    showMessage(`Download failed: HTTP ${response.status}`);
    return;
  }
  const url = URL.createObjectURL(await response.blob());
  const link = document.createElement("a");
  link.href = url;
  link.download = `${id}.ipynb`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10_000);
}

// --- what the kernels have (GET /v1/environment) ---------------------------------------

const LANGUAGE_LABELS = {
  python: "Python", bash: "Bash", javascript: "JavaScript", typescript: "TypeScript", r: "R",
};

async function loadEnvironment() {
  const token = ui.token.value.trim();
  if (needsToken && !token) return;
  let response;
  try {
    response = await fetch("/v1/environment", {
      headers: needsToken ? { Authorization: `Bearer ${token}` } : {},
    });
  } catch {
    return; // the page works without it
  }
  if (!response.ok) return;
  showEnvironment(await response.json());
}

function showEnvironment(env) {
  const known = env.source !== "unknown";
  for (const option of ui.language.options) {
    const entry = env.languages?.[option.value];
    const label = LANGUAGE_LABELS[option.value] || option.value;
    option.disabled = known && !entry;
    option.textContent = !entry
      ? `${label}${known ? " (not installed)" : ""}`
      : entry.version ? `${label} ${entry.version}` : label;
  }
  const names = Object.keys(env.languages || {});
  ui.environmentSummary.textContent = known
    ? `(${env.image || env.backend}${env.profile ? `, ${env.profile}` : ""}: ${names.length} languages)`
    : "(the backend does not say)";
  ui.environmentLanguages.replaceChildren();
  for (const name of names) {
    const entry = env.languages[name];
    const block = document.createElement("div");
    block.className = "env-language";
    block.dataset.language = name;
    const title = document.createElement("h3");
    const kernel = entry.kernel_version ? `${entry.kernel} ${entry.kernel_version}` : entry.kernel;
    title.textContent = `${LANGUAGE_LABELS[name] || name} ${entry.version || ""} · ${kernel} · ${entry.packages.length} packages`;
    const list = document.createElement("ul");
    list.className = "packages";
    for (const pkg of entry.packages) {
      const item = document.createElement("li");
      item.textContent = `${pkg.name} ${pkg.version}`;
      item.dataset.name = pkg.name.toLowerCase();
      list.append(item);
    }
    block.append(title, list);
    ui.environmentLanguages.append(block);
  }
  filterPackages();
}

function filterPackages() {
  const wanted = ui.packageFilter.value.trim().toLowerCase();
  for (const item of ui.environmentLanguages.querySelectorAll("li")) {
    item.hidden = Boolean(wanted) && !item.dataset.name.includes(wanted);
  }
}

// --- editor comfort ------------------------------------------------------------------

let tabLeaves = false;

function insert(text) {
  // execCommand keeps the browser's undo history; setRangeText is the fallback.
  if (!document.execCommand("insertText", false, text)) {
    ui.code.setRangeText(text, ui.code.selectionStart, ui.code.selectionEnd, "end");
  }
}

ui.code.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    event.preventDefault();
    run();
  } else if (event.key === "Escape") {
    tabLeaves = true;
  } else if (event.key === "Tab" && !tabLeaves && !event.shiftKey) {
    event.preventDefault();
    insert(ui.language.value === "python" || ui.language.value === "r" ? "    " : "  ");
  } else if (event.key === "Enter" && !event.shiftKey) {
    // keep the indentation of the current line
    const before = ui.code.value.slice(0, ui.code.selectionStart);
    const line = before.slice(before.lastIndexOf("\n") + 1);
    const opens = ui.language.value === "python" && /:\s*$/.test(line);
    const indent = line.match(/^[ \t]*/)[0] + (opens ? "    " : "");
    if (indent) {
      event.preventDefault();
      insert("\n" + indent);
    }
  }
});
ui.code.addEventListener("blur", () => { tabLeaves = false; });
ui.code.addEventListener("focus", () => { tabLeaves = false; });

ui.language.addEventListener("change", () => {
  // a sample (of any language) is replaced by the new language's; the user's code is kept
  const isSample = Object.values(SAMPLES).includes(ui.code.value);
  if (!ui.code.value.trim() || isSample) ui.code.value = SAMPLES[ui.language.value];
});

ui.packageFilter.addEventListener("input", filterPackages);
ui.token.addEventListener("change", loadEnvironment);
ui.run.addEventListener("click", run);
ui.cancel.addEventListener("click", cancel);
ui.download.addEventListener("click", download);
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && event.target !== ui.code) {
    event.preventDefault();
    run();
  }
});

// --- start ---------------------------------------------------------------------------

ui.code.value = SAMPLES.python;
if (needsToken) {
  ui.tokenRow.hidden = false;
  ui.token.value = sessionStorage.getItem(TOKEN_KEY) || "";
}
setStatus("idle");
loadEnvironment().finally(() => { ui.environment.dataset.loaded = "true"; });
document.body.dataset.ready = "true";
