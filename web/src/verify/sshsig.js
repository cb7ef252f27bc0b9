// SSH signatures (SSHSIG, OpenSSH's PROTOCOL.sshsig) checked in the browser, as
// `ssh-keygen -Y verify -n stampd` checks a receipt or manifest with an allowed-signers file of
// one key: ed25519 and ECDSA P-256/P-384/P-521 keys with @noble/curves, RSA keys (rsa-sha2-256
// and rsa-sha2-512 signatures, as OpenSSH requires for SSHSIG) with WebCrypto.
import { ed25519 } from "@noble/curves/ed25519.js";
import { p256, p384, p521 } from "@noble/curves/nist.js";
import { sha256, sha384, sha512 } from "@noble/hashes/sha2.js";

import { Unsupported, b64decodeStrict, concatBytes, equalBytes, utf8Bytes } from "./result.js";

const KEY_TYPES = ["ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa"];
const ECDSA = {
  "ecdsa-sha2-nistp256": { curve: p256, hash: sha256, size: 32 },
  "ecdsa-sha2-nistp384": { curve: p384, hash: sha384, size: 48 },
  "ecdsa-sha2-nistp521": { curve: p521, hash: sha512, size: 66 },
};
const HASHES = { sha256, sha512 };
export const SSH_BEGIN = "-----BEGIN SSH SIGNATURE-----";
export const SSH_END = "-----END SSH SIGNATURE-----";
// The SSHSIG namespace of receipts and manifests (docs/receipts.md)
export const NAMESPACE = "stampd";

class Reader {
  constructor(bytes) {
    this.bytes = bytes;
    this.at = 0;
  }

  string() {
    if (this.at + 4 > this.bytes.length) throw new Error("truncated");
    const b = this.bytes;
    const n = ((b[this.at] << 24) | (b[this.at + 1] << 16) | (b[this.at + 2] << 8) | b[this.at + 3]) >>> 0;
    this.at += 4;
    if (this.at + n > b.length) throw new Error("truncated");
    const out = b.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }

  uint32() {
    const b = this.bytes;
    if (this.at + 4 > b.length) throw new Error("truncated");
    const n = ((b[this.at] << 24) | (b[this.at + 1] << 16) | (b[this.at + 2] << 8) | b[this.at + 3]) >>> 0;
    this.at += 4;
    return n;
  }

  get done() {
    return this.at === this.bytes.length;
  }
}

function sshString(bytes) {
  const n = bytes.length;
  return concatBytes(new Uint8Array([n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255]), bytes);
}

const ascii = (bytes) => String.fromCharCode(...bytes);

/** `SHA256:<base64, unpadded>` of a public key blob, as `ssh-keygen -l` prints it. */
export function sshFingerprint(blob) {
  let bin = "";
  for (const b of sha256(blob)) bin += String.fromCharCode(b);
  return "SHA256:" + btoa(bin).replace(/=+$/, "");
}

/** SSH public keys in `.pub` or allowed-signers text (options and principals before the key
 * type skipped), as client/verify/keys.py `ssh_keys_from` reads them: `[{type, blob,
 * fingerprint}]`. */
export function sshKeysFrom(text) {
  const keys = [];
  for (const line of text.split(/\r?\n/)) {
    const words = line.split(/\s+/).filter(Boolean);
    const i = words.findIndex((w) => KEY_TYPES.includes(w));
    if (i < 0 || i + 1 >= words.length) continue;
    try {
      const blob = b64decodeStrict(words[i + 1]);
      if (ascii(new Reader(blob).string()) !== words[i]) continue;
      keys.push({ type: words[i], blob, fingerprint: sshFingerprint(blob) });
    } catch {
      // not a key
    }
  }
  return keys;
}

const SPACE = " \t\n\v\f\r";
const B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/** OpenBSD's b64_pton, as ssh-keygen decodes a signature: white space skipped anywhere, "="
 * padding only at the end (then only white space), the bits past the last byte zero. */
function b64pton(text) {
  const out = [];
  let state = 0;
  let i = 0;
  let ch = "";
  let partial = 0;
  for (; i < text.length; i++) {
    ch = text[i];
    if (SPACE.includes(ch)) continue;
    if (ch === "=") break;
    const v = B64.indexOf(ch);
    if (v < 0) throw new Error("invalid base64");
    if (state === 0) partial = v << 2;
    else if (state === 1) {
      out.push(partial | (v >> 4));
      partial = (v & 0x0f) << 4;
    } else if (state === 2) {
      out.push(partial | (v >> 2));
      partial = (v & 0x03) << 6;
    } else out.push(partial | v);
    if (state === 3) partial = 0;
    state = (state + 1) % 4;
  }
  if (i < text.length) {
    // at a "=": the rest is padding and white space
    if (state < 2) throw new Error("invalid base64 padding");
    i += 1;
    if (state === 2) {
      while (i < text.length && SPACE.includes(text[i])) i++;
      if (text[i] !== "=") throw new Error("invalid base64 padding");
      i += 1;
    }
    for (; i < text.length; i++) if (!SPACE.includes(text[i])) throw new Error("data after the base64 padding");
    if (partial & 0xff) throw new Error("non-zero bits after the base64 data");
  } else if (state !== 0) {
    throw new Error("truncated base64");
  }
  return new Uint8Array(out);
}

/** The signature blob of an armored SSH signature, as ssh-keygen (sshsig_dearmor) reads it:
 * the base64 between the begin line and the first end marker. */
