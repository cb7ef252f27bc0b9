// The verify core (web/src/verify) on the worked examples of docs/transparency-formats.md and
// docs/receipts.md, read from the docs themselves (so the docs and the browser cannot drift),
// and on refusals made from them. No server: `node --test web/test/vectors.test.mjs`.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { compareFiles, parseLine, parseManifest } from "../src/verify/manifest.js";
import { ed25519 } from "@noble/curves/ed25519.js";

import { NoteError, keyId, openNote, parseCheckpoint, parseVkey, verifier } from "../src/verify/note.js";
import { parseReceipt, verifyReceipt } from "../src/verify/receipt.js";
import { Malformed, b64encode } from "../src/verify/result.js";
import { checkPolicy, leafHash, parsePolicy, parseProofBytes, verifyInclusion } from "../src/verify/tlog.js";

const root = join(dirname(fileURLToPath(import.meta.url)), "../..");
const formats = readFileSync(join(root, "docs/transparency-formats.md"), "utf8");
const receipts = readFileSync(join(root, "docs/receipts.md"), "utf8");
const testKey = readFileSync(join(root, "tests/data/test-pubkey.asc"), "utf8");
const enc = (s) => new TextEncoder().encode(s);

const LOG_VKEY = formats.match(/\n {4}(stampd\.example\/log\+[0-9a-f]{8}\+\S+)\n/)[1];
const WITNESS_VKEY = formats.match(/`(witness\.example\/w1\+[0-9a-f]{8}\+\S+)`/)[1];
// the .tlog-proof of `stamp 1`: the indented block after "Example, the proof of"
const PROOF = (() => {
  const at = formats.indexOf("    c2sp.org/tlog-proof@v1\n    index 1");
  const end = formats.indexOf("\n\nverifies as", at);
  return formats.slice(at, end).split("\n").map((l) => l.slice(4)).join("\n") + "\n";
})();

test("the docs' proof of stamp 1 verifies: log signature, cosignature, inclusion", () => {
  const p = parseProofBytes(enc(PROOF));
  assert.equal(p.index, 1n);
  const opened = openNote(p.checkpoint, [verifier(LOG_VKEY, "log"), verifier(WITNESS_VKEY, "witness")]);
  assert.deepEqual(opened.verified.map((s) => s.name), ["stampd.example/log", "witness.example/w1"]);
  const cp = parseCheckpoint(opened.text);
  assert.equal(cp.size, 3n);
  verifyInclusion(leafHash(enc("stamp 1")), p.index, cp.size, p.hashes, cp.root);
  assert.throws(() => verifyInclusion(leafHash(enc("stamp 2")), p.index, cp.size, p.hashes, cp.root), /does not lead to the root/);
  assert.throws(() => verifyInclusion(leafHash(enc("stamp 1")), 2n, cp.size, p.hashes, cp.root), /longer than the path/);
  assert.throws(() => verifyInclusion(leafHash(enc("stamp 1")), 3n, cp.size, p.hashes, cp.root), /index 3 not in a tree of size 3/);
  assert.throws(() => verifyInclusion(leafHash(enc("stamp 1")), p.index, cp.size, p.hashes.slice(1), cp.root), /shorter than the path/);
});

test("a changed checkpoint or signature byte is refused; unknown signers are set aside", () => {
  const changed = PROOF.replace("\n3\n", "\n4\n");
  const p = parseProofBytes(enc(changed));
  assert.throws(() => openNote(p.checkpoint, [verifier(LOG_VKEY, "log")]), /invalid signature for key stampd\.example\/log\+a0cdd061/);
  const good = parseProofBytes(enc(PROOF));
  const opened = openNote(good.checkpoint, [verifier(LOG_VKEY, "log")]);
  assert.equal(opened.unverified.length, 1);
  const cosigOnly = PROOF.replace("d2mk5wAAAABlU/EAgDap", "d2mk5wAAAABlU/EAgDaq");
  assert.throws(() => openNote(parseProofBytes(enc(cosigOnly)).checkpoint, [verifier(LOG_VKEY, "log"), verifier(WITNESS_VKEY, "witness")]), /invalid signature for key witness\.example\/w1/);
});

