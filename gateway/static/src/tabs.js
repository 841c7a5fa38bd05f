// Tabs as WAI-ARIA's tabs pattern: one tab in the focus order, arrows (and Home, End) move
// between tabs and show each, Tab goes on into the panel.

export class Tabs {
  /**
   * @param {HTMLElement[]} tabs  role=tab buttons, in order; each `aria-controls` its panel
   * @param {Object<string, HTMLElement>} panels  by name: the name is the tab id after "tab-"
   */
  constructor(tabs, panels) {
    this.tabs = tabs;
    this.panels = panels;
    this.selected = null;
    for (const tab of tabs) {
      tab.addEventListener("click", () => this.select(nameOf(tab)));
      tab.addEventListener("keydown", (event) => this.key(event, tab));
    }
    this.select(nameOf(tabs[0]));
  }

  select(name, { focus = false } = {}) {
    this.selected = name;
    for (const tab of this.tabs) {
      const on = nameOf(tab) === name;
      tab.setAttribute("aria-selected", String(on));
      tab.tabIndex = on ? 0 : -1;
      this.panels[nameOf(tab)].hidden = !on;
      if (on && focus) tab.focus();
    }
  }

  key(event, tab) {
    const i = this.tabs.indexOf(tab);
    const last = this.tabs.length - 1;
    const to = { ArrowRight: i === last ? 0 : i + 1, ArrowLeft: i === 0 ? last : i - 1, Home: 0, End: last }[event.key];
    if (to === undefined) return;
    event.preventDefault();
    this.select(nameOf(this.tabs[to]), { focus: true });
  }
}

function nameOf(tab) {
  return tab.id.replace(/^tab-/, "");
}
