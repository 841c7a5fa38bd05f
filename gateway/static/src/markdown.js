// Markdown (notebook markdown cells, text/markdown outputs) into the page's own DOM: parsed by
// `marked`, then cleaned by DOMPurify, because a notebook is untrusted and this HTML, unlike an
// HTML output, is not put in a sandboxed iframe. Layers: DOMPurify keeps only inert HTML (no
// scripts, no event handlers, no javascript: links, no forms, no styles, ids or classes with
// which to dress up as the page); the CSP (script-src 'self', no inline style) refuses what
// might slip through. LaTeX math is kept away from markdown and DOMPurify as an empty
// placeholder, and typeset by KaTeX into the cleaned fragment (math.js).
import { MATH_EXTENSIONS, takeMath, typesetPlaceholders } from "./math.js";
import { DOMPurify, Marked } from "./vendor.js";

const marked = new Marked({ gfm: true, breaks: false, extensions: MATH_EXTENSIONS });
const purify = DOMPurify(window); // an instance of our own: its hooks are ours alone

const CONFIG = {
  USE_PROFILES: { html: true }, // no SVG, no MathML
  FORBID_TAGS: [
    "style", "link", "meta", "base", "form", "input", "button", "textarea", "select",
    "option", "iframe", "frame", "frameset", "object", "embed", "dialog", "template", "audio",
    "video", "source", "track", "picture",
  ],
  FORBID_ATTR: ["style", "id", "name", "class", "srcset", "target", "ping", "formaction", "action"],
  // math.js's placeholders: a number, read as one and removed from every element after this
  // (one the author wrote only typesets this cell's own math again, or nothing)
  ADD_ATTR: ["data-math"],
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};

const IMAGE_DATA = /^data:image\/(png|jpeg|gif|webp|svg\+xml)[;,]/i;

let attachments = {}; // the cell's attachments, while one cell is being cleaned

// `![alt](attachment:name.png)`: the image is the cell's own, carried in the notebook.
purify.addHook("uponSanitizeAttribute", (node, data) => {
  if (node.nodeName !== "IMG" || data.attrName !== "src") return;
  const match = /^attachment:(.+)$/.exec(data.attrValue.trim());
  if (!match) return;
  const bundle = attachments[decodeURIComponent(match[1])] || {};
  const mime = Object.keys(bundle).find((kind) => /^image\/(png|jpeg|gif|webp)$/.test(kind));
  data.attrValue = mime ? `data:${mime};base64,${String(bundle[mime]).replace(/\s+/g, "")}` : "";
});

purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A" && node.hasAttribute("href")) {
    // Links leave the page (a new tab that cannot reach back to it).
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

function joinText(value) {
  return Array.isArray(value) ? value.join("") : String(value ?? "");
}

/** Markdown text (a string or nbformat's list of lines) as a cleaned DocumentFragment. */
export function renderMarkdown(source, cellAttachments = {}) {
  let math;
  let html;
  try {
    html = marked.parse(joinText(source), { async: false });
  } finally {
    math = takeMath();
  }
  attachments = cellAttachments && typeof cellAttachments === "object" ? cellAttachments : {};
  let fragment;
  try {
    fragment = purify.sanitize(html, CONFIG);
  } finally {
    attachments = {};
  }
  // Only images the notebook carries: the page loads nothing from elsewhere (the CSP would
  // refuse it, and a remote image tells its server who opened the notebook).
  for (const img of fragment.querySelectorAll("img")) {
    if (IMAGE_DATA.test(img.getAttribute("src") || "")) continue;
    const alt = img.getAttribute("alt") || "";
    img.replaceWith(document.createTextNode(alt ? `[image: ${alt}]` : "[image]"));
  }
  typesetPlaceholders(fragment, math);
  return fragment;
}
