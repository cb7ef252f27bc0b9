// The stamp page (docs/web.md, "The stamp page"): files chosen or dropped are hashed in a Web
// Worker (hash-worker.js) and never leave the browser; one file is stamped as a digest
// (POST /v1/stamps), several or a folder as one manifest (POST /v1/manifests), exactly the
// body `stampd stamp` sends; then the stamp's log proof is fetched when the server keeps a log.
import { pageConfig } from "./config.js";
import { fromDrop, fromInput } from "./stamp/files.js";
import { manifestBody, NamesError, parseManifestAnswer, sortEntries } from "./stamp/manifest.js";
import { fetchProof, ServerError, stampDigest, stampManifest } from "./stamp/api.js";

const PROOF_WAIT = 10; // seconds the server may wait for the log to cover the stamp
const SHOWN_NAMES = 20; // names listed in a manifest's result
const MAX_WORKERS = 4; // hashing workers at once, for several files

const config = pageConfig();
const $ = (id) => document.getElementById(id);
const ui = {
  files: $("stamp-files"), folder: $("stamp-folder"), sha512: $("stamp-sha512"),
  drop: $("drop"), progress: $("stamp-progress"), rate: $("stamp-rate"),
  status: $("stamp-status"), cancel: $("stamp-cancel"), result: $("stamp-result"),
};
$("server-key").textContent = config.keys[0]?.fingerprint ?? "";

class Cancelled extends Error {}

// The job running now (null when idle): {workers, abort, rejectHashing}. Each step of a job
// checks that it is still the current one, so that nothing is sent once it is cancelled or
// replaced.
let job = null;
let blobUrls = [];

// ---- small helpers ---------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