test("verifier keys: the key ID is checked, and the type", () => {
  assert.equal(parseVkey(LOG_VKEY).keyId, 0xa0cdd061);
  assert.throws(() => parseVkey(LOG_VKEY.replace("+a0cdd061+", "+a0cdd062+")), /key ID a0cdd062 is not that of the key/);
  assert.throws(() => verifier(WITNESS_VKEY, "log"), NoteError);
  assert.throws(() => parseVkey("x+00000000+AQ="), NoteError);
});

test("a policy's quorum: met by the docs' witness, not by two", () => {
  const good = parseProofBytes(enc(PROOF));
  const policy = parsePolicy(`log ${LOG_VKEY}\nwitness w1 ${WITNESS_VKEY}\nquorum w1\n`);
  const w = checkPolicy(policy, good.checkpoint);
  assert.ok(w.quorumHolds);
  assert.equal(w.quorumTime, 1700000000);
  const public2 = ed25519.getPublicKey(new Uint8Array(32).fill(7));
  const w2 = `w2.example+${keyId("w2.example", 4, public2).toString(16).padStart(8, "0")}+${b64encode(new Uint8Array([4, ...public2]))}`;
  const two = parsePolicy(`log ${LOG_VKEY}\nwitness w1 ${WITNESS_VKEY}\nwitness w2 ${w2}\ngroup both all w1 w2\nquorum both\n`);
  const notMet = checkPolicy(two, good.checkpoint);
  assert.equal(notMet.quorumHolds, false);
  assert.deepEqual([...notMet.cosigned.keys()], ["w1"]);
  assert.throws(() => parsePolicy(`log ${LOG_VKEY}\nquorum w1\n`), /policy line 2: quorum 'w1' is not a witness or group defined above/);
  assert.throws(() => parsePolicy(`log ${LOG_VKEY}\n`), /a policy has a quorum line/);
  assert.throws(() => parsePolicy(`log ${WITNESS_VKEY}\nquorum none\n`), /policy line 1: a log key is of signature type 0x01, not 0x04/);
});

test("the docs' receipt verifies with the test key; a changed statement does not", async () => {
  const at = receipts.indexOf("-----BEGIN PGP SIGNED MESSAGE-----", receipts.indexOf("A real receipt"));
  const receipt = receipts.slice(at, receipts.indexOf("-----END PGP SIGNATURE-----", at) + 28);
  const digest = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03";
  const r = await verifyReceipt({ receipt, keys: testKey, keyOrigin: "key file test-pubkey.asc", digest });
  assert.equal(r.ok, true, r.reason);
  assert.equal(r.statement.serial, "1");
  const bad = await verifyReceipt({ receipt: receipt.replace("serial: 1", "serial: 2"), keys: testKey });
  assert.equal(bad.ok, false);
  assert.match(bad.reason, /^signature does not verify: bad signature/);
  const other = await verifyReceipt({ receipt, keys: testKey, digest: "00".repeat(32) });
  assert.equal(other.reason, `the receipt is for ${digest}, not ${"00".repeat(32)}`);
});

test("the docs' SSH receipt verifies with the key inside its signature, and only that key", async () => {
  const at = receipts.indexOf("stampd receipt v1\n", receipts.indexOf("An example with a throwaway ed25519 key"));
  const receipt = receipts.slice(at, receipts.indexOf("-----END SSH SIGNATURE-----", at) + 28);
  const sig = receipt.slice(receipt.indexOf("-----BEGIN SSH SIGNATURE-----"));
  const blob = Buffer.from(sig.split("\n").slice(1, -2).join(""), "base64");
  const keyBlob = blob.subarray(14, 14 + blob.readUInt32BE(10)); // SSHSIG, version, string key
  const line = `ssh-ed25519 ${keyBlob.toString("base64")}`;
  const r = await verifyReceipt({ receipt, keys: line, keyOrigin: "key file k.pub" });
  assert.equal(r.ok, true, r.reason);
  assert.equal(r.signer, "SHA256:QHw4tkQgLjyY7LhLMX/VQ5xuK7gmmmznnS/2JK4cac4");
  const changed = await verifyReceipt({ receipt: receipt.replace("serial: 7", "serial: 8"), keys: line, keyOrigin: "key file k.pub" });
  assert.equal(changed.reason, "the SSH signature does not verify: bad signature");
  const other = ed25519.getPublicKey(new Uint8Array(32).fill(9));
  const otherLine = `ssh-ed25519 ${Buffer.concat([Buffer.from([0, 0, 0, 11]), Buffer.from("ssh-ed25519"), Buffer.from([0, 0, 0, 32]), other]).toString("base64")}`;
  const foreign = await verifyReceipt({ receipt, keys: otherLine, keyOrigin: "key file other.pub" });
  assert.equal(foreign.reason, "the receipt names key SHA256:QHw4tkQgLjyY7LhLMX/VQ5xuK7gmmmznnS/2JK4cac4, which is not in the key file other.pub");
});

