// What the kernels have (GET /v1/environment): each language's version in the picker (a
// language the kernels lack cannot be picked), and every language's installed packages,
// filterable. Runs have no network, so this is what code can use. The page works without
// it: a gateway that cannot tell leaves the picker as it is.
import { byId, el } from "./dom.js";

const LABELS = {
  python: "Python", bash: "Bash", javascript: "JavaScript", typescript: "TypeScript", r: "R",
};

export class EnvironmentPanel {
  /** @param {{api}} app  the page's shared parts (main.js) */
  constructor(app) {
    this.app = app;
    this.ui = {
      panel: byId("environment"),
      summary: byId("environment-summary"),
      languages: byId("environment-languages"),
      filter: byId("package-filter"),
      picker: byId("language"),
    };
    this.ui.filter.addEventListener("input", () => this.filter());
  }

  /** Ask the gateway (again: the token may have changed); never throws. */
  async load() {
    try {
      this.show(await this.app.api.json("/v1/environment"));
    } catch {
      // not told (no token yet, an older gateway): the picker stays as it is
    } finally {
      this.ui.panel.dataset.loaded = "true";
    }
  }

  show(env) {
    const known = env.source !== "unknown";
    const languages = env.languages || {};
    for (const option of this.ui.picker.options) {
      const entry = languages[option.value];
      const label = LABELS[option.value] || option.value;
      option.disabled = known && !entry;
      option.textContent = !entry
        ? `${label}${known ? " (not installed)" : ""}`
        : entry.version ? `${label} ${entry.version}` : label;
    }
    const names = Object.keys(languages);
    const where = [env.image || env.backend, env.profile].filter(Boolean).join(", ");
    this.ui.summary.textContent = known
      ? `(${where}: ${names.length} languages)`
      : "(the backend does not say)";
    this.ui.languages.replaceChildren(
      ...names.map((name) => {
        const entry = languages[name];
        const kernel = entry.kernel_version ? `${entry.kernel} ${entry.kernel_version}` : entry.kernel;
        const title = `${LABELS[name] || name} ${entry.version || ""} · ${kernel} · ${entry.packages.length} packages`;
        const items = entry.packages.map((pkg) =>
          el("li", { dataset: { name: pkg.name.toLowerCase() } }, `${pkg.name} ${pkg.version}`));
        return el(
          "div",
          { class: "env-language", dataset: { language: name } },
          el("h3", {}, title),
          el("ul", { class: "packages" }, items),
        );
      }),
    );
    this.filter();
  }

  filter() {
    const wanted = this.ui.filter.value.trim().toLowerCase();
    for (const item of this.ui.languages.querySelectorAll("li")) {
      item.hidden = Boolean(wanted) && !item.dataset.name.includes(wanted);
    }
  }
}
