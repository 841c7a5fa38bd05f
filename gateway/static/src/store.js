// What the page keeps in this browser across reloads, in IndexedDB: the open notebook (its
// cells as edited, with the outputs they show) and the staged files (as Blobs, which IndexedDB
// stores as they are: no base64, no copy in memory). The code draft is small and kept in
// localStorage (code-panel.js). Without IndexedDB (refused, a private window's quota) the
// page works as before and keeps nothing.
//
// `document.body.dataset.kept` is "false" while something is still to be written and "true"
// once all of it is: what a test waits for before it reloads.

const NAME = "gateway-page";
const VERSION = 1;
export const NOTEBOOKS = "notebook"; // key "open": the open notebook
export const FILES = "files"; // one record per staged file, by its path
const DEBOUNCE_MS = 300;

function done(request) {
  return new Promise((resolve, reject) => {
    request.onsuccess = () => resolve(request.result);
    request.onerror = () => reject(request.error);
  });
}

export class Store {
  /** The page's database, or null when this browser keeps nothing for it. */
  static async open() {
    if (!globalThis.indexedDB) return null;
    try {
      const request = indexedDB.open(NAME, VERSION);
      request.onupgradeneeded = () => {
        const db = request.result;
        if (!db.objectStoreNames.contains(NOTEBOOKS)) db.createObjectStore(NOTEBOOKS);
        if (!db.objectStoreNames.contains(FILES)) db.createObjectStore(FILES, { keyPath: "path" });
      };
      return new Store(await done(request));
    } catch {
      return null;
    }
  }

  constructor(db) {
    this.db = db;
    this.writing = 0; // transactions not yet committed
    this.later = new Map(); // `${store}/${key}` -> [store, key, produce]: written after a pause
    this.timer = null;
    this.onError = () => {};
    this.settle();
  }

  settle() {
    document.body.dataset.kept = String(!this.writing && !this.later.size);
  }

  /** One read-write transaction on `store`; resolves once it committed. */
  write(store, work) {
    this.writing += 1;
    this.settle();
    return new Promise((resolve, reject) => {
      const tx = this.db.transaction(store, "readwrite");
      work(tx.objectStore(store));
      tx.oncomplete = () => resolve();
      tx.onabort = () => reject(tx.error || new Error("the transaction was aborted"));
    })
      .catch((err) => this.onError(err))
      .finally(() => {
        this.writing -= 1;
        this.settle();
      });
  }

  async get(store, key) {
    return done(this.db.transaction(store).objectStore(store).get(key));
  }

  async all(store) {
    return done(this.db.transaction(store).objectStore(store).getAll());
  }

  /** Put `value` (or delete the key, for null), now. */
  put(store, key, value) {
    return this.write(store, (s) => (value === null ? s.delete(key) : s.put(value, key ?? undefined)));
  }

  putAll(store, values) {
    return this.write(store, (s) => values.forEach((value) => s.put(value)));
  }

  delete(store, key) {
    this.later.delete(`${store}/${key}`);
    return this.write(store, (s) => s.delete(key));
  }

  clear(store) {
    return this.write(store, (s) => s.clear());
  }

  /**
   * Write `produce()` (null: delete) under `key` after a pause in the changes (typing), so
   * that a burst of edits is one write of their end state.
   */
  keepLater(store, key, produce) {
    this.later.set(`${store}/${key}`, [store, key, produce]);
    this.settle();
    clearTimeout(this.timer);
    this.timer = setTimeout(() => this.flush(), DEBOUNCE_MS);
  }

  /** Write what waits now (the page is going away, or a test wants it). */
  flush() {
    clearTimeout(this.timer);
    this.timer = null;
    const waiting = [...this.later.values()];
    this.later.clear();
    for (const [store, key, produce] of waiting) {
      let value;
      try {
        value = produce();
      } catch (err) {
        this.onError(err);
        continue;
      }
      this.put(store, key, value);
    }
    this.settle();
  }
}
