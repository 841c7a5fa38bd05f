// Bundle the page: gateway/static/src (ES modules and CSS) and the npm packages of
// package-lock.json -> gateway/static/dist, with esbuild. Run it through scripts/page.sh.
//
//   node scripts/page-bundle.mjs           rebuild gateway/static/dist (old files removed)
//   node scripts/page-bundle.mjs --check   rebuild in a temporary folder and exit 1 when it
//                                          differs from gateway/static/dist by one byte
//
// The output is deterministic (esbuild is, for one esbuild version and the same inputs), so
// the committed bundle can be checked against its sources and the lockfile. dist/manifest.json
// names the hashed files for the gateway (gateway/handlers/page.py), the hash of the sandboxed
// frames' one inline style for the Content-Security-Policy, and a hash of every input, which
// tests/test_page_bundle.py recomputes without Node.
import { createHash } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join, relative, sep } from "node:path";
import { fileURLToPath } from "node:url";
import * as esbuild from "esbuild";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..");
const SOURCES = "gateway/static/src";
const DIST = "gateway/static/dist";
// Everything the bundle is made from, besides the sources: a change to any of these without a
// rebuild fails tests/test_page_bundle.py.
const INPUT_FILES = ["package-lock.json", "scripts/page-bundle.mjs"];

const sha256 = (data, encoding = "hex") => createHash("sha256").update(data).digest(encoding);

function walk(folder) {
  const found = [];
  for (const entry of readdirSync(join(ROOT, folder), { withFileTypes: true })) {
    const path = `${folder}/${entry.name}`;
    if (entry.isDirectory()) found.push(...walk(path));
    else found.push(path);
  }
  return found;
}

/** One hash over the inputs: "path\0sha256(content)\n" for each, sorted by path. */
function inputsHash() {
  const paths = [...INPUT_FILES, ...walk(SOURCES)].sort();
  const lines = paths.map((path) => `${path}\0${sha256(readFileSync(join(ROOT, path)))}\n`);
  return sha256(lines.join(""));
}

const COMMON = {
  absWorkingDir: ROOT,
  entryNames: "[name]-[hash]",
  assetNames: "[name]-[hash]",
  loader: { ".woff2": "file" },
  bundle: true,
  format: "esm",
  target: ["es2022"],
  minify: true,
  sourcemap: "linked",
  sourcesContent: true,
  legalComments: "eof",
  charset: "utf8",
  metafile: true,
  logLevel: "warning",
};

/** The names (relative to `outdir`) of a build's output files. */
function outputsOf(result, outdir) {
  return Object.keys(result.metafile.outputs).map((path) => relative(join(ROOT, outdir), join(ROOT, path)));
}

// KaTeX's style sheet names each font three times (woff2, woff, ttf); every browser the page
// supports reads woff2, so only those fonts are bundled (and served: font-src 'self').
const woff2Only = {
  name: "woff2-only",
  setup(build) {
    build.onLoad({ filter: /[\\/]katex[\\/]dist[\\/]katex\.css$/ }, (args) => ({
      contents: readFileSync(args.path, "utf8").replace(/,\s*url\([^)]*\.(?:woff|ttf)\)\s*format\("(?:woff|truetype)"\)/g, ""),
      loader: "css",
      resolveDir: dirname(args.path),
    }));
  },
};

async function bundle(outdir) {
  // 1. The npm packages, on their own (src/vendor.js re-exports what the page uses, and
  // imports KaTeX's style sheet: vendor-<hash>.css and its fonts).
  const vendor = await esbuild.build({
    ...COMMON,
    outdir,
    entryPoints: { vendor: `${SOURCES}/vendor.js` },
    plugins: [woff2Only],
  });
  const vendorScript = outputsOf(vendor, outdir).find((name) => name.endsWith(".js"));
  const vendorStyle = outputsOf(vendor, outdir).find((name) => name.endsWith(".css"));
  // 2. The page's own modules, importing the vendor bundle by its hashed name.
  const linkVendor = {
    name: "vendor",
    setup(build) {
      build.onResolve({ filter: /^\.\/vendor\.js$/ }, () => ({ path: `./${vendorScript}`, external: true }));
    },
  };
  const page = await esbuild.build({
    ...COMMON,
    outdir,
    entryPoints: { page: `${SOURCES}/main.js` },
    plugins: [linkVendor],
  });
  const outputs = [...outputsOf(vendor, outdir), ...outputsOf(page, outdir)];
  const frameStyle = readFileSync(join(ROOT, SOURCES, "frame.css"));
  const files = {};
  for (const name of outputs.sort()) files[name] = sha256(readFileSync(join(ROOT, outdir, name)));
  const manifest = {
    generated_by: "scripts/page.sh build: do not edit",
    script: outputsOf(page, outdir).find((name) => name.endsWith(".js")),
    style: outputsOf(page, outdir).find((name) => name.endsWith(".css")),
    vendor: vendorScript,
    vendor_style: vendorStyle,
    frame_style_sha256: sha256(frameStyle, "base64"),
    esbuild: esbuild.version,
    inputs_sha256: inputsHash(),
    files,
  };
  writeFileSync(join(ROOT, outdir, "manifest.json"), JSON.stringify(manifest, null, 2) + "\n");
}

function listing(folder) {
  const full = join(ROOT, folder);
  return readdirSync(full).sort().map((name) => [name, readFileSync(join(full, name))]);
}

async function check() {
  // The bundle's source maps name their sources relative to the output folder: build at the
  // same depth under the repository so that they come out the same.
  const outdir = `${DIST}.check-${process.pid}`;
  try {
    rmSync(join(ROOT, outdir), { recursive: true, force: true });
    mkdirSync(join(ROOT, outdir));
    await bundle(outdir);
    const built = new Map(listing(outdir));
    const committed = new Map(listing(DIST));
    const problems = [];
    for (const [name, data] of built) {
      if (!committed.has(name)) problems.push(`missing from ${DIST}: ${name}`);
      else if (!committed.get(name).equals(data)) problems.push(`differs: ${DIST}/${name}`);
    }
    for (const name of committed.keys()) {
      if (!built.has(name)) problems.push(`not built from the sources: ${DIST}/${name}`);
    }
    if (problems.length) {
      console.error(`page: ${DIST} is not what the sources and package-lock.json build:`);
      for (const problem of problems) console.error(`  ${problem}`);
      console.error("page: run scripts/page.sh build and commit gateway/static/dist");
      process.exitCode = 1;
    } else {
      console.log(`page: ${DIST} matches its sources and package-lock.json (esbuild ${esbuild.version})`);
    }
  } finally {
    rmSync(join(ROOT, outdir), { recursive: true, force: true });
  }
}

async function build() {
  rmSync(join(ROOT, DIST), { recursive: true, force: true });
  mkdirSync(join(ROOT, DIST));
  await bundle(DIST);
  const manifest = JSON.parse(readFileSync(join(ROOT, DIST, "manifest.json"), "utf8"));
  for (const [name] of listing(DIST)) {
    const size = readFileSync(join(ROOT, DIST, name)).length;
    console.log(`  ${DIST}${sep}${name}  ${(size / 1024).toFixed(1)} KiB`);
  }
  console.log(`page: built ${manifest.script}, ${manifest.style} and ${manifest.vendor}`);
}

const args = process.argv.slice(2);
if (args.length > 1 || (args.length === 1 && args[0] !== "--check")) {
  console.error("usage: node scripts/page-bundle.mjs [--check]");
  process.exit(2);
}
await (args[0] === "--check" ? check() : build());
