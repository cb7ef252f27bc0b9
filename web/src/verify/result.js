// What every check of the verify core answers, and the errors it throws.
//
// A check that ran returns a result, `{ok, kind, reason, checks: [{name, ok, detail}], ...}`:
// each step that was made, in order, with what held (`ok: true`) or the plain-language reason
// it did not. The steps stop at the first one that fails (as `stampd verify` does), except the
// files of a manifest, which are all reported. `kind` is "valid" or "invalid" and `reason` the
// failed step's detail, the same words as `stampd verify`'s one line on stderr.
//
// Input that is not of the format at all throws `Malformed`; a format the browser cannot check
// throws `Unsupported`; both carry `kind` and a plain message, as `stampd verify` reports them
// ("malformed", "unsupported").

export class VerifyError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }

  get kind() {
    return "invalid";
  }
}

/** Not a receipt, manifest, proof, key or policy of a known format (exit 2 of `stampd verify`). */
export class Malformed extends VerifyError {
  get kind() {
    return "malformed";
  }
}

/** Well-formed, but signed or made in a way this check cannot check (exit 1). */
export class Unsupported extends VerifyError {
  get kind() {
    return "unsupported";
  }
}

/** The steps of one check, collected in order; `fail` records the reason and stops adding. */
export class Checks {
  constructor() {
    this.checks = [];
    this.reason = null;
  }

  get ok() {
    return this.reason === null && this.checks.every((c) => c.ok);
  }

  pass(name, detail) {
    this.checks.push({ name, ok: true, detail });
    return true;
  }

  /** A failed step; `reason` (default: `detail`) is what the whole check says of it. */
  fail(name, detail, reason = detail) {
    this.checks.push({ name, ok: false, detail });
    if (this.reason === null) this.reason = reason;
    return false;
  }

  /** The result object of the check, with `extra` fields (what was found) added. */
  result(extra = {}) {
    const ok = this.ok;
    return { ok, kind: ok ? "valid" : "invalid", reason: this.reason, checks: this.checks, ...extra };
  }
}

const utf8 = new TextDecoder("utf-8", { fatal: true });
const encoder = new TextEncoder();

/** `data` (a string, Uint8Array or ArrayBuffer) as bytes. */
export function asBytes(data) {
  if (typeof data === "string") return encoder.encode(data);
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  throw new TypeError("expected text or bytes");
}

export function utf8Bytes(text) {
  return encoder.encode(text);
}

/** Strict UTF-8 decoding; null when the bytes are not UTF-8. */
export function decodeUtf8(bytes) {
  try {
    return utf8.decode(bytes);
  } catch {
    return null;
  }
}

export function hex(bytes) {
  let s = "";
  for (const b of bytes) s += b.toString(16).padStart(2, "0");
  return s;
}

/** YYYY-MM-DDTHH:MM:SSZ of Unix seconds `t` (Python's time.strftime of time.gmtime). */
export function utc(t) {
  return new Date(t * 1000).toISOString().replace(/\.\d{3}Z$/, "Z");
}

const B64 = /^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$/;

function b64encode(bytes) {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** Standard base64 with padding, in its one canonical spelling only (formats.note's
 * b64decode_strict); throws `Error` otherwise. */
export function b64decodeStrict(text) {
  if (!B64.test(text)) throw new Error(`not base64: ${JSON.stringify(text.slice(0, 100))}`);
  const bin = atob(text);
  const raw = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) raw[i] = bin.charCodeAt(i);
  if (b64encode(raw) !== text) throw new Error(`not canonical base64: ${JSON.stringify(text.slice(0, 100))}`);
  return raw;
}

export { b64encode };

export function equalBytes(a, b) {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

export function concatBytes(...parts) {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
