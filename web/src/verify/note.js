// Signed notes (c2sp.org/signed-note), verifier keys, checkpoints (c2sp.org/tlog-checkpoint) and
// v1 Ed25519 cosignatures (c2sp.org/tlog-cosignature), as formats/note.py and
// formats/tlog/checkpoint.py read and check them (docs/transparency-formats.md §3, §4).
// Ed25519 from @noble/curves (strict RFC 8032, as `cryptography` verifies), SHA-256 from
// @noble/hashes. Each refusal throws `NoteError` with the same words.
import { ed25519 } from "@noble/curves/ed25519.js";
import { sha256 } from "@noble/hashes/sha2.js";

import { b64decodeStrict, concatBytes, decodeUtf8, repr, utf8Bytes } from "./result.js";

export const ED25519 = 0x01;
export const ED25519_COSIGNATURE = 0x04;
export const MAX_SIGNATURES = 100;
const KEY_SIZES = { [ED25519]: 32, [ED25519_COSIGNATURE]: 32 };
const SIGNATURE_PREFIX = "\u2014 ";
const CONTROL = /[\x00-\x09\x0b-\x1f]/;
const MAX_TREE_SIZE = 2n ** 63n - 1n;
const MAX_TIMESTAMP = 2n ** 63n - 1n;
export const EMPTY_ROOT = sha256(new Uint8Array(0));

/** A refusal of a note, key, checkpoint or cosignature (formats.note.NoteError and the
 * checkpoint errors of formats.tlog: both `ValueError`s there). */
export class NoteError extends Error {
  constructor(message) {
    super(message);
    this.name = "NoteError";
  }
}

/** Non-empty, no Unicode space, no "+", no control character. */
export function validKeyName(name) {
  // (Python's str.isspace: JavaScript's \s less U+FEFF, with U+0085)
  // (a lone surrogate: a byte that was no UTF-8, kept as Python's surrogateescape keeps it)
  return Boolean(name) && !/[\ud800-\udfff]/u.test(name) && !name.includes("+") && !/[\s\x85]/u.test(name.replace(/\ufeff/g, "")) && !CONTROL.test(name);
}

export function keyId(name, sigType, publicKey) {
  const d = sha256(concatBytes(utf8Bytes(name), new Uint8Array([0x0a, sigType]), publicKey));
  return ((d[0] << 24) | (d[1] << 16) | (d[2] << 8) | d[3]) >>> 0;
}

const hex8 = (n) => n.toString(16).padStart(8, "0");

/** A vkey `<name>+<key ID>+<base64(type || key)>` of a known type, its key ID checked:
 * `{name, sigType, publicKey, keyId}`. */
export function parseVkey(vkey) {
  const first = vkey.indexOf("+");
  const second = first < 0 ? -1 : vkey.indexOf("+", first + 1);
  if (second < 0 || !/^[0-9a-f]{8}$/.test(vkey.slice(first + 1, second))) {
    throw new NoteError(`not name+keyid+key: ${repr(vkey)}`);
  }
  const name = vkey.slice(0, first);
  let blob;
  try {
    blob = b64decodeStrict(vkey.slice(second + 1));
  } catch (e) {
    throw new NoteError(e.message);
  }
  if (!blob.length) throw new NoteError("empty key");
  if (!validKeyName(name)) throw new NoteError(`invalid key name ${repr(name)}`);
  const sigType = blob[0];
  const publicKey = blob.subarray(1);
  const size = KEY_SIZES[sigType];
  if (size === undefined) throw new NoteError(`unsupported signature type 0x${sigType.toString(16).padStart(2, "0")}`);
  if (publicKey.length !== size) throw new NoteError(`public key of ${publicKey.length} bytes, not ${size}`);
  const id = keyId(name, sigType, publicKey);
  if (id !== parseInt(vkey.slice(first + 1, second), 16)) {
    throw new NoteError(`key ID ${vkey.slice(first + 1, second)} is not that of the key`);
  }
  return { name, sigType, publicKey, keyId: id, vkey };
}

export function ed25519Verify(publicKey, signature, message) {
  if (signature.length !== 64) return false;
  try {
    return ed25519.verify(signature, message, publicKey, { zip215: false });
  } catch {
    return false;
  }
}

/** A verifier of a vkey: `{name, keyId, verify(textBytes, signatureBytes) -> bool}`, for a
 * log key (type 0x01, `kind` "log") or a witness key (type 0x04, "witness"). */
export function verifier(vkey, kind) {
  const key = typeof vkey === "string" ? parseVkey(vkey.trim()) : vkey;
  if (kind === "log" && key.sigType !== ED25519) throw new NoteError("not an Ed25519 (0x01) note key");
  if (kind === "witness" && key.sigType !== ED25519_COSIGNATURE) throw new NoteError("not an Ed25519 cosignature (0x04) key");
  const verify =
    key.sigType === ED25519
      ? (text, sig) => ed25519Verify(key.publicKey, sig, text)
      : (text, sig) => {
          let ts;
          try {
            ts = cosignatureTimestamp(sig);
          } catch {
            return false;
          }
          const body = decodeUtf8(text);
          if (body === null) return false;
          return ed25519Verify(key.publicKey, sig.subarray(8), cosignatureMessage(body, ts));
        };
  return { name: key.name, keyId: key.keyId, key, verify };
}

