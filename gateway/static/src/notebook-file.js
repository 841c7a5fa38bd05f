// An .ipynb as the page reads and sends it: parsed and checked for the shape we rely on
// (nbformat 4), its language, and its cells given ids so that replay events find their cell.

export class NotebookError extends Error {}

const CELL_TYPES = new Set(["code", "markdown", "raw"]);

/** Parse an .ipynb's text; throws NotebookError with a sentence a person can act on. */
export function parseNotebook(text) {
  let nb;
  try {
    nb = JSON.parse(text);
  } catch (err) {
    throw new NotebookError(`This is not a notebook: it is not JSON (${err.message}).`);
  }
  if (!nb || typeof nb !== "object" || Array.isArray(nb)) {
    throw new NotebookError("This is not a notebook: a notebook is a JSON object.");
  }
  if (nb.nbformat !== 4) {
    const version = nb.nbformat === undefined ? "no nbformat version" : `nbformat ${nb.nbformat}`;
    throw new NotebookError(
      `This notebook has ${version}; the gateway replays nbformat 4 (open it in Jupyter and save it again).`,
    );
  }
  if (!Array.isArray(nb.cells)) throw new NotebookError("This notebook has no list of cells.");
  nb.cells.forEach((cell, i) => {
    if (!cell || typeof cell !== "object" || !CELL_TYPES.has(cell.cell_type)) {
      throw new NotebookError(`Cell ${i + 1} is not a code, markdown or raw cell.`);
    }
  });
  if (!nb.metadata || typeof nb.metadata !== "object") nb.metadata = {};
  giveIds(nb);
  return nb;
}

/**
 * Cells of notebooks older than nbformat 4.5 have no ids: give them ids (as nbformat does when
 * it upgrades a notebook), so that every `cell_started` names its cell.
 */
export function giveIds(nb) {
  if (nb.cells.every((cell) => typeof cell.id === "string" && cell.id)) return;
  const taken = new Set(nb.cells.map((cell) => cell.id));
  for (const cell of nb.cells) {
    if (typeof cell.id === "string" && cell.id) continue;
    cell.id = newCellId(taken);
    taken.add(cell.id);
  }
  if ((nb.nbformat_minor ?? 0) < 5) nb.nbformat_minor = 5;
}

/** A cell id none of `taken` has (16 hex digits, as nbformat's are random). */
export function newCellId(taken) {
  let id;
  do {
    id = crypto.getRandomValues(new Uint32Array(2)).reduce((s, n) => s + n.toString(16).padStart(8, "0"), "");
  } while (taken.has(id));
  return id;
}

/** The gateway language a notebook's kernel speaks (python when it does not say). */
export function notebookLanguage(nb) {
  const meta = nb.metadata || {};
  const said = [meta.kernelspec?.language, meta.language_info?.name, meta.kernelspec?.name]
    .filter((value) => typeof value === "string")
    .map((value) => value.toLowerCase());
  for (const value of said) {
    if (value.startsWith("python")) return "python";
    if (value === "bash" || value === "sh" || value === "shell") return "bash";
    if (value === "typescript" || value === "deno") return "typescript";
    if (value === "javascript") return "javascript";
  }
  return "python";
}

/** The name a replay is sent with (`name`: at most 255 characters, no "/"), or null. */
export function sendableName(name) {
  return typeof name === "string" && name && name.length <= 255 && !name.includes("/") ? name : null;
}

/** A file name for the executed copy: `analysis.ipynb` -> `analysis.executed.ipynb`. */
export function executedName(name) {
  const base = (name || "notebook.ipynb").replace(/\.ipynb$/i, "");
  return `${base}.executed.ipynb`;
}
