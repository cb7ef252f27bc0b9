// Digest receipts (docs/receipts.md), checked in the browser as `stampd verify RECEIPT --file F
// --key KEYFILE` checks them (client/verify/receipt.py, formats/receipts.py): the same
// grammar, the same signature rules, the same reasons.
import { BEGIN_SIG, BEGIN_SIGNED, END_SIG, canonicalText, checkDetached, fingerprints, readPublicKeys } from "./openpgp-signature.js";
import { Checks, Malformed, asBytes, repr, utc } from "./result.js";
import { NAMESPACE, SSH_BEGIN, SSH_END, sshKeysFrom, verifySshsig } from "./sshsig.js";

export const MAX_RECEIPT = 64 * 1024;
export const ALGORITHMS = { sha256: 64, sha512: 128 };
const HEADER = "stampd receipt v1";

const LINES = [
  ["algorithm", "(sha256|sha512)"],
  ["digest", "([0-9a-f]{64}|[0-9a-f]{128})"],
  ["time", "(0|[1-9][0-9]{0,11})"],
  ["utc", "(\\d{4}-\\d\\d-\\d\\dT\\d\\d:\\d\\d:\\d\\dZ)"],
  ["server", "([!-~]{1,500})"],
  ["serial", "([1-9][0-9]{0,18})"],
  ["key", "([0-9A-F]{40}|SHA256:[A-Za-z0-9+/]{43})"],
];

/** `data` as a receipt's text: at most 64 KiB of printable ASCII, CR and LF. */
export function receiptText(data) {
  const bytes = asBytes(data);
  if (bytes.length > MAX_RECEIPT) throw new Malformed(`larger than ${MAX_RECEIPT} bytes: not a receipt`);
  if (bytes.some((b) => b > 0x7f)) throw new Malformed("not ASCII text: not a receipt");
  if (bytes.some((b) => (b < 0x20 && b !== 0x0a && b !== 0x0d) || b === 0x7f)) {
    throw new Malformed("control characters in the receipt");
  }
  const text = new TextDecoder().decode(bytes);
  return text;
}

/** The statement of a receipt's text (formats/receipts.py `parse_statement`). */
export function parseStatement(text) {
  const lines = text.split("\n");
  if (lines[lines.length - 1] === "") lines.pop();
  if (lines.length !== 8 || lines[0] !== HEADER) {
    throw new Malformed("not a 'stampd receipt v1' statement of eight lines");
  }
  const values = {};
  LINES.forEach(([name, pattern], i) => {
    const m = new RegExp(`^${name}: ${pattern}$`).exec(lines[i + 1]);
    if (!m) throw new Malformed(`bad or misplaced '${name}' line: ${repr(lines[i + 1].slice(0, 80))}`);
    values[name] = m[1];
  });
  const st = {
    algorithm: values.algorithm,
    digest: values.digest,
    time: Number(values.time),
    utc: values.utc,
    server: values.server,
    serial: values.serial, // a decimal string: up to 19 digits, beyond a Number's precision
    key: values.key,
  };
  if (st.digest.length !== ALGORITHMS[st.algorithm]) throw new Malformed(`digest length does not fit ${st.algorithm}`);
  if (values.utc !== utc(st.time)) throw new Malformed("'utc' and 'time' disagree");
  return st;
}

/** (statement text, armored signature, format) of a receipt (formats/receipts.py
 * `split_receipt`). */
export function splitReceipt(receipt) {
  const text = receipt.replace(/\r\n/g, "\n");
  if (text.startsWith(HEADER + "\n")) {
    const at = text.indexOf(SSH_BEGIN + "\n");
    const sig = at < 0 ? "" : text.slice(at + SSH_BEGIN.length + 1);
    if (at < 0 || !sig.replace(/\n+$/, "").endsWith(SSH_END) || sig.includes(SSH_BEGIN)) {
      throw new Malformed("not a receipt with one SSH signature");
    }
    return { statementText: text.slice(0, at), signature: SSH_BEGIN + "\n" + sig, format: "ssh" };
  }
  if (!text.startsWith(BEGIN_SIGNED + "\n")) throw new Malformed("not a cleartext-signed message");
  const after = text.slice(BEGIN_SIGNED.length + 1);
  const sep = after.indexOf("\n\n");
  if (sep < 0 || !after.slice(0, sep).split("\n").every((h) => h.startsWith("Hash: "))) {
    throw new Malformed("bad armor headers");
  }
  const rest = after.slice(sep + 2);
  const at = rest.indexOf("\n" + BEGIN_SIG + "\n");
  const sig = at < 0 ? "" : rest.slice(at + BEGIN_SIG.length + 2);
  if (at < 0 || !sig.replace(/\n+$/, "").endsWith(END_SIG)) throw new Malformed("no signature block");
  const body = rest.slice(0, at);
  if (sig.includes(BEGIN_SIG) || body.includes(BEGIN_SIGNED)) {
    throw new Malformed("more than one signed message or signature");
  }
  const lines = body.split("\n").map((l) => (l.startsWith("- ") ? l.slice(2) : l));
  return { statementText: lines.join("\n") + "\n", signature: BEGIN_SIG + "\n" + sig, format: "openpgp" };
}