function formatBytes(n) {
  if (n < 1000) return `${n} B`;
  const units = ["kB", "MB", "GB", "TB"];
  let i = -1;
  do { n /= 1000; i++; } while (n >= 1000 && i < units.length - 1);
  return `${n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

function formatSeconds(s) {
  if (!Number.isFinite(s)) return "";
  s = Math.ceil(s);
  return s < 60 ? `${s} s` : `${Math.floor(s / 60)} min ${s % 60} s`;
}

const quote = (s) => (/^[A-Za-z0-9._\/+=:@-]+$/.test(s) ? s : `'${s.replaceAll("'", "'\\''")}'`);

function download(name, text, type = "text/plain") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  blobUrls.push(url);
  return el("a", { href: url, download: name, class: "stamp-download" }, `Download ${name}`);
}

function say(message) {
  ui.status.textContent = message;
}

function showResult(...children) {
  ui.result.replaceChildren(...children);
}

function showError(message, retry) {
  const parts = [el("h2", { id: "result-heading", tabindex: "-1", class: "bad" }, "Not stamped"),
    el("p", { text: message })];
  if (retry) {
    const button = el("button", { type: "button" }, "Try again");
    button.addEventListener("click", retry);
    parts.push(el("p", {}, button));
  }
  showResult(...parts);
  say(`Not stamped: ${message}`);
  document.body.dataset.state = "done";
}

// ---- hashing in the worker ---------------------------------------------------------------

// Files in `lanes` groups of about equal bytes (the largest first, each into the lightest
// group), as lists of indices.
function lanesOf(files, lanes) {
  const groups = Array.from({ length: lanes }, () => ({ indices: [], bytes: 0 }));
  const order = files.map((_, i) => i).sort((a, b) => files[b].size - files[a].size);
  for (const i of order) {
    const lightest = groups.reduce((m, g) => (g.bytes < m.bytes ? g : m));
    lightest.indices.push(i);
    lightest.bytes += files[i].size;
  }
  return groups.filter((g) => g.indices.length).map((g) => g.indices);
}

// The files' digests, in their order. Several files are hashed by up to MAX_WORKERS workers
// at once (one per core the browser reports): one file's SHA-256 cannot be split, but a
// folder's files can.
function hashFiles(files, algorithm, onProgress) {
  const cores = navigator.hardwareConcurrency || 1;
  const lanes = lanesOf(files, Math.max(1, Math.min(MAX_WORKERS, cores)));
  const progress = lanes.map(() => 0);
  job.workers = [];
  const hashed = lanes.map((indices, lane) => new Promise((resolve, reject) => {
    const worker = new Worker(`/web/${config.assets["hash-worker"]}`, { type: "module" });
    job.workers.push(worker);
    worker.onmessage = ({ data }) => {
      if (data.error) {
        reject(new Error(`a file could not be read: ${data.error}`));
      } else if (data.digests) {
        resolve(data.digests);
      } else if (data.progress !== undefined) {
        progress[lane] = data.progress;
        onProgress(progress.reduce((a, b) => a + b, 0));
      }
    };
    worker.onerror = (e) => reject(new Error(`the hashing failed: ${e.message || "worker error"}`));
    worker.postMessage({ id: lane, files: indices.map((i) => files[i]), algorithm });
  }));
  const cancelled = new Promise((_, reject) => { job.rejectHashing = reject; });
  const workers = job.workers;
  return Promise.race([Promise.all(hashed), cancelled]).then((results) => {
    const digests = new Array(files.length);
    lanes.forEach((indices, lane) => indices.forEach((i, k) => { digests[i] = results[lane][k]; }));
    return digests;
  }).finally(() => workers.forEach((w) => w.terminate()));
}

function progressReporter(total) {
  const started = performance.now();
  return (done) => {
    ui.progress.value = total ? done / total : 1;
    const seconds = (performance.now() - started) / 1000;
    const rate = seconds > 0 ? done / seconds : 0;
    const left = rate > 0 ? formatSeconds((total - done) / rate) : "";
    ui.rate.textContent = `Hashed ${formatBytes(done)} of ${formatBytes(total)}` +
      (rate > 0 && done < total ? ` · ${formatBytes(rate)}/s · ${left} left` : "");
  };
}

// ---- one job: hash, stamp, fetch the proof ---------------------------------------------------

function cancel() {
  if (!job) return;
  const current = job;
  const state = document.body.dataset.state;
  job = null;
  for (const worker of current.workers ?? []) worker.terminate();
  current.abort.abort();
  current.rejectHashing?.(new Cancelled());
  ui.cancel.disabled = true;
  ui.progress.value = 0;
  const outcome = {
    hashing: "nothing was sent to the server",
    stamped: "the stamp is kept; the page stopped waiting for the log's proof",
  }[state] ?? "the request had been sent: the server may have stamped it";
  ui.rate.textContent = `Cancelled: ${outcome}.`;
  say(`Cancelled: ${outcome}.`);
  document.body.dataset.state = "cancelled";
}

// Marks for the benchmark (bench/web.py) and anyone profiling: a job's steps, in order.
const mark = (name) => performance.mark(`stamp-${name}`);

async function start(chosen) {
  mark("chosen");
  cancel();
  for (const url of blobUrls) URL.revokeObjectURL(url);
  blobUrls = [];
  const algorithm = ui.sha512.checked ? "sha512" : "sha256";
  let entries;
  try {
    entries = chosen.entries.length === 1 && !chosen.folder
      ? chosen.entries : sortEntries(chosen.entries);
  } catch (e) {
    if (!(e instanceof NamesError)) throw e;
    showError(e.message);
    return;
  }
  const current = { abort: new AbortController(), workers: [], rejectHashing: null };
  job = current;
  document.body.dataset.state = "hashing";
  ui.cancel.disabled = false;
  const total = entries.reduce((n, e) => n + e.file.size, 0);
  const what = entries.length === 1 ? entries[0].name : `${entries.length} files`;
  say(`Hashing ${what} (${formatBytes(total)}) with ${algorithm}…`);
  const report = progressReporter(total);
  report(0);
  mark("hashing");
  let digests;
  try {
    digests = await hashFiles(entries.map((e) => e.file), algorithm, report);
  } catch (e) {
    if (e instanceof Cancelled || job !== current) return;
    finish(current);
    showError(e.message);
    return;
  }
  if (job !== current) return;
  mark("hashed");
  report(total);
  await submit(current, entries, chosen.folder, algorithm, digests);
}

// The end of a job, unless another has replaced it meanwhile.
function finish(current) {
  if (job !== current) return;
  job = null;
  ui.cancel.disabled = true;
  document.body.dataset.state = "done";
}

async function submit(current, entries, folder, algorithm, digests) {
  job = current;
  ui.cancel.disabled = false;
  document.body.dataset.state = "stamping";
  say("Hashed. Asking the server to stamp…");
  const retry = () => {
    if (job) return;
    const again = { abort: new AbortController(), workers: [], rejectHashing: null };
    job = again;
    submit(again, entries, folder, algorithm, digests);
  };
  let stamped;
  try {
    stamped = entries.length === 1 && !folder
      ? await stampOne(current, entries[0], algorithm, digests[0])
      : await stampMany(current, entries, algorithm, digests);
  } catch (e) {
    if (job !== current) return;
    finish(current);
    if (e instanceof ServerError) {
      const wait = e.retryAfter !== null ? ` Try again in ${formatSeconds(e.retryAfter)}.` : "";
      showError(`${e.message}.${wait}`, retry);
    } else {
      showError(e.message);
    }
    return;
  }
  if (job !== current) return;
  ui.progress.value = 1;
  showResult(...stamped.nodes);
  mark("stamped");
  say(`Stamped at ${stamped.utc}, serial ${stamped.serial}.`);
  $("result-heading").focus();
  document.body.dataset.state = "stamped";
  if (config.tlog) await proof(current, stamped);
  finish(current);
}

async function stampOne(current, entry, algorithm, digest) {
  const answer = await stampDigest(algorithm, digest, current.abort.signal);
  if (answer.digest !== digest || answer.algorithm !== algorithm) {
    throw new Error("the server's receipt is not for this file's digest; it was not kept");
  }
  const base = entry.name.split("/").pop();
  const name = `${base}.receipt.asc`;
  const key = keyFile(answer.key);
  const nodes = describe({
    what: [el("code", { text: entry.name }), ` (${formatBytes(entry.file.size)})`,
      el("br"), `${algorithm} `, el("code", { text: digest })],
    answer, downloads: [download(name, answer.receipt), key.link],
    commands: [
      `gpg --import ${key.name}`,
      `gpg --verify ${quote(name)}`,
      `stampd verify ${quote(name)} --file ${quote(base)} --key ${key.name}`,
    ],
    where: "in the folder that holds the file and the downloads",
  });
  return { nodes, name, serial: answer.serial, utc: answer.utc, text: answer.receipt };
}

async function stampMany(current, entries, algorithm, digests) {
  const body = manifestBody(entries, digests);
  const text = await stampManifest(body, current.abort.signal);
  const parsed = parseManifestAnswer(text);
  const sent = body.split("\n").slice(0, -1);
  if (!parsed || parsed.header.algorithm !== algorithm || Number(parsed.header.lines) !==
      sent.length || parsed.lines.length !== sent.length ||
      parsed.lines.some((line, i) => line !== sent[i])) {
    throw new Error("the server's manifest does not hold the lines sent; it was not kept");
  }
  const h = parsed.header;
  const name = `${algorithm.toUpperCase()}SUMS.asc`;
  const key = keyFile(h.key);
  const total = entries.reduce((n, e) => n + e.file.size, 0);
  const list = el("ul", { class: "stamp-names" },
    ...entries.slice(0, SHOWN_NAMES).map((e) => el("li", {}, el("code", { text: e.name }))));
  if (entries.length > SHOWN_NAMES) {
    list.append(el("li", { text: `and ${entries.length - SHOWN_NAMES} more` }));
  }
  const top = [...new Set(entries.map((e) => e.name.split("/")[0]))];
  const holder = top.length === 1 && entries[0].name.includes("/")
    ? `the folder that holds ${top[0]}/` : "the folder that holds the files";
  const nodes = describe({
    what: [`${entries.length} files, ${formatBytes(total)}, ${algorithm}`, list],
    answer: { ...h, time: Number(h.time) }, downloads: [download(name, text), key.link],
    commands: [
      `gpg --import ${key.name}`,
      `gpg --verify ${name}`,
      `${algorithm}sum -c ${name}`,
      `stampd verify ${name} --dir . --key ${key.name}`,
    ],
    where: `in ${holder}, with the downloads beside them (${algorithm}sum warns about the ` +
      "signature's lines: they are not checksums)",
  });
  return { nodes, name, serial: h.serial, utc: h.utc, text };
}

function keyFile(fingerprint) {
  const key = config.keys.find((k) => k.fingerprint === fingerprint);
  const name = "server-key.asc";
  return { name, link: key ? download(name, key.public) : el("span", { text: "" }), key };
}

function describe({ what, answer, downloads, commands, where }) {
  const key = config.keys.find((k) => k.fingerprint === answer.key);
  const when = new Date(answer.time * 1000);
  const rows = [
    ["What", what],
    ["When", [el("time", { datetime: answer.utc, text: answer.utc }),
      ` (${when.toLocaleString()}, Unix ${answer.time})`]],
    ["Key", [el("code", { text: answer.key }), key?.uid ? ` (${key.uid})` : ""]],
    ["Server", [el("code", { text: answer.server }), ` serial ${answer.serial}`]],
  ];
  const dl = el("dl", { class: "stamp-facts" });
  for (const [term, value] of rows) dl.append(el("dt", { text: term }), el("dd", {}, ...value));
  return [
    el("h2", { id: "result-heading", tabindex: "-1", class: "ok" }, "Stamped"),
    dl,
    el("ul", { class: "stamp-downloads", id: "stamp-downloads" },
      ...downloads.map((a) => el("li", {}, a))),
    el("p", { id: "stamp-proof", class: "muted" },
      config.tlog ? "Waiting for the transparency log's proof…" : "This server keeps no transparency log."),
    el("h3", { text: "Check it with stock tools" }),
    el("p", { text: `Run these ${where}:` }),
    el("pre", { class: "stamp-commands" }, el("code", { text: commands.join("\n") })),
  ];
}

async function proof(current, stamped) {
  const line = $("stamp-proof");
  const name = `${stamped.name}.tlog-proof`;
  const later = `${config.server.replace(/\/$/, "")}/v1/proofs/${stamped.serial}`;
  let text;
  try {
    text = await fetchProof(stamped.serial, PROOF_WAIT, current.abort.signal);
  } catch (e) {
    if (job !== current) return;
    line.textContent = `The log's proof could not be fetched: ${e.message}. Fetch it later: ` +
      `curl -fsS ${later} -o ${name}`;
    return;
  }
  if (job !== current) return;
  if (text === null || !text.startsWith("c2sp.org/tlog-proof@v1\n")) {
    line.textContent = `The transparency log has not included this stamp yet (waited ` +
      `${PROOF_WAIT} s). The receipt is valid without it; fetch the proof later: curl -fsS ` +
      `${later} -o ${name} (or stampd verify ${stamped.name} --fetch-proof).`;
    return;
  }
  $("stamp-downloads").append(el("li", {}, download(name, text)));
  line.textContent = `In the transparency log: keep ${name} beside ${stamped.name}; stampd verify ` +
    "checks it too.";
  line.classList.remove("muted");
  say(`Stamped at ${stamped.utc}, serial ${stamped.serial}; the log's proof is ready.`);
}

// ---- choosing and dropping -------------------------------------------------------------------

function chose(input) {
  const chosen = fromInput(input);
  input.value = ""; // the same files may be chosen again
  if (chosen.entries.length) start(chosen);
}

ui.files.addEventListener("change", () => chose(ui.files));
ui.folder.addEventListener("change", () => chose(ui.folder));
ui.cancel.addEventListener("click", cancel);
for (const type of ["dragenter", "dragover"]) {
  document.addEventListener(type, (e) => {
    e.preventDefault();
    ui.drop.classList.add("stamp-dragging");
  });
}
document.addEventListener("dragleave", (e) => {
  if (e.relatedTarget === null) ui.drop.classList.remove("stamp-dragging");
});
document.addEventListener("drop", async (e) => {
  e.preventDefault();
  ui.drop.classList.remove("stamp-dragging");
  try {
    const chosen = await fromDrop(e.dataTransfer);
    if (chosen.entries.length) start(chosen);
    else showError("nothing to stamp was dropped (an empty folder?)");
  } catch (err) {
    showError(`the dropped files could not be read: ${err.message}`);
  }
});
document.body.dataset.ready = "1";
