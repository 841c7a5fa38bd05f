// Every npm package the page uses, and only what it uses: bundled on its own into
// dist/vendor-<hash>.js, which changes only when package-lock.json (or this list) does, so
// that a change to the page's own modules rebuilds only the small dist/page-<hash>.js.
// The page's modules import these names from "./vendor.js". KaTeX's style sheet (and, through
// it, its fonts) comes with it: dist/vendor-<hash>.css.
import "katex/dist/katex.css";

export {
  autocompletion, closeBrackets, closeBracketsKeymap, completionKeymap,
} from "@codemirror/autocomplete";
export { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
export { javascript } from "@codemirror/lang-javascript";
export { python } from "@codemirror/lang-python";
export {
  StreamLanguage, bracketMatching, defaultHighlightStyle, indentOnInput, indentUnit,
  syntaxHighlighting,
} from "@codemirror/language";
export { r } from "@codemirror/legacy-modes/mode/r";
export { shell } from "@codemirror/legacy-modes/mode/shell";
export { highlightSelectionMatches, search, searchKeymap } from "@codemirror/search";
export { Compartment, EditorState, Prec } from "@codemirror/state";
export {
  EditorView, drawSelection, highlightActiveLine, highlightActiveLineGutter, keymap,
  lineNumbers, placeholder,
} from "@codemirror/view";
export { default as DOMPurify } from "dompurify";
export { render as renderTex } from "katex";
export { Marked } from "marked";
