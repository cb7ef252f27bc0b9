// The verify page (docs/web.md, "The verify page"): the files a person drops are sorted by
// what they are (receipt, manifest, log proof, key file, policy, and the files checked), the
// checked files are hashed here (hash-wasm, streamed), and web/src/verify decides, offline.
// The page asks no server anything (its CSP says connect-src 'none').
import { createSHA256, createSHA512 } from "hash-wasm";

import { pageConfig } from "./config.js";
import { parseManifest, verifyManifest } from "./verify/manifest.js";
import { parseReceipt, verifyReceipt } from "./verify/receipt.js";
import { Invalid } from "./verify/result.js";
import { parsePolicy, heldManifest, heldReceipt, verifyTlogProof } from "./verify/tlog.js";

const config = pageConfig();
const evidenceInput = document.getElementById("verify-receipt");
const filesInput = document.getElementById("verify-file");
const out = document.getElementById("verify-result");
document.getElementById("server-key").textContent = config.keys[0]?.fingerprint ?? "";

const MAX_EVIDENCE = 300 * 1024 * 1024; // a manifest may be large; a receipt is at most 64 KiB
let run = 0;

/** The hex digest of `file`, streamed (constant memory); `progress(bytes)` now and then; given
 * up (throwing) once `stale()` says a newer check has begun. */
async function digestOf(file, algorithm, progress = () => {}, stale = () => false) {
  const hasher = algorithm === "sha512" ? await createSHA512() : await createSHA256();
  hasher.init();
  const reader = file.stream().getReader();
  let done = 0;
  let shown = 0;
  for (;;) {
    const { value, done: end } = await reader.read();
    if (end) break;
    if (stale()) {
      await reader.cancel();
      throw new Error("given up for a newer check");
    }
    hasher.update(value);
    done += value.length;
    if (Date.now() - shown > 100) {
      shown = Date.now();
      progress(done);
    }
  }
  progress(done);
  return hasher.digest("hex");
}

/** "Checking…" with a progress bar over `total` bytes of files to hash; its update function. */
function working(total) {
  show("working", "Checking…");
  if (!total) return () => {};
  const bar = element("progress", { max: String(total), value: "0", "aria-label": "Files hashed" });
  out.append(bar);
  let before = 0;
  return (file) => (bytes) => {
    bar.value = before + bytes;
    if (bytes === file.size) before += file.size;
  };
}

function startsWith(text, ...prefixes) {
  return prefixes.some((p) => text.startsWith(p));
}

/** What a dropped evidence file is, by its content. */
function kindOf(text) {
  const head = text.slice(0, 400).replace(/\r\n/g, "\n");
  if (startsWith(head, "c2sp.org/tlog-proof@v1\n")) return "proof";
  if (startsWith(head, "# stampd manifest v")) return "manifest";
  if (startsWith(head, "stampd receipt v")) return "receipt";
  if (head.startsWith("-----BEGIN PGP SIGNED MESSAGE-----\n")) {
    return head.slice(head.indexOf("\n\n") + 2).startsWith("# stampd manifest v") ? "manifest" : "receipt";
  }
  if (text.includes("-----BEGIN PGP PUBLIC KEY BLOCK-----") || /(^|\s)(ssh-ed25519|ecdsa-sha2-nistp\d+|ssh-rsa) AAAA/.test(text)) return "key";
  if (/^(log|witness|group|quorum) /m.test(text)) return "policy";
  return null;
}

function element(tag, attrs = {}, text = null) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== null) el.textContent = text;
  return el;
}

function show(state, heading, checks = [], note = null) {
  out.replaceChildren();
  out.dataset.state = state;
  const cls = state === "valid" ? "ok" : state === "working" || state === "empty" ? "muted" : "bad";
  out.append(element("p", { class: `verdict ${cls}`, "data-verdict": state }, heading));
  if (checks.length) {
    const list = element("ul", { class: "checks" });
    for (const c of checks) {
      const li = element("li", { class: c.ok ? "ok" : "bad", "data-check": c.name, "data-ok": String(c.ok) });
      li.append(element("strong", {}, `${c.ok ? "✓ holds" : "✗ fails"}: ${c.name}`), document.createTextNode(` — ${c.detail}`));
      list.append(li);
    }
    out.append(list);
  }
  if (note) out.append(element("p", { class: "muted" }, note));
}

