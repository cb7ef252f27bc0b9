// Builds the browser pages' scripts and style from web/src into server/web/static (or the
// folder given with --outdir), with the npm packages of package-lock.json. `make assets` runs
// it after `npm ci`; `make assets-check` builds into a temporary folder and compares.
//
// Output: one file per entry, named with a hash of its content (so the server may let
// browsers keep them for good), chunks that pages load only when needed, assets.json (entry ->
// file, read by server/api/web.py) and LICENSES.txt (the licence of every npm package whose
// code is in the output). The build is deterministic: same lock, same source, same bytes.
import * as esbuild from "esbuild";
import { readFileSync, writeFileSync, rmSync, mkdirSync, existsSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const outIndex = args.indexOf("--outdir");
const outdir = resolve(outIndex >= 0 ? args[outIndex + 1] : join(here, "../server/web/static"));

// The entries: pages and the hashing worker. Add a page's entry here.
const entryPoints = {
  stamp: join(here, "src/stamp-page.js"),
  verify: join(here, "src/verify-page.js"),
  "hash-worker": join(here, "src/hash-worker.js"),
  page: join(here, "src/page.css"),
};

rmSync(outdir, { recursive: true, force: true });
mkdirSync(outdir, { recursive: true });
const result = await esbuild.build({
  entryPoints,
  absWorkingDir: here, // the same bytes from whatever folder it runs in
  bundle: true,
  format: "esm",
  splitting: true,
  minify: true,
  target: "es2022",
  platform: "browser",
  outdir,
  entryNames: "[name]-[hash]",
  chunkNames: "chunk-[hash]",
  legalComments: "none",
  metafile: true,
  logLevel: "warning",
});

const assets = {};
for (const [file, info] of Object.entries(result.metafile.outputs)) {
  if (!info.entryPoint) continue;
  const name = Object.entries(entryPoints).find(([, p]) => resolve(p) === resolve(here, info.entryPoint))?.[0];
  if (name) assets[name] = file.split("/").pop();
}
writeFileSync(join(outdir, "assets.json"), JSON.stringify(assets, Object.keys(assets).sort(), 2) + "\n");

// Licences of the npm packages bundled (their own LICENSE files, verbatim).
const packages = new Set();
for (const input of Object.keys(result.metafile.inputs)) {
  const m = input.match(/node_modules\/((?:@[^/]+\/)?[^/]+)\//);
  if (m) packages.add(m[1]);
}
let licences = "Third-party code in the files of this folder (built by web/build.mjs from " +
  "web/package-lock.json):\n";
for (const name of [...packages].sort()) {
  const dir = join(here, "node_modules", name);
  const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8"));
  const file = ["LICENSE", "LICENSE.md", "LICENSE.txt", "license"].map((f) => join(dir, f)).find(existsSync);
  if (!file) throw new Error(`${name}: no licence file in the package`);
  licences += `\n==== ${name} ${pkg.version} (${pkg.license}) ====\n\n` + readFileSync(file, "utf8").trim() + "\n";
}
writeFileSync(join(outdir, "LICENSES.txt"), licences);