/** A receipt taken apart: `{statement, statementText, signature, format}`; `Malformed` if it
 * is not one. The page reads the algorithm from it before hashing the file. */
export function parseReceipt(data) {
  const parts = splitReceipt(receiptText(data));
  return { ...parts, statement: parseStatement(parts.statementText) };
}

/** A digest given by hand, trimmed, any case: 64 or 128 hex digits (`--digest`). */
export function normaliseDigest(digest) {
  const value = digest.trim().toLowerCase();
  if (!Object.values(ALGORITHMS).includes(value.length) || !/^[0-9a-f]+$/.test(value)) {
    throw new Malformed("the digest must be 64 (sha256) or 128 (sha512) hex digits");
  }
  return value;
}

/**
 * Check a receipt completely, offline.
 *
 * - `receipt`: its text or bytes;
 * - `keys`: the trusted keys, armored OpenPGP public keys and/or SSH public key lines (a
 *   string or a list of them: the server's keys the page was served with, or a key file);
 * - `keyOrigin`: where they came from, for messages ("key file server-key.asc");
 * - `file`: `{name, digests: {sha256?, sha512?}}`, the dropped file's digests (hex), or
 * - `digest`: a digest in hex, as `--digest`.
 *
 * Returns `{ok, kind, reason, checks, statement, signer, matched}`; throws `Malformed` for
 * what is not a receipt (or no key at all).
 */
export async function verifyReceipt({ receipt, keys, keyOrigin = "given keys", file = null, digest = null }) {
  const { statement: st, statementText, signature, format } = parseReceipt(receipt);
  const expected = digest !== null ? normaliseDigest(digest) : null;
  const c = new Checks();
  c.pass("statement", `a ${st.algorithm} receipt of ${st.digest}, made ${st.utc} (${st.time}) by ${st.server} (serial ${st.serial})`);
  let signer = null;
  let primary = null;
  if (format === "ssh") {
    const texts = Array.isArray(keys) ? keys : [keys];
    const key = texts.flatMap((t) => sshKeysFrom(t)).find((k) => k.fingerprint === st.key);
    if (!key) {
      c.fail("key", `the receipt names key ${st.key}, which is not in the ${keyOrigin}`);
      return c.result({ statement: st, format });
    }
    const res = await verifySshsig(key, NAMESPACE, new TextEncoder().encode(statementText), signature);
    if (!res.ok) {
      c.fail("signature", `the SSH signature does not verify: ${res.reason}`);
      return c.result({ statement: st, format });
    }
    c.pass("signature", `a good SSH signature (namespace ${NAMESPACE}) by ${key.fingerprint} of the ${keyOrigin}`);
    signer = key.fingerprint;
    primary = key.fingerprint;
  } else {
    const trusted = await readPublicKeys(keys, keyOrigin);
    const pinned = fingerprints(trusted);
    // the detached signature over exactly the statement parsed, in the canonical form a
    // cleartext signature covers: what is checked is what is reported
    const sig = await checkDetached(canonicalText(statementText), signature, trusted);
    if (!sig.ok) {
      c.fail("signature", sig.reason);
      return c.result({ statement: st, format });
    }
    const steps = [
      [sig.fingerprint === st.key, `signed by ${sig.fingerprint}, but the receipt names key ${st.key}`],
      [pinned.has(sig.primary), `signed by ${sig.primary}, which is not in the ${keyOrigin}`],
      [sig.sigClass === "01", `signature class ${sig.sigClass} is not a text signature (01)`],
      [sig.created === st.time, `signature made at ${sig.created}, but the receipt says ${st.time}`],
    ];
    for (const [holds, why] of steps) {
      if (!holds) {
        c.fail("signature", why);
        return c.result({ statement: st, format });
      }
    }
    c.pass("signature", `a good text signature made at ${st.time} by ${sig.fingerprint} (key ${st.key}) of the ${keyOrigin}`);
    signer = sig.fingerprint;
    primary = sig.primary;
  }
  let matched = null;
  if (file !== null) {
    const actual = file.digests?.[st.algorithm];
    if (typeof actual !== "string") throw new TypeError(`no ${st.algorithm} digest of ${file.name} given`);
    if (actual.toLowerCase() !== st.digest) {
      c.fail("digest", `${st.algorithm} of ${file.name} is ${actual.toLowerCase()}, not the receipt's ${st.digest}`);
      return c.result({ statement: st, format, signer, primary });
    }
    matched = `file ${file.name}`;
    c.pass("digest", `${st.algorithm} of ${file.name} is the receipt's ${st.digest}`);
  } else if (expected !== null) {
    if (expected !== st.digest) {
      c.fail("digest", `the receipt is for ${st.digest}, not ${expected}`);
      return c.result({ statement: st, format, signer, primary });
    }
    matched = "the given digest";
    c.pass("digest", `the given digest is the receipt's ${st.digest}`);
  }
  return c.result({ statement: st, format, signer, primary, matched });
}
