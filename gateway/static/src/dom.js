// Small DOM helpers. Text always goes in as text (textContent), never as HTML.

/** `document.getElementById`, failing loudly when the page lacks the element. */
export function byId(id) {
  const node = document.getElementById(id);
  if (!node) throw new Error(`The page has no #${id}.`);
  return node;
}

/**
 * The elements of these ids, by name: a name in camelCase stands for its id in kebab-case, after
 * `prefix`: `byIds(["run", "runTitle"], "nb-")` is `{run: byId("nb-run"), runTitle: byId("nb-run-title")}`.
 */
export function byIds(names, prefix = "") {
  const id = (name) => prefix + name.replace(/[A-Z]/g, (upper) => `-${upper.toLowerCase()}`);
  return Object.fromEntries(names.map((name) => [name, byId(id(name))]));
}

/**
 * An element: `el("button", {class: "primary", type: "button"}, "Run")`. Attributes are set
 * with setAttribute (never `style` or `on*`: the CSP refuses them and we need neither);
 * children are nodes or strings (as text).
 */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

/** Save a Blob under a file name (an `<a download>` on an object URL). */
export function saveBlob(blob, name) {
  const url = URL.createObjectURL(blob);
  const link = el("a", { href: url, download: name, hidden: true });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30_000);
}