function unarmor(armored) {
  const text = armored.replace(/\r\n/g, "\n");
  if (!text.startsWith(SSH_BEGIN)) throw new Error("missing header");
  const end = text.indexOf(SSH_END, SSH_BEGIN.length);
  if (end < 0) throw new Error("missing footer");
  return b64pton(text.slice(SSH_BEGIN.length, end));
}

function mpint(bytes, size) {
  // an SSH mpint: big-endian, a leading zero byte when the top bit is set; to `size` bytes
  let b = bytes;
  while (b.length > 0 && b[0] === 0) b = b.subarray(1);
  if (b.length > size) throw new Error("ECDSA signature value too large");
  const out = new Uint8Array(size);
  out.set(b, size - b.length);
  return out;
}

function b64url(bytes) {
  let b = bytes;
  while (b.length > 1 && b[0] === 0) b = b.subarray(1); // (an mpint's sign byte)
  let bin = "";
  for (const x of b) bin += String.fromCharCode(x);
  return btoa(bin).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

const RSA_HASHES = { "rsa-sha2-256": "SHA-256", "rsa-sha2-512": "SHA-512" };
const RSA_MIN_BITS = 1024; // OpenSSH's SSH_RSA_MINIMUM_MODULUS_SIZE

/** An RSA PKCS#1 v1.5 signature (`type` rsa-sha2-256 or -512) by the ssh-rsa `keyBlob`. */
async function verifyRsa(keyBlob, type, signature, signed) {
  const hash = RSA_HASHES[type];
  if (!hash) throw new Error(`an RSA signature of type ${type}: SHA-2 signatures only`);
  const k = new Reader(keyBlob);
  k.string();
  const e = k.string();
  const n = k.string();
  let modulus = n;
  while (modulus.length && modulus[0] === 0) modulus = modulus.subarray(1);
  if (modulus.length * 8 < RSA_MIN_BITS) throw new Error(`an RSA key of fewer than ${RSA_MIN_BITS} bits`);
  if (signature.length > modulus.length) throw new Error("an RSA signature longer than the key");
  const padded = new Uint8Array(modulus.length); // (OpenSSH takes a shorter one, left-padded)
  padded.set(signature, modulus.length - signature.length);
  if (!globalThis.crypto?.subtle) {
    // (WebCrypto exists in secure contexts only: a page served over https or from localhost)
    throw new Unsupported("an SSH RSA signature needs WebCrypto, which this browser offers only to pages served over https; check it with ssh-keygen -Y verify");
  }
  const algorithm = { name: "RSASSA-PKCS1-v1_5", hash };
  const publicKey = await crypto.subtle.importKey("jwk", { kty: "RSA", n: b64url(n), e: b64url(e), ext: true }, algorithm, false, ["verify"]);
  return crypto.subtle.verify(algorithm, publicKey, padded, signed);
}

/**
 * Check an armored SSHSIG over `message` (bytes) in `namespace` by `key` (from `sshKeysFrom`).
 * `{ok: true}` or `{ok: false, reason}` (why it does not verify).
 */
export async function verifySshsig(key, namespace, message, armored) {
  let sig;
  try {
    const r = new Reader(unarmor(armored));
    const magic = r.bytes.subarray(0, 6);
    r.at = 6;
    if (ascii(magic) !== "SSHSIG") throw new Error("not an SSHSIG");
    const version = r.uint32();
    if (version !== 1) throw new Error(`SSHSIG version ${version}`);
    sig = { publicKey: r.string(), namespace: ascii(r.string()), reserved: r.string(), hash: ascii(r.string()), signature: r.string() };
    if (!r.done) throw new Error("trailing bytes");
  } catch (e) {
    return { ok: false, reason: `it cannot be read: ${e.message}` };
  }
  if (!equalBytes(sig.publicKey, key.blob)) {
    return { ok: false, reason: `it is made by another key than ${key.fingerprint}` };
  }
  if (sig.namespace !== namespace) {
    return { ok: false, reason: `it is in namespace ${JSON.stringify(sig.namespace)}, not ${JSON.stringify(namespace)}` };
  }
  const hash = HASHES[sig.hash];
  if (!hash) return { ok: false, reason: `it uses hash ${JSON.stringify(sig.hash)}` };
  const signed = concatBytes(
    utf8Bytes("SSHSIG"),
    sshString(utf8Bytes(namespace)),
    sshString(sig.reserved),
    sshString(utf8Bytes(sig.hash)),
    sshString(hash(message)),
  );
  let good = false;
  try {
    const s = new Reader(sig.signature);
    const type = ascii(s.string());
    const raw = s.string();
    const k = new Reader(key.blob);
    k.string();
    const fits = key.type === "ssh-rsa" ? type in RSA_HASHES : type === key.type;
    if (!fits || !s.done) throw new Error(`a ${type} signature for a ${key.type} key`);
    if (key.type === "ssh-rsa") {
      good = await verifyRsa(key.blob, type, raw, signed);
    } else if (key.type === "ssh-ed25519") {
      const pub = k.string();
      good = raw.length === 64 && ed25519.verify(raw, signed, pub, { zip215: false });
    } else {
      const { curve, hash: h, size } = ECDSA[key.type];
      k.string(); // the curve's name
      const point = k.string();
      const rs = new Reader(raw);
      const compact = concatBytes(mpint(rs.string(), size), mpint(rs.string(), size));
      good = curve.verify(compact, h(signed), point, { prehash: false, lowS: false });
    }
  } catch (e) {
    if (e instanceof Unsupported) throw e;
    return { ok: false, reason: e.message };
  }
  return good ? { ok: true } : { ok: false, reason: "bad signature" };
}
