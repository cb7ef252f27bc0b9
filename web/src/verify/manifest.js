// Signed manifests (`SHA256SUMS.asc`, docs/manifests.md), checked in the browser as
// `stampd verify SHA256SUMS.asc --key KEYFILE --dir DIR` checks them (client/verify/manifest.py,
// formats/manifests.py, client/checksums.py): the lines parsed exactly as the server parses
// them, one OpenPGP or SSH signature by the key the header names, and the dropped files'
// digests compared with the lines: which differ, which are missing, which are extra.
import { BEGIN_SIG, BEGIN_SIGNED, END_SIG, canonicalText, checkDetached, fingerprints, readPublicKeys } from "./openpgp-signature.js";
import { Checks, Invalid, Malformed, Unsupported, asBytes, decodeUtf8, repr, utc, utf8Bytes } from "./result.js";
import { NAMESPACE, SSH_BEGIN, SSH_END, sshKeysFrom, verifySshsig } from "./sshsig.js";

export const MAX_MANIFEST = 257 * 1024 * 1024;
const ALGORITHMS = { sha256: 64, sha512: 128 };
const BSD_TAGS = { sha256: "SHA256", sha512: "SHA512" };
const MAX_LINE = 8192;
const MAX_REPORTED = 20;
const MAGIC = "# stampd manifest v";

const NAME = "[^\\x00-\\x1f\\x7f]*[^\\x00-\\x20\\x7f]";
const BSD_NAME = "[^\\x00-\\x1f\\x7f]*";

/** One checksum line of `algorithm` (formats/manifests.py `line_regex`), anchored. */
function lineRegex(algorithm) {
  const n = ALGORITHMS[algorithm];
  const tag = BSD_TAGS[algorithm];
  return new RegExp(`^\\\\?(?:([0-9a-f]{${n}})(?: [ *]${NAME})?|${tag} \\(${BSD_NAME}\\) = ([0-9a-f]{${n}}))$`);
}
const PATTERNS = { sha256: lineRegex("sha256"), sha512: lineRegex("sha512") };

const HEADER = new RegExp(
  "^# stampd manifest v1\\n# algorithm: (sha256|sha512)\\n# time: (0|[1-9][0-9]{0,11})\\n" +
    "# utc: (\\p{Nd}{4}-\\p{Nd}{2}-\\p{Nd}{2}T\\p{Nd}{2}:\\p{Nd}{2}:\\p{Nd}{2}Z)\\n# server: ([!-~]{1,500})\\n" +
    "# serial: ([1-9][0-9]{0,18})\\n# key: ([0-9A-F]{40}|SHA256:[A-Za-z0-9+/]{43})\\n" +
    "# lines: ([1-9][0-9]{0,9})\\n",
  "u", // (\p{Nd}: Python's \d of a str, any decimal digit; 'utc' and 'time' then disagree)
);

// client/checksums.py `_LINE` ("." of Python matches anything but a newline; so does [^\n])
const PARSE_LINE = /^(\\?)(?:([0-9a-f]+)(?: [ *]([^\n]*))?|SHA(?:256|512) \(([^\n]*)\) = ([0-9a-f]+))$/;

function codePoints(line) {
  return line.length <= MAX_LINE ? line.length : [...line].length;
}

/** (digest, name or null) of a checksum line the server accepted; names unescaped as
 * `sha256sum -c` reads them (`\\` and `\n`). */
export function parseLine(line) {
  const m = PARSE_LINE.exec(line);
  if (!m) throw new Malformed(`not a checksum line: ${repr(line.slice(0, 100))}`);
  const digest = m[2] ?? m[5];
  let name = m[3] ?? m[4] ?? null;
  if (name !== null && m[1]) name = name.replace(/\\(.)/g, (_, ch) => (ch === "n" ? "\n" : ch));
  return { digest, name };
}

/** Every line of `lines` (LF line ends, a final LF) a checksum line of `algorithm`;
 * `Malformed` naming the first bad lines otherwise (formats/manifests.py `check_lines`). */
function checkLines(lines, algorithm) {
  if (!lines || !lines.endsWith("\n")) {
    throw new Malformed("not a manifest: a manifest is one or more lines, each ending in a newline");
  }
  const pattern = PATTERNS[algorithm];
  const bad = [];
  let count = 0;
  lines.slice(0, -1).split("\n").forEach((line, i) => {
    if (codePoints(line) > MAX_LINE || !pattern.test(line)) {
      count += 1;
      if (bad.length < MAX_REPORTED) bad.push(i + 1);
    }
  });
  if (count) {
    const shown = bad.join(", ") + (count > MAX_REPORTED ? ", ..." : "");
    throw new Malformed(`not a manifest: ${count} line(s) are not ${algorithm} checksum lines: line ${shown}`);
  }
}

