// The files a run or a notebook needs (a notebook that reads `data/x.csv`): picked as files or
// a folder, or dropped, kept with their relative paths, and sent as the request's `files`
// (base64, so that any file goes through unchanged); kept in this browser across reloads.
import { FILES } from "./store.js";

const HIDDEN = /(^|\/)\./; // .git, .ipynb_checkpoints, .DS_Store: not the notebook's data

/** A path as the gateway takes it: relative, `/`-separated, no `..`, no empty parts. */
export function cleanPath(path) {
  const parts = String(path).replaceAll("\\", "/").split("/").filter((part) => part && part !== ".");
  if (parts.some((part) => part === "..")) return null;
  return parts.join("/");
}

/** Files from an `<input type=file>` (with `webkitdirectory`, their paths in the folder). */
export function fromInput(fileList) {
  return [...fileList].map((file) => ({ path: file.webkitRelativePath || file.name, file }));
}

/** Files from a drop: folders are walked (FileSystemEntry), paths kept from the dropped item. */
export async function fromDrop(dataTransfer) {
  const found = [];
  const items = [...(dataTransfer.items || [])].filter((item) => item.kind === "file");
  const entries = items.map((item) => [item.webkitGetAsEntry?.(), item.getAsFile()]);
  for (const [entry, file] of entries) {
    if (entry) await walkEntry(entry, found);
    else if (file) found.push({ path: file.name, file });
  }
  if (!items.length) for (const file of dataTransfer.files || []) found.push({ path: file.name, file });
  return found;
}

async function walkEntry(entry, found) {
  const path = entry.fullPath.replace(/^\//, "");
  if (entry.isFile) {
    found.push({ path, file: await new Promise((resolve, reject) => entry.file(resolve, reject)) });
    return;
  }
  if (HIDDEN.test(path)) return; // not worth reading a .git folder to drop it
  const reader = entry.createReader();
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) break;
    for (const child of batch) await walkEntry(child, found);
  }
}

/**
 * Split what was picked or dropped into notebooks (to open) and the files to stage. When a
 * notebook is among them, paths are made relative to its folder (the folder a notebook runs
 * in), and what lies outside that folder is left out; else paths are kept as picked (a folder
 * `data` gives `data/x.csv`).
 * @returns {{notebooks: {path, file}[], files: {path, file}[], skipped: string[]}}
 */
export function sortPicked(picked, { base = null } = {}) {
  const cleaned = picked
    .map(({ path, file }) => ({ path: cleanPath(path), file }))
    .filter(({ path }) => path);
  const notebooks = cleaned
    .filter(({ path }) => /\.ipynb$/i.test(path) && !HIDDEN.test(path)) // not .ipynb_checkpoints
    .sort((a, b) => (a.path < b.path ? -1 : 1));
  const folder = base ?? (notebooks.length ? dirname(notebooks[0].path) : "");
  const files = [];
  const skipped = [];
  for (const { path, file } of cleaned) {
    if (HIDDEN.test(path)) {
      skipped.push(`${path} (hidden)`);
      continue;
    }
    if (/\.ipynb$/i.test(path)) continue; // a notebook is opened, not staged
    if (folder && !path.startsWith(`${folder}/`)) {
      skipped.push(`${path} (outside the notebook's folder)`);
      continue;
    }
    files.push({ path: folder ? path.slice(folder.length + 1) : path, file });
  }
  return { notebooks, files, skipped, folder };
}

function dirname(path) {
  const cut = path.lastIndexOf("/");
  return cut < 0 ? "" : path.slice(0, cut);
}

function base64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ""));
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

/**
 * The staged files: what the next run or replay gets in its working folder. With a Store they
 * are kept in this browser (IndexedDB, the Blobs themselves) until removed or cleared, so that
 * they survive a reload. Once a run has had the gateway keep them (`keep_files`), later runs
 * name that run (`files_from`) instead of sending them again, until they change: the gateway
 * then keeps one copy of them, not one per run.
 */
export class FileStage {
  constructor(onChange, store = null) {
    this.files = new Map(); // path -> File (or Blob, when read back from the store)
    this.skipped = []; // what the last pick or drop left out, and why
    this.onChange = onChange;
    this.store = store;
    this.version = 0; // counts the changes of what is staged
    this.kept = null; // {version, run}: a run the gateway keeps exactly these files for
  }

  changed() {
    this.version += 1;
    this.onChange();
  }

  /** `run` was given the files staged at `version`, and the gateway keeps them. */
  keptBy(version, run) {
    if (version === this.version) this.kept = { version, run };
  }

  /** The run whose kept files are the staged ones (to name as `files_from`), or null. */
  get keptRun() {
    return this.kept?.version === this.version && this.files.size ? this.kept.run : null;
  }

  /** `run`'s kept files went: the files are sent again. */
  notKeptBy(run) {
    if (this.kept?.run === run) this.kept = null;
  }

  /** The files kept in this browser before a reload. */
  async restore() {
    if (!this.store) return;
    try {
      for (const { path, file } of await this.store.all(FILES)) this.files.set(path, file);
    } catch {
      return; // unreadable: nothing staged
    }
    this.changed();
  }

  add(files, skipped = []) {
    for (const { path, file } of files) this.files.set(path, file);
    this.skipped = skipped;
    this.store?.putAll(FILES, files.map(({ path, file }) => ({ path, file })));
    if (files.length) this.changed();
    else this.onChange();
  }

  remove(path) {
    this.files.delete(path);
    this.store?.delete(FILES, path);
    this.changed();
  }

  clear() {
    this.files.clear();
    this.skipped = [];
    this.store?.clear(FILES);
    this.changed();
  }

  get size() {
    let total = 0;
    for (const file of this.files.values()) total += file.size;
    return total;
  }

  list() {
    return [...this.files.entries()].sort(([a], [b]) => (a < b ? -1 : 1));
  }

  /** The request's `files`: `[{path, content, encoding: "base64"}]`. */
  async payload() {
    return Promise.all(
      this.list().map(async ([path, file]) => ({ path, content: await base64(file), encoding: "base64" })),
    );
  }
}
