// Every chart of the run or notebook on show, as a strip of thumbnails: click (or Enter) to
// enlarge it in a dialog, download it as PNG, or as SVG when the chart has a vector form.
import { el, saveBlob } from "./dom.js";
import { IMAGE_TYPES, image, joinText } from "./render.js";

/**
 * The charts among nbformat outputs (every image bundle, with all its forms), then those of
 * the run record's `charts` not already among them (a notebook's `savefig` images).
 * @returns {{images: Object<string,string>, title: string}[]}
 */
export function chartsOf(outputs = [], recordCharts = []) {
  const charts = [];
  for (const output of outputs) {
    if (output.output_type !== "display_data" && output.output_type !== "execute_result") continue;
    const chart = fromBundle(output.data, output.metadata);
    if (chart) charts.push(chart);
  }
  for (const chart of recordCharts || []) {
    const data = joinText(chart.data);
    if (charts.some((known) => known.images[chart.mime] === data)) continue;
    charts.push({ images: { [chart.mime]: data }, title: chart.spec?.title || chart.path || "" });
  }
  return charts;
}

export function fromBundle(data, metadata) {
  const images = {};
  for (const mime of IMAGE_TYPES) if (data?.[mime] !== undefined) images[mime] = joinText(data[mime]);
  if (!Object.keys(images).length) return null;
  // the gateway's note on a chart: its short `title` (older records: the spec's), or its file
  const meta = metadata?.gateway || {};
  return { images, title: meta.title || meta.spec?.title || meta.path || "" };
}

function base64Blob(b64, mime) {
  const bytes = Uint8Array.from(atob(b64.replace(/\s+/g, "")), (c) => c.charCodeAt(0));
  return new Blob([bytes], { type: mime });
}

/** Any image form drawn on a canvas, as a PNG Blob (twice the size, for a vector form). */
async function asPng(img, scale) {
  await img.decode();
  const width = img.naturalWidth || 800;
  const height = img.naturalHeight || 600;
  const canvas = el("canvas", { width: width * scale, height: height * scale });
  const context = canvas.getContext("2d");
  context.fillStyle = "#fff"; // a chart with a transparent background stays readable
  context.fillRect(0, 0, canvas.width, canvas.height);
  context.drawImage(img, 0, 0, canvas.width, canvas.height);
  return new Promise((resolve) => canvas.toBlob(resolve, "image/png"));
}

export class Gallery {
  /**
   * @param {{section: HTMLElement, list: HTMLElement, dialog: HTMLDialogElement,
   *          title: HTMLElement, figure: HTMLElement, png: HTMLButtonElement,
   *          svg: HTMLButtonElement, svgHint: HTMLElement, close: HTMLButtonElement}} parts
   */
  constructor(parts) {
    this.parts = parts;
    this.charts = [];
    this.open = null; // {chart, index, opener}
    this.name = "chart";
    parts.png.addEventListener("click", () => this.downloadPng());
    parts.svg.addEventListener("click", () => this.downloadSvg());
    parts.close.addEventListener("click", () => parts.dialog.close());
    parts.dialog.addEventListener("close", () => this.open?.opener?.focus());
    this.render();
  }

  /** Show these charts (and name their downloads after `name`). */
  show(charts, name = "chart") {
    this.charts = [...charts];
    this.name = name;
    this.render();
  }

  clear(name = "chart") {
    this.show([], name);
  }

  add(chart) {
    if (!chart) return;
    this.charts.push(chart);
    this.parts.list.append(this.thumbnail(chart, this.charts.length - 1));
    this.parts.section.dataset.count = String(this.charts.length);
  }

  render() {
    this.parts.list.replaceChildren(...this.charts.map((chart, i) => this.thumbnail(chart, i)));
    this.parts.section.dataset.count = String(this.charts.length);
  }

  label(chart, index) {
    return chart.title ? `Chart ${index + 1}: ${chart.title}` : `Chart ${index + 1}`;
  }

  thumbnail(chart, index) {
    const mime = IMAGE_TYPES.find((kind) => chart.images[kind] !== undefined);
    const img = image(mime, chart.images[mime]);
    img.className = "thumb-image";
    img.alt = "";
    const button = el("button", { type: "button", class: "thumb", "aria-label": `Enlarge ${this.label(chart, index)}` }, img);
    button.addEventListener("click", () => this.enlarge(index, button));
    return el("li", {}, button);
  }

  enlarge(index, opener) {
    const chart = this.charts[index];
    const { dialog, title, figure, svg, svgHint } = this.parts;
    this.open = { chart, index, opener };
    title.textContent = this.label(chart, index);
    const mime = IMAGE_TYPES.find((kind) => chart.images[kind] !== undefined);
    const img = image(mime, chart.images[mime]);
    img.className = "chart-large";
    img.alt = this.label(chart, index);
    figure.replaceChildren(img);
    const vector = chart.images["image/svg+xml"] !== undefined;
    svg.hidden = !vector;
    svgHint.hidden = vector;
    dialog.showModal();
  }

  fileName(extension) {
    return `${this.name}-chart-${this.open.index + 1}.${extension}`;
  }

  async downloadPng() {
    const { images } = this.open.chart;
    if (images["image/png"] !== undefined) {
      saveBlob(base64Blob(images["image/png"], "image/png"), this.fileName("png"));
      return;
    }
    const mime = IMAGE_TYPES.find((kind) => images[kind] !== undefined);
    const scale = mime === "image/svg+xml" ? 2 : 1;
    saveBlob(await asPng(image(mime, images[mime]), scale), this.fileName("png"));
  }

  downloadSvg() {
    const svg = this.open.chart.images["image/svg+xml"];
    if (svg !== undefined) saveBlob(new Blob([svg], { type: "image/svg+xml" }), this.fileName("svg"));
  }
}