function parseHeader(signed) {
  const m = HEADER.exec(signed);
  if (!m) throw new Malformed("not a manifest: no stampd manifest header");
  const header = {
    algorithm: m[1],
    time: Number(m[2]),
    utc: m[3],
    server: m[4],
    serial: m[5], // decimal string (19 digits exceed a Number)
    key: m[6],
    lines: Number(m[7]),
  };
  if (utc(header.time) !== header.utc) throw new Malformed("not a manifest: 'utc' and 'time' disagree");
  return { header, length: m[0].length };
}

function unsupportedSignature(first) {
  const kind = first.replace(/^-+|-+$/g, "").slice(6).toLowerCase();
  return new Unsupported(`the manifest's signature is ${repr(kind)}; only OpenPGP and SSH signatures can be checked`);
}

/** (signed text with a final LF, armored signature) of an OpenPGP cleartext message, as
 * client/verify/manifest.py `_split_cleartext`. */
function splitCleartext(text) {
  const after = text.slice(BEGIN_SIGNED.length + 1);
  const sep = after.indexOf("\n\n");
  if (sep < 0 || !after.slice(0, sep).split("\n").every((h) => h.startsWith("Hash: "))) {
    throw new Malformed("bad armor headers in the cleartext-signed manifest");
  }
  const rest = after.slice(sep + 2);
  const at = rest.indexOf("\n-----BEGIN ");
  if (at < 0) throw new Malformed("the cleartext-signed manifest has no signature block");
  let body = rest.slice(0, at);
  const sig = rest.slice(at + 1);
  const first = sig.split("\n", 1)[0];
  if (first !== BEGIN_SIG) throw unsupportedSignature(first);
  if (!sig.replace(/\n+$/, "").endsWith(END_SIG) || sig.split("-----BEGIN ").length - 1 !== 1 || body.includes(BEGIN_SIGNED)) {
    throw new Invalid("more than one signed message or signature (only one is allowed)", "signature");
  }
  if (body.startsWith("- ") || body.includes("\n- ")) {
    body = body.split("\n").map((l) => (l.startsWith("- ") ? l.slice(2) : l)).join("\n");
  }
  return { signed: body + "\n", signature: sig };
}

/**
 * A signed manifest taken apart and checked as the server checks it: `{header, text (the signed
 * text), lines, signature, format, entries: [{line, digest, name}]}`. `Malformed` if it
 * is not one, `Unsupported` if it is one this page cannot check (another version, algorithm or
 * kind of signature), `Invalid` if it has two signatures or another number of lines than its
 * header says. The page reads `header.algorithm` from it before hashing the files.
 */
export function parseManifest(data) {
  const bytes = asBytes(data);
  if (bytes.length > MAX_MANIFEST) throw new Malformed(`larger than ${MAX_MANIFEST} bytes: not a manifest`);
  const decoded = decodeUtf8(bytes);
  if (decoded === null) throw new Malformed("not UTF-8 text: not a manifest");
  const text = decoded.replace(/\r\n/g, "\n");
  let signed;
  let signature;
  let format;
  if (text.startsWith(BEGIN_SIGNED + "\n")) {
    ({ signed, signature } = splitCleartext(text));
    format = "openpgp";
  } else {
    const at = text.indexOf("\n-----BEGIN ");
    if (at < 0) throw new Malformed("the manifest has no signature");
    signed = text.slice(0, at + 1);
    signature = text.slice(at + 1);
    const first = signature.split("\n", 1)[0];
    if (first !== SSH_BEGIN) throw unsupportedSignature(first);
    if (!signature.replace(/\n+$/, "").endsWith(SSH_END) || signature.split("-----BEGIN ").length - 1 !== 1) {
      throw new Invalid("more than one signature (only one is allowed)", "signature");
    }
    format = "ssh";
  }
  if (!signed.startsWith(MAGIC)) throw new Malformed("no '# stampd manifest v1' line: not a manifest");
  if (!signed.startsWith(MAGIC + "1\n")) {
    throw new Unsupported(`${repr(signed.split("\n", 1)[0])}: only version 1 manifests can be checked`);
  }
  const second = signed.split("\n", 2)[1];
  if (second.startsWith("# algorithm: ") && !(second.slice(13) in ALGORITHMS)) {
    throw new Unsupported(`the manifest's algorithm is ${repr(second.slice(13, 53))}; only sha256 and sha512 can be checked`);
  }
  const { header, length } = parseHeader(signed);
  const lines = signed.slice(length);
  const count = (lines.match(/\n/g) ?? []).length;
  if (count !== header.lines) throw new Invalid(`the header says ${header.lines} lines, but ${count} follow it`, "lines");
  checkLines(lines, header.algorithm);
  const entries = lines
    .slice(0, -1)
    .split("\n")
    .map((line, i) => ({ line: i + 1, ...parseLine(line) }));
  return { header, text: signed, lines, signature, format, entries };
}

