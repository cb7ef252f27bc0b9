// One OpenPGP signature over a text, checked against trusted public keys with openpgp.js: what
// `stampd verify` has gpg check in a temporary keyring holding only those keys
// (client/verify/keys.py `only_signature`), with the same refusals.
import * as openpgp from "openpgp";

import { Malformed, b64encode } from "./result.js";

/** The OpenPGP public keys of armored `texts` (a string or a list of strings); `Malformed`
 * naming `origin` when there is none. */
export const BEGIN_SIGNED = "-----BEGIN PGP SIGNED MESSAGE-----";
export const BEGIN_SIG = "-----BEGIN PGP SIGNATURE-----";
export const END_SIG = "-----END PGP SIGNATURE-----";

export async function readPublicKeys(texts, origin) {
  const list = (Array.isArray(texts) ? texts : [texts]).filter((t) => typeof t === "string" && t.trim());
  const keys = [];
  for (const text of list) {
    // one armored block after another, as a key file may hold them
    const blocks = text.match(/-----BEGIN PGP PUBLIC KEY BLOCK-----[\s\S]*?-----END PGP PUBLIC KEY BLOCK-----/g) ?? [];
    for (const block of blocks) {
      try {
        keys.push(...(await openpgp.readKeys({ armoredKeys: block })));
      } catch {
        // an unreadable block is no key (gpg --import skips it likewise)
      }
    }
  }
  if (keys.length === 0) throw new Malformed(`the ${origin} holds no OpenPGP public key`);
  return keys;
}

/** The (upper-case hex) fingerprints of every key and subkey of `keys`. */
export function fingerprints(keys) {
  return new Set(keys.flatMap((k) => k.getKeys().map((s) => s.getFingerprint().toUpperCase())));
}

function crc24(bytes) {
  let crc = 0xb704ce;
  for (const b of bytes) {
    crc ^= b << 16;
    for (let i = 0; i < 8; i++) {
      crc <<= 1;
      if (crc & 0x1000000) crc ^= 0x1864cfb;
    }
  }
  return crc & 0xffffff;
}

/** The bytes of an armored signature block, read as gpg reads it (stampd verify's gpg; openpgp.js
 * alone is more lenient, and ignores the checksum): armor headers ("Name: value"), an empty
 * line, base64 lines (spaces, tabs and CRs ignored, empty lines skipped) padded only at their end, up
 * to a line of dashes or a CRC-24 line ("=", four base64 characters after any spaces, the
 * rest ignored) that must match; what follows it up to the end line is ignored. Throws `Error`
 * naming what is wrong. (Found line by line against gpg: tests/system/test_web_verify_core.py,
 * `armor_variants`. One known difference, on the safe side: gpg skips some other control
 * characters in the base64, which a manifest may hold; here they make the block unreadable.) */
export function dearmorSignature(armored) {
  const lines = armored.replace(/\n+$/, "").split("\n");
  if (lines[0] !== BEGIN_SIG || !lines[lines.length - 1].endsWith(END_SIG)) {
    throw new Error("not one armored signature block");
  }
  const squeeze = (line) => line.replace(/[ \t\r]/g, "");
  let i = 1;
  while (i < lines.length - 1 && squeeze(lines[i]) !== "") {
    if (!/^[^\s:]+: /.test(lines[i])) throw new Error(`bad armor header ${JSON.stringify(lines[i].slice(0, 80))}`);
    i += 1;
  }
  if (i >= lines.length - 1) throw new Error("no empty line after the armor headers");
  let text = "";
  let crc = null;
  for (i += 1; i < lines.length; i++) {
    if (lines[i].startsWith("-----")) break;
    if (lines[i].startsWith("=")) {
      crc = /^[ \t\r]*([A-Za-z0-9+/]{4})/.exec(lines[i].slice(1))?.[1];
      if (!crc) throw new Error("a bad checksum line in the signature block");
      break;
    }
    const line = squeeze(lines[i]);
    if (!/^[A-Za-z0-9+/]*={0,2}$/.test(line) || (line && text.includes("="))) {
      throw new Error("invalid base64 in the signature block");
    }
    text += line;
  }
  if (text.length % 4 !== 0) throw new Error("invalid base64 in the signature block");
  const bin = atob(text);
  const data = new Uint8Array(bin.length);
  for (let j = 0; j < bin.length; j++) data[j] = bin.charCodeAt(j);
  if (crc !== null) {
    const c = crc24(data);
    if (b64encode(new Uint8Array([c >> 16, (c >> 8) & 255, c & 255])) !== crc) throw new Error("CRC error in the signature block");
  }
  return data;
}

function keyIdHex(keyID) {
  return keyID.toHex().toUpperCase();
}

/**
 * Check the armored detached `armoredSignature` over `signedBytes` (the canonical text a
 * cleartext signature covers) with `keys`. Returns `{ok: true, fingerprint, primary, sigClass,
 * created}` for exactly one good signature by one of `keys`, else `{ok: false, reason}` with
 * `stampd verify`'s words.
 */
export async function checkDetached(signedBytes, armoredSignature, keys) {
  let signature;
  try {
    signature = await openpgp.readSignature({ binarySignature: dearmorSignature(armoredSignature) });
  } catch (e) {
    return { ok: false, reason: `signature does not verify: the signature block cannot be read (${e.message})` };
  }
  if (signature.packets.length !== 1) {
    return { ok: false, reason: "more than one signature (only one is allowed)" };
  }
  const packet = signature.packets[0];
  const message = await openpgp.createMessage({ binary: signedBytes });
  let verification;
  try {
    const out = await openpgp.verify({ message, signature, verificationKeys: keys, format: "binary" });
    verification = out.signatures[0];
    await verification.verified;
  } catch (e) {
    const id = packet.issuerKeyID ? keyIdHex(packet.issuerKeyID) : "unknown";
    const known = keys.some((k) => k.getKeys(packet.issuerKeyID).length > 0);
    if (!known) {
      return {
        ok: false,
        reason: `signature does not verify: no public key for key ID ${id} (signed by a key that is not the expected one?)`,
      };
    }
    return { ok: false, reason: `signature does not verify: bad signature by key ID ${id} (${e.message})` };
  }
  const key = keys.find((k) => k.getKeys(verification.keyID).length > 0);
  const signing = key.getKeys(verification.keyID)[0];
  return {
    ok: true,
    fingerprint: signing.getFingerprint().toUpperCase(),
    primary: key.getFingerprint().toUpperCase(),
    sigClass: packet.signatureType.toString(16).padStart(2, "0"),
    created: Math.floor(packet.created.getTime() / 1000),
  };
}

/** The bytes a cleartext signature covers (formats/cleartext.py `canonical_text`): CR LF line
 * ends, trailing spaces and tabs removed, no final line ending. */
export function canonicalText(text) {
  const lines = text.split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  return new TextEncoder().encode(lines.map((l) => l.replace(/[ \t\r]+$/, "")).join("\r\n"));
}
