// One OpenPGP signature over a text, checked against trusted public keys with openpgp.js: what
// `stampd verify` has gpg check in a temporary keyring holding only those keys
// (client/verify/keys.py `only_signature`), with the same refusals.
import * as openpgp from "openpgp";

import { Malformed } from "./result.js";

/** The OpenPGP public keys of armored `texts` (a string or a list of strings); `Malformed`
 * naming `origin` when there is none. */
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
    signature = await openpgp.readSignature({ armoredSignature });
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