async function checkSignature(c, manifest, keys, keyOrigin) {
  const h = manifest.header;
  const texts = (Array.isArray(keys) ? keys : [keys]).filter((t) => typeof t === "string");
  if (manifest.format === "ssh") {
    const key = texts.flatMap((t) => sshKeysFrom(t)).find((k) => k.fingerprint === h.key);
    if (!key) return c.fail("key", `the manifest names key ${h.key}, which is not in the ${keyOrigin}`);
    const res = await verifySshsig(key, NAMESPACE, utf8Bytes(manifest.text), manifest.signature);
    if (!res.ok) return c.fail("signature", `the SSH signature does not verify with the ${keyOrigin}: ${res.reason}`);
    c.pass("signature", `a good SSH signature (namespace ${NAMESPACE}) by ${key.fingerprint} of the ${keyOrigin}`);
    return key.fingerprint;
  }
  if (!texts.some((t) => t.includes("-----BEGIN PGP PUBLIC KEY BLOCK-----"))) {
    return c.fail("key", `the manifest is OpenPGP-signed, and the ${keyOrigin} holds no OpenPGP key`);
  }
  let trusted;
  try {
    trusted = await readPublicKeys(texts, keyOrigin);
  } catch (e) {
    if (e instanceof Malformed) return c.fail("key", e.message);
    throw e;
  }
  const pinned = fingerprints(trusted);
  const sig = await checkDetached(canonicalText(manifest.text), manifest.signature, trusted);
  if (!sig.ok) return c.fail("signature", sig.reason);
  const steps = [
    [pinned.has(sig.primary), `signed by ${sig.primary}, which is not in the ${keyOrigin}`],
    [h.key === sig.fingerprint || h.key === sig.primary, `signed by ${sig.fingerprint}, but the manifest names key ${h.key}`],
    [sig.sigClass === "01", `signature class ${sig.sigClass} is not a text signature (01)`],
    [sig.created === h.time, `signature made at ${sig.created}, but the manifest says ${h.time}`],
  ];
  for (const [holds, why] of steps) if (!holds) return c.fail("signature", why);
  c.pass("signature", `a good text signature made at ${h.time} by ${sig.fingerprint} (key ${h.key}) of the ${keyOrigin}`);
  return sig.primary;
}

function baseName(name) {
  return name.slice(name.lastIndexOf("/") + 1);
}

/**
 * Compare the manifest's lines with dropped files: `files` maps a name (a path relative to
 * where the manifest was made, "/" between folders, or a bare file name) to the hex digest of
 * that file in the manifest's algorithm (`header.algorithm`). A line's name is looked up as
 * it is, then by its last component when exactly one dropped file and one line bear it. Returns
 * `{checked, matched, changed: [{name, expected, actual}], missing, extra, unchecked}`.
 */
export function compareFiles(manifest, files) {
  const given = new Map(files instanceof Map ? files : Object.entries(files));
  const byBase = new Map();
  for (const name of given.keys()) {
    const b = baseName(name);
    byBase.set(b, byBase.has(b) ? null : name); // null: two dropped files share it
  }
  const named = new Set(manifest.entries.map((e) => e.name));
  const lineBases = new Map();
  for (const e of manifest.entries) if (e.name !== null) lineBases.set(baseName(e.name), (lineBases.get(baseName(e.name)) ?? 0) + 1);
  const used = new Set();
  const out = { checked: 0, matched: [], changed: [], missing: [], extra: [], unchecked: [] };
  for (const { line, digest, name } of manifest.entries) {
    const parts = name === null ? [] : name.split("/");
    if (name === null || name.startsWith("/") || parts.includes("..")) {
      out.unchecked.push(name ?? `line ${line} (no name)`);
      continue;
    }
    let found = given.has(name) ? name : null;
    if (found === null) {
      // a file dropped without its folder: by its base name, when only one dropped file bears
      // it, one line only names a file of that base name, and no line names it exactly
      const b = byBase.get(baseName(name));
      if (b && !named.has(b) && lineBases.get(baseName(name)) === 1) found = b;
    }
    out.checked += 1;
    if (found === null) {
      out.missing.push(name);
      continue;
    }
    used.add(found);
    const actual = String(given.get(found)).toLowerCase();
    if (actual !== digest) out.changed.push({ name, expected: digest, actual });
    else out.matched.push(name);
  }
  for (const name of given.keys()) if (!used.has(name)) out.extra.push(name);
  return out;
}