test("not a receipt or manifest: Malformed, with stampd verify's words", () => {
  const cases = [
    ["hello world\n", "not a cleartext-signed message"],
    ["stampd receipt v1\nalgorithm: sha1\n", "not a receipt with one SSH signature"],
    [new Uint8Array([0xff, 0x00]), "not ASCII text: not a receipt"],
  ];
  for (const [data, message] of cases) {
    assert.throws(() => parseReceipt(data), (e) => e instanceof Malformed && e.message === message && e.kind === "malformed");
  }
  const statement =
    "stampd receipt v1\nalgorithm: sha256\ndigest: " + "ab".repeat(32) + "\ntime: 1795400000\nutc: 2026-11-23T02:13:21Z\n" +
    "server: http://x/\nserial: 1\nkey: " + "A".repeat(40) + "\n-----BEGIN SSH SIGNATURE-----\nAA==\n-----END SSH SIGNATURE-----\n";
  assert.throws(() => parseReceipt(statement), /'utc' and 'time' disagree/);
  const v2 = "-----BEGIN PGP SIGNED MESSAGE-----\nHash: SHA256\n\n# stampd manifest v2\n-----BEGIN PGP SIGNATURE-----\n\n-----END PGP SIGNATURE-----\n";
  assert.throws(() => parseManifest(v2), (e) => e.kind === "unsupported");
  assert.throws(() => parseManifest(v2), { message: "'# stampd manifest v2': only version 1 manifests can be checked" });
  // a byte order mark is kept (as Python decodes): then no cleartext message starts the text,
  // and what follows the text is an OpenPGP signature where an SSH one would be
  assert.throws(() => parseManifest(new Uint8Array([0xef, 0xbb, 0xbf, ...enc(v2)])), {
    message: "the manifest's signature is 'pgp signature'; only OpenPGP and SSH signatures can be checked",
  });
});

test("a manifest's lines and the files given: by name, by base name when unambiguous", () => {
  const d = (c) => c.repeat(64);
  const lines = [`${d("a")} *dist/a.txt`, `${d("b")}  dist/sub/b.txt`, `SHA256 (c.txt) = ${d("c")}`, d("e"), `\\${d("f")} *x\\ny`, `${d("1")} *one/x.txt`, `${d("2")} *two/x.txt`, `${d("3")} *../up.txt`];
  assert.deepEqual(parseLine(lines[4]), { digest: d("f"), name: "x\ny" });
  const manifest = { entries: lines.map((l, i) => ({ line: i + 1, ...parseLine(l) })) };
  const r = compareFiles(manifest, new Map([["a.txt", d("a")], ["dist/sub/b.txt", d("0")], ["c.txt", d("c")], ["x.txt", d("1")], ["extra.bin", d("9")]]));
  assert.deepEqual(r.matched, ["dist/a.txt", "c.txt"]);
  assert.deepEqual(r.changed, [{ name: "dist/sub/b.txt", expected: d("b"), actual: d("0") }]);
  // x.txt: two lines bear that base name, so neither takes it
  assert.deepEqual(r.missing, ["x\ny", "one/x.txt", "two/x.txt"]);
  assert.deepEqual(r.extra, ["x.txt", "extra.bin"]);
  assert.deepEqual(r.unchecked, ["line 4 (no name)", "../up.txt"]);
  assert.equal(r.checked, 6);
});
