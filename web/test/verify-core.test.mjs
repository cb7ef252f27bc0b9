// The verify core (web/src/verify) on real artifacts of a real stampd server: receipts,
// manifests and .tlog-proofs, good and tampered, each with what it must give.
//
// tests/system/test_web_verify_core.py makes them and runs this file:
//   STAMPD_WEB_VERIFY_CASES=<dir>/cases.json node --test --test-reporter=tap web/test/verify-core.test.mjs
// cases.json: {"cases": [{id, type: "receipt"|"manifest", receipt|manifest, keys: [files],
// file?, files?: {name: path}, digest?, proof?, logKey?, policy?, expect: {ok, check?,
// reason?, contains?}}]}, paths relative to the file's folder, and named so in messages (as
// `stampd verify`, run from that folder, names them). Each case's result (ok, kind,
// reason) is written to results.json beside it, for the test to compare with `stampd verify`.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { after, test } from "node:test";

import { verifyManifest } from "../src/verify/manifest.js";
import { parseReceipt, verifyReceipt } from "../src/verify/receipt.js";
import { heldManifest, heldReceipt, verifyTlogProof } from "../src/verify/tlog.js";

const casesFile = process.env.STAMPD_WEB_VERIFY_CASES;
if (!casesFile) throw new Error("STAMPD_WEB_VERIFY_CASES names no cases.json (tests/system/test_web_verify_core.py makes it)");
const root = dirname(casesFile);
const { cases } = JSON.parse(readFileSync(casesFile, "utf8"));
const at = (p) => join(root, p);
const read = (p) => new Uint8Array(readFileSync(at(p)));
const text = (p) => readFileSync(at(p), "utf8");
const digestOf = (p, algorithm) => createHash(algorithm).update(readFileSync(at(p))).digest("hex");
const results = {};

/** One case as the verify page would run it: the receipt or manifest, then its proof. */
async function run(c) {
  const keys = c.keys.map(text);
  const keyOrigin = `key file ${c.keys.join(", ")}`;
  let result;
  let held;
  try {
    if (c.type === "receipt") {
      const bytes = read(c.receipt);
      const { statement } = parseReceipt(bytes);
      const file = c.file ? { name: c.file, digests: { [statement.algorithm]: digestOf(c.file, statement.algorithm) } } : null;
      result = await verifyReceipt({ receipt: bytes, keys, keyOrigin, file, digest: c.digest ?? null });
      if (result.ok) held = heldReceipt(result);
    } else {
      const bytes = read(c.manifest);
      const files = c.files ? new Map(Object.entries(c.files).map(([name, p]) => [name, digestOf(p, c.algorithm ?? "sha256")])) : null;
      result = await verifyManifest({ manifest: bytes, keys, keyOrigin, files, digest: c.digest ?? null });
      if (result.ok) held = heldManifest(result, bytes);
    }
    if (result.ok && c.proof) {
      const proof = verifyTlogProof({
        proof: read(c.proof),
        held,
        source: c.proof,
        logKeys: c.logKey ? [c.logKey] : [],
        keyOrigin: "given with --log-key",
        policy: c.policy ? read(c.policy) : null,
        policyOrigin: c.policy ?? "policy",
      });
      result = { ...proof, checks: [...result.checks, ...proof.checks] };
    }
  } catch (e) {
    if (!e.kind) throw e;
    result = { ok: false, kind: e.kind, reason: e.message, checks: [], thrown: e.name };
  }
  return result;
}

for (const c of cases) {
  test(c.id, async () => {
    const r = await run(c);
    results[c.id] = { ok: r.ok, kind: r.kind, reason: r.reason, checks: r.checks };
    const failed = r.checks.filter((x) => !x.ok).map((x) => x.name);
    const shown = JSON.stringify({ reason: r.reason, failed });
    assert.equal(r.ok, c.expect.ok, `${c.id}: ${shown}`);
    assert.equal(r.kind, r.ok ? "valid" : c.expect.kind ?? "invalid", `${c.id}: ${shown}`);
    if (r.ok) {
      assert.equal(r.reason, null);
      assert.ok(r.checks.length > 0 && r.checks.every((x) => x.ok && x.detail));
    } else {
      if (c.expect.check) assert.ok(failed.includes(c.expect.check), `${c.id}: failed ${failed}, not ${c.expect.check}: ${shown}`);
      if (c.expect.reason) assert.equal(r.reason, c.expect.reason);
      for (const part of c.expect.contains ?? []) assert.ok(r.reason.includes(part), `${c.id}: ${JSON.stringify(part)} not in ${r.reason}`);
    }
  });
}

after(() => {
  writeFileSync(join(root, "results.json"), JSON.stringify(results, null, 1));
});