function parseSignatureLine(line) {
  if (!line.startsWith(SIGNATURE_PREFIX)) throw new NoteError(`not a signature line: ${repr(line)}`);
  const rest = line.slice(SIGNATURE_PREFIX.length);
  const space = rest.indexOf(" ");
  const name = space < 0 ? rest : rest.slice(0, space);
  if (space < 0 || !validKeyName(name)) throw new NoteError(`invalid key name in ${repr(line)}`);
  let blob;
  try {
    blob = b64decodeStrict(rest.slice(space + 1));
  } catch (e) {
    throw new NoteError(e.message);
  }
  if (blob.length < 5) throw new NoteError(`signature too short in ${repr(line)}`);
  const id = ((blob[0] << 24) | (blob[1] << 16) | (blob[2] << 8) | blob[3]) >>> 0;
  return { name, keyId: id, signature: blob.subarray(4) };
}

/** The text and signature lines of a signed note (bytes), checked for syntax only. */
export function parseNote(bytes) {
  const decoded = decodeUtf8(bytes);
  if (decoded === null) throw new NoteError("a note must be valid UTF-8");
  if (CONTROL.test(decoded)) throw new NoteError("a note must not hold control characters but newline");
  const split = decoded.lastIndexOf("\n\n");
  if (split < 0) throw new NoteError("no blank line before the signatures");
  const text = decoded.slice(0, split + 1);
  const sigs = decoded.slice(split + 2);
  if (!sigs.endsWith("\n")) throw new NoteError("the signatures must end in a newline");
  const lines = sigs.slice(0, -1).split("\n");
  if (lines.length > MAX_SIGNATURES) throw new NoteError(`more than ${MAX_SIGNATURES} signatures`);
  return { text, signatures: lines.map(parseSignatureLine) };
}

const sameSig = (a, b) => a.name === b.name && a.keyId === b.keyId && a.signature.length === b.signature.length && a.signature.every((x, i) => x === b.signature[i]);

/** Open a note with known `verifiers`: `{text, verified, unverified}`; a known key's bad
 * signature or no verified signature at all throws (formats/note.py `open_note`). */
export function openNote(bytes, verifiers) {
  const known = new Map();
  for (const v of verifiers) {
    const k = `${v.name}\n${v.keyId}`;
    if (known.has(k)) throw new NoteError(`two verifiers for the key ${v.name}+${hex8(v.keyId)}`);
    known.set(k, v);
  }
  const note = parseNote(bytes);
  const text = utf8Bytes(note.text);
  const verified = [];
  const unverified = [];
  for (const sig of note.signatures) {
    const v = known.get(`${sig.name}\n${sig.keyId}`);
    if (!v) {
      if (!unverified.some((s) => sameSig(s, sig))) unverified.push(sig);
      continue;
    }
    if (!v.verify(text, sig.signature)) throw new NoteError(`invalid signature for key ${sig.name}+${hex8(sig.keyId)}`);
    if (!verified.some((s) => sameSig(s, sig))) verified.push(sig);
  }
  if (!verified.length) {
    const e = new NoteError("the note has no signature from a known key");
    e.unverified = true;
    throw e;
  }
  return { text: note.text, verified, unverified };
}

/** A checkpoint body: `{origin, size (BigInt), root (32 bytes), extensions}`. */
export function parseCheckpoint(body) {
  if (!body.endsWith("\n")) throw new NoteError("a checkpoint body ends in a newline");
  const lines = body.slice(0, -1).split("\n");
  if (lines.length < 3) throw new NoteError("a checkpoint body has at least three lines");
  const [origin, size, root, ...extensions] = lines;
  if (!/^(0|[1-9][0-9]*)$/.test(size)) throw new NoteError(`tree size ${repr(size)} is not a decimal without leading zero`);
  let rootHash;
  try {
    rootHash = b64decodeStrict(root);
  } catch (e) {
    throw new NoteError(e.message);
  }
  for (const line of [origin, ...extensions]) {
    if (!line || /[\x00-\x1f]/.test(line)) throw new NoteError(`empty line or control character in ${repr(line)}`);
  }
  const n = BigInt(size);
  if (n > MAX_TREE_SIZE) throw new NoteError(`tree size ${size} out of range`);
  if (rootHash.length !== 32) throw new NoteError(`root hash of ${rootHash.length} bytes, not 32`);
  if (n === 0n && !rootHash.every((b, i) => b === EMPTY_ROOT[i])) {
    throw new NoteError("the root of the empty tree is SHA-256 of the empty string");
  }
  return { origin, size: n, root: rootHash, extensions };
}

/** The timestamp (a Number of seconds) of a cosignature's bytes after the key ID. */
export function cosignatureTimestamp(signature) {
  if (signature.length !== 72) throw new NoteError(`cosignature of ${signature.length} bytes, not 72`);
  let t = 0n;
  for (let i = 0; i < 8; i++) t = (t << 8n) | BigInt(signature[i]);
  if (t > MAX_TIMESTAMP) throw new NoteError(`cosignature timestamp ${t} above 2**63 - 1`);
  return t;
}

export function cosignatureMessage(body, timestamp) {
  return utf8Bytes(`cosignature/v1\ntime ${timestamp}\n${body}`);
}
