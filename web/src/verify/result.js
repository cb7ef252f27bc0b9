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

/** Well-formed, but not valid (exit 1): thrown only where the parse itself finds it (a
 * manifest with two signatures, or another number of lines than its header says); the checks
 * return it as a failed step. */
export class Invalid extends VerifyError {
  constructor(message, check) {
    super(message);
    this.check = check;
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

// (a byte order mark is kept, as Python's bytes.decode("utf-8") keeps it: a text starting
// with one is then refused as stampd verify refuses it)
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
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

// What Python's repr() escapes: the characters str.isprintable() says are not (categories Cc,
// Cf, Cs, Co, Cn, Zl, Zp, Zs but the space), and the backslash and the quote.
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}\p{Zs}\\'"]/gu;

/** A string as Python's repr() writes it (the messages quote values as stampd verify's do). */
export function repr(s) {
  const quote = s.includes("'") && !s.includes('"') ? '"' : "'";
  const body = s.replace(UNPRINTABLE, (c) => {
    if (c === " ") return c;
    if (c === "\\") return "\\\\";
    if (c === "'" || c === '"') return c === quote ? `\\${c}` : c;
    const named = { "\n": "\\n", "\r": "\\r", "\t": "\\t" }[c];
    if (named) return named;
    const n = c.codePointAt(0);
    if (n < 0x100) return `\\x${n.toString(16).padStart(2, "0")}`;
    if (n < 0x10000) return `\\u${n.toString(16).padStart(4, "0")}`;
    return `\\U${n.toString(16).padStart(8, "0")}`;
  });
  return quote + body + quote;
}

/** `bytes` decoded as Python's bytes.decode("utf-8", "surrogateescape"): each byte that is not
 * part of valid UTF-8 becomes the lone surrogate U+DC80 + its value. */
export function decodeSurrogateEscape(bytes) {
  let out = "";
  let i = 0;
  while (i < bytes.length) {
    const b = bytes[i];
    const n = b < 0x80 ? 1 : b >= 0xc2 && b <= 0xdf ? 2 : b >= 0xe0 && b <= 0xef ? 3 : b >= 0xf0 && b <= 0xf4 ? 4 : 0;
    const seq = n ? bytes.subarray(i, i + n) : null;
    const text = seq && seq.length === n ? decodeUtf8(seq) : null;
    if (text !== null) {
      out += text;
      i += n;
    } else {
      out += String.fromCharCode(0xdc00 + b);
      i += 1;
    }
  }
  return out;
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

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

function b64encode(bytes) {
  let bin = "";
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin);
}

/** What Python 3.11's `base64.b64decode(text, validate=True)` decodes `text` to (binascii's
 * strict mode: whole quads, padding only at the end, surplus "=" after whole quads allowed);
 * null where it raises. */
function pythonB64decode(text) {
  if (text.startsWith("=")) return null;
  const out = [];
  let quad = 0;
  let left = 0;
  let pads = 0;
  let padding = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text[i];
    if (ch === "=") {
      padding = true;
      pads += quad >= 2 ? 1 : 0;
      if (quad >= 2 && quad + pads >= 4) return i + 1 < text.length ? null : new Uint8Array(out);
      continue;
    }
    const v = ALPHABET.indexOf(ch);
    if (v < 0 || ch.length !== 1 || padding) return null;
    pads = 0;
    if (quad === 0) left = v;
    else if (quad === 1) {
      out.push(((left << 2) | (v >> 4)) & 255);
      left = v & 0x0f;
    } else if (quad === 2) {
      out.push(((left << 4) | (v >> 2)) & 255);
      left = v & 0x03;
    } else out.push(((left << 6) | v) & 255);
    quad = (quad + 1) % 4;
  }
  return quad === 0 ? new Uint8Array(out) : null;
}

/** Standard base64 with padding, in its one canonical spelling only (formats.note's
 * b64decode_strict, the same refusals); throws `Error` otherwise. */
export function b64decodeStrict(text) {
  const raw = pythonB64decode(text);
  if (raw === null) throw new Error(`not base64: ${repr(text)}`);
  if (b64encode(raw) !== text) throw new Error(`not canonical base64: ${repr(text)}`);
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