/**
 * Check a signed manifest completely, offline.
 *
 * - `manifest`: its bytes or text;
 * - `keys`, `keyOrigin`: as for `verifyReceipt`;
 * - `files`: a Map (or object) name -> hex digest of the dropped files (see `compareFiles`);
 * - `digest`: a digest in hex that must be one of the lines (`--digest`).
 *
 * Returns `{ok, kind, reason, checks, manifest, signer, files, matched}`: `checks` has one step
 * per changed, missing and extra file, each failed, besides the signature's. Throws
 * `Malformed` or `Unsupported` for what cannot be checked.
 */
export async function verifyManifest({ manifest: data, keys, keyOrigin = "given keys", files = null, digest = null }) {
  const c = new Checks();
  let manifest;
  try {
    manifest = parseManifest(data);
  } catch (e) {
    if (!(e instanceof Invalid)) throw e;
    c.fail(e.check, e.message);
    return c.result({ manifest: null, signer: null, files: null, matched: null });
  }
  const h = manifest.header;
  c.pass("manifest", `${h.lines} ${h.algorithm} line(s), made ${h.utc} (${h.time}) by ${h.server} (serial ${h.serial})`);
  const signer = await checkSignature(c, manifest, keys, keyOrigin);
  if (!c.ok) return c.result({ manifest, signer: null, files: null, matched: null });
  let matched = null;
  if (digest !== null) {
    const value = digest.trim().toLowerCase();
    const hit = manifest.entries.find((e) => e.digest === value);
    if (!hit) {
      c.fail("digest", `${h.algorithm} ${value} (the given digest) is not in the manifest`);
      return c.result({ manifest, signer, files: null, matched: null });
    }
    matched = `the given digest: line ${hit.line}` + (hit.name !== null ? ` (${hit.name})` : "");
    c.pass("digest", matched);
  }
  let compared = null;
  if (files !== null) {
    compared = compareFiles(manifest, files);
    for (const f of compared.changed) c.fail("file", `CHANGED: ${f.name}: its ${h.algorithm} is ${f.actual}, the manifest says ${f.expected}`);
    for (const name of compared.missing) c.fail("file", `MISSING: ${name}: named in the manifest, not among the files given`);
    for (const name of compared.extra) c.fail("file", `EXTRA: ${name}: not in the manifest`);
    for (const name of compared.unchecked) c.fail("file", `NOT CHECKED: ${name} (no name, or a name outside the folder)`);
    const bad = compared.changed.length + compared.missing.length;
    const summary =
      `${compared.checked} checked: ` +
      (bad ? `${bad} do NOT match (${compared.changed.length} changed, ${compared.missing.length} missing)` : "all match") +
      (compared.extra.length ? `; ${compared.extra.length} file(s) not in the manifest` : "") +
      (compared.unchecked.length ? `; ${compared.unchecked.length} line(s) not checked` : "");
    if (bad || compared.extra.length || compared.unchecked.length) {
      // the reason `stampd verify --dir` gives (extra files: it hashes only what is named)
      const list = (names) => names.slice(0, 5).join(", ") + (names.length > 5 ? ", ..." : "");
      const names = [...compared.changed.map((f) => f.name), ...compared.missing];
      if (bad) c.reason = `${bad} of ${compared.checked} files do not match the manifest: ${list(names)}`;
      else if (compared.unchecked.length) c.reason = `${compared.unchecked.length} line(s) name no file inside the folder: not checked`;
      else c.reason = `${compared.extra.length} file(s) given are not in the manifest: ${list(compared.extra)}`;
      c.checks.push({ name: "files", ok: false, detail: summary });
    } else {
      c.pass("files", summary);
    }
  }
  return c.result({ manifest, signer, files: compared, matched });
}