async function check() {
  const mine = ++run;
  // what a check says, unless a newer choice of files is being checked by then
  const stale = () => mine !== run;
  const say = (...args) => {
    if (!stale()) show(...args);
  };
  const evidence = [...evidenceInput.files];
  const files = [...filesInput.files];
  if (!evidence.length) {
    show("empty", files.length ? "Now choose the receipt or manifest these files go with." : "Choose a receipt or manifest, and the file or files it is for.");
    return;
  }
  const hashed = working(files.reduce((n, f) => n + f.size, 0));
  const found = { receipt: [], manifest: [], proof: [], key: [], policy: [] };
  for (const f of evidence) {
    if (f.size > MAX_EVIDENCE) return say("malformed", `Not checked: ${f.name} is too large for a receipt, manifest, proof or key.`);
    const bytes = new Uint8Array(await f.arrayBuffer());
    const text = new TextDecoder().decode(bytes);
    const kind = kindOf(text);
    if (!kind) return say("malformed", `Not checked: ${f.name} is no receipt, manifest, log proof, key file or policy.`);
    found[kind].push({ name: f.name, bytes, text });
  }
  if (found.receipt.length + found.manifest.length !== 1) {
    return say("malformed", "Not checked: choose exactly one receipt or manifest (with its log proof, if you have it).");
  }
  if (found.proof.length > 1 || found.policy.length > 1) return say("malformed", "Not checked: choose at most one log proof and one policy.");
  if (found.proof.length && !found.policy.length && !config.tlog) {
    return say("malformed", "Not checked: this server keeps no transparency log, so the page knows no log key; add the log's policy file to check the proof.");
  }
  const keys = found.key.length ? found.key.map((k) => k.text) : config.keys.map((k) => k.public);
  const keyOrigin = found.key.length ? `key file ${found.key.map((k) => k.name).join(", ")}` : `keys this page was served with by ${config.server}`;
  let result;
  let held;
  try {
    if (found.receipt.length) {
      const receipt = found.receipt[0];
      const { statement } = parseReceipt(receipt.bytes);
      if (files.length > 1) return say("malformed", "Not checked: a receipt is for one file; choose one file (or a manifest for several).");
      const file = files.length ? { name: files[0].name, digests: { [statement.algorithm]: await digestOf(files[0], statement.algorithm, hashed(files[0]), stale) } } : null;
      result = await verifyReceipt({ receipt: receipt.bytes, keys, keyOrigin, file });
      if (result.ok) held = heldReceipt(result);
    } else {
      const manifest = found.manifest[0];
      let algorithm = "sha256";
      try {
        algorithm = parseManifest(manifest.bytes).header.algorithm;
      } catch (e) {
        if (!(e instanceof Invalid)) throw e; // (verifyManifest reports it)
      }
      const digests = new Map();
      for (const f of files) digests.set(f.webkitRelativePath || f.name, await digestOf(f, algorithm, hashed(f), stale));
      result = await verifyManifest({ manifest: manifest.bytes, keys, keyOrigin, files: files.length ? digests : null });
      if (result.ok) held = heldManifest(result, manifest.bytes);
    }
    if (result.ok && found.proof.length) {
      const proof = found.proof[0];
      const policy = found.policy[0] ?? null;
      let witnesses = [];
      if (!policy && config.tlog?.policy) witnesses = parsePolicy(config.tlog.policy).witnesses.map((w) => w.key.key.vkey);
      const logged = verifyTlogProof({
        proof: proof.bytes,
        held,
        source: proof.name,
        logKeys: config.tlog ? [config.tlog.vkey] : [],
        keyOrigin: `log key this page was served with by ${config.server}`,
        policy: policy ? policy.bytes : null,
        policyOrigin: policy ? policy.name : "policy",
        witnesses,
      });
      result = { ...logged, checks: [...result.checks, ...logged.checks] };
    }
  } catch (e) {
    if (stale()) return;
    if (!e.kind) throw e;
    if (e.kind === "invalid") return say("invalid", `Not valid: ${e.message}`);
    return say(e.kind === "malformed" ? "malformed" : "unsupported", `Not checked (${e.kind}): ${e.message}`);
  }
  const what = found.receipt.length ? "receipt" : "manifest";
  if (result.ok) {
    const none = !files.length ? `No file was given: the ${what}'s signature was checked, not a file.` : null;
    say("valid", `Valid: the ${what} holds${found.proof.length ? ", and so does its log proof" : ""}.`, result.checks, none);
  } else {
    say("invalid", `Not valid: ${notValid(result, what, files)}`, result.checks);
  }
}

/** Why a check failed, in the verdict: `stampd verify`'s reason, but for a receipt's file that
 * is not the one stamped, said in words (its digest and the receipt's are in the step below). */
function notValid(result, what, files) {
  const failed = result.checks.find((c) => !c.ok);
  if (what === "receipt" && files.length === 1 && failed?.name === "digest") {
    return `this file (${files[0].name}) is not the one stamped.`;
  }
  return result.reason;
}

for (const input of [evidenceInput, filesInput]) {
  input.addEventListener("change", () => {
    check().catch((e) => show("error", `The check failed: ${e.message}`));
  });
}
document.body.dataset.ready = "1";
