// The manifest body that `stampd stamp FILE|DIR...` sends (client/checksums.py), byte for
// byte: one binary-mode line per file, `<hex> *<name>`, names with "/" between components,
// escaped as coreutils escapes them, sorted by the bytes of their UTF-8, each line ending in
// LF. Pure: no DOM, no network.

export const ALGORITHMS = { sha256: 64, sha512: 128 };

// What a manifest cannot name (client/checksums.py `_UNNAMEABLE`): a control character other
// than newline, or a trailing space or tab (an OpenPGP cleartext signature does not cover
// trailing white space).
const UNNAMEABLE = /[\x00-\x09\x0b-\x1f\x7f]|[ \t]$/;
const utf8 = new TextEncoder();

export class NamesError extends Error {}

// [prefix, name] as coreutils writes them: "\\" and the escaped name when it holds a
// backslash or a newline.
export function escapeName(name) {
  if (!name.includes("\\") && !name.includes("\n")) return ["", name];
  return ["\\", name.replaceAll("\\", "\\\\").replaceAll("\n", "\\n")];
}

export function checksumLine(digest, name) {
  const [prefix, escaped] = escapeName(name);
  return `${prefix}${digest} *${escaped}`;
}

function compareBytes(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return a.length - b.length;
}

// The entries ({name, file}) sorted as `LC_ALL=C sort` sorts their names; a NamesError for
// names a manifest cannot hold, for a name given twice, or for no files at all.
export function sortEntries(entries) {
  if (entries.length === 0) throw new NamesError("no files to stamp (an empty folder?)");
  const bad = entries.filter((e) => UNNAMEABLE.test(e.name) || e.name.isWellFormed?.() === false);
  if (bad.length) {
    const shown = bad.slice(0, 5).map((e) => JSON.stringify(e.name)).join(", ");
    throw new NamesError(`${bad.length} file name(s) cannot be put in a manifest (a control ` +
      `character, or a trailing space or tab): ${shown}; rename them or leave them out`);
  }
  const keyed = entries.map((e) => ({ e, key: utf8.encode(e.name) }));
  keyed.sort((a, b) => compareBytes(a.key, b.key));
  for (let i = 1; i < keyed.length; i++) {
    if (keyed[i].e.name === keyed[i - 1].e.name) {
      throw new NamesError(`${JSON.stringify(keyed[i].e.name)} is given twice: choose each ` +
        "file or folder once");
    }
  }
  return keyed.map((k) => k.e);
}

// The body: one line per (sorted) entry and its digest, each ending in LF.
export function manifestBody(entries, digests) {
  return entries.map((e, i) => checksumLine(digests[i], e.name) + "\n").join("");
}

// The header of a signed manifest (docs/manifests.md), or null when the text is not one:
// {algorithm, time, utc, server, serial, key, lines} and the lines that follow it.
export function parseManifestAnswer(text) {
  const start = text.indexOf("# stampd manifest v1\n");
  if (start < 0) return null;
  const end = text.indexOf("\n-----BEGIN ", start);
  const signed = text.slice(start, end < 0 ? undefined : end + 1).split("\n");
  const header = {};
  let i = 1;
  for (; i < signed.length && signed[i].startsWith("# "); i++) {
    const m = signed[i].match(/^# ([a-z]+): (.*)$/);
    if (m) header[m[1]] = m[2];
  }
  const lines = signed.slice(i, signed.length - 1);
  return { header, lines };
}
