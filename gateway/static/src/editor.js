// The code editor: CodeMirror 6 with Python, JavaScript/TypeScript, shell and R modes, bracket
// matching and closing, indentation, search, completion, and Ctrl+Enter (Cmd+Enter) to run
// (a notebook's cell also Shift+Enter: run and go on to the next cell, as in JupyterLab).
// Under the page's CSP (no inline style), CodeMirror's one <style> element carries the nonce
// the gateway put in this page's policy and in <meta name="style-nonce">; its other inline
// styles are set through the CSSOM, which the CSP does not govern.
import {
  Compartment, EditorState, EditorView, Prec, StreamLanguage, autocompletion, bracketMatching,
  closeBrackets, closeBracketsKeymap, completionKeymap, defaultHighlightStyle, defaultKeymap,
  drawSelection, highlightActiveLine, highlightActiveLineGutter, highlightSelectionMatches,
  history, historyKeymap, indentOnInput, indentUnit, indentWithTab, javascript, keymap,
  lineNumbers, placeholder, python, r, search, searchKeymap, shell, syntaxHighlighting,
} from "./vendor.js";

const STYLE_NONCE = document.querySelector('meta[name="style-nonce"]')?.content || "";

/** The gateway's languages and how the editor reads each (indent unit, grammar). */
const LANGUAGES = {
  python: () => [python(), indentUnit.of("    ")],
  javascript: () => [javascript(), indentUnit.of("  ")],
  typescript: () => [javascript({ typescript: true }), indentUnit.of("  ")],
  bash: () => [StreamLanguage.define(shell), indentUnit.of("  ")],
  r: () => [StreamLanguage.define(r), indentUnit.of("  ")],
};

export const LANGUAGE_NAMES = Object.keys(LANGUAGES);
const PLAIN = () => []; // a notebook's markdown and raw cells: text, no grammar

const theme = EditorView.theme({
  "&": { fontSize: "13px", backgroundColor: "var(--code-bg)" },
  ".cm-content": { fontFamily: "var(--mono)", padding: "8px 0" },
  ".cm-gutters": { backgroundColor: "var(--code-bg)", borderRight: "1px solid var(--line)" },
  "&.cm-focused": { outline: "2px solid color-mix(in srgb, var(--accent) 45%, transparent)" },
  ".cm-scroller": { fontFamily: "var(--mono)", lineHeight: "1.5" },
  "&:not(.cm-focused) .cm-activeLine, &:not(.cm-focused) .cm-activeLineGutter": { backgroundColor: "transparent" },
});

/**
 * Escape, then Tab within two seconds, moves the focus on (no keyboard trap). CodeMirror does
 * this only when nothing else took the Escape (here it also when Escape drops a selection or
 * closes the completions, which it still does: this binding lets the key go on).
 */
function leaveWithTab(view) {
  view.setTabFocusMode(2000);
  return false;
}

/**
 * A CodeMirror editor in `parent`, for one of the gateway's languages (`language`; any other
 * name: plain text, as a notebook's markdown).
 * @param {HTMLElement} parent
 * @param {{doc?: string, language?: string, label: string, onRun?: () => void,
 *          onRunNext?: () => void, onChange?: (text: string) => void, lineNumbers?: boolean,
 *          minLines?: number}} options
 */
export function createEditor(parent, options) {
  const language = new Compartment();
  const label = new Compartment();
  const grammar = (name) => (LANGUAGES[name] || PLAIN)();
  const run = () => {
    options.onRun?.();
    return true; // a run key never falls through to the editor (no new line)
  };
  const runNext = () => {
    options.onRunNext?.();
    return true;
  };
  const runKeys = [{ key: "Mod-Enter", run }, { key: "Escape", run: leaveWithTab }];
  if (options.onRunNext) runKeys.push({ key: "Shift-Enter", run: runNext });
  const extensions = [
    options.lineNumbers === false ? [] : [lineNumbers(), highlightActiveLineGutter()],
    history(),
    drawSelection(),
    indentOnInput(),
    bracketMatching(),
    closeBrackets(),
    autocompletion(),
    highlightActiveLine(),
    highlightSelectionMatches(),
    search({ top: true }),
    syntaxHighlighting(defaultHighlightStyle, { fallback: true }),
    Prec.highest(keymap.of(runKeys)),
    keymap.of([
      ...closeBracketsKeymap,
      ...defaultKeymap,
      ...searchKeymap,
      ...historyKeymap,
      ...completionKeymap,
      indentWithTab, // Esc then Tab (or Ctrl+M) leaves the editor: no keyboard trap
    ]),
    language.of(grammar(options.language || "python")),
    label.of(EditorView.contentAttributes.of({ "aria-label": options.label })),
    EditorView.updateListener.of((update) => {
      if (update.docChanged) options.onChange?.(update.state.doc.toString());
    }),
    placeholder(options.placeholder || ""),
    EditorView.cspNonce.of(STYLE_NONCE),
    theme,
  ];
  const view = new EditorView({
    parent,
    state: EditorState.create({ doc: options.doc || "", extensions }),
  });
  return {
    view,
    get text() {
      return view.state.doc.toString();
    },
    set text(value) {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: value } });
    },
    setLanguage(name) {
      view.dispatch({ effects: language.reconfigure(grammar(name)) });
    },
    /** A new accessible name (a notebook cell's, once it has run). */
    setLabel(text) {
      view.dispatch({ effects: label.reconfigure(EditorView.contentAttributes.of({ "aria-label": text })) });
    },
    focus() {
      view.focus();
    },
    destroy() {
      view.destroy();
    },
  };
}
