// The verify core's parsers and proof check on many inputs at once, for a comparison with
// stampd verify's Python (tests/system/test_web_verify_core.py makes the inputs, runs
// `node web/test/differential.mjs < cases.json`, and compares).
//
// Input: {"cases": [{id, type: "receipt"|"receipt-signature"|"manifest"|"manifest-signature"|"policy"|"proof", data
// (base64), keys?, keyOrigin?, held?, vkey?, policy? (base64), source?}]}. Output: {id: {ok,
// kind, reason}}, where a parse that succeeds is ok, a receipt- or manifest-signature is
// checked whole with `keys` (no file), and a proof is checked as `verifyTlogProof` checks it.
import { readFileSync } from "node:fs";

import { parseManifest, verifyManifest } from "../src/verify/manifest.js";
import { parseReceipt, verifyReceipt } from "../src/verify/receipt.js";
import { PolicyError, parsePolicy, verifyTlogProof } from "../src/verify/tlog.js";

const { cases } = JSON.parse(readFileSync(0, "utf8"));
const bytes = (b64) => new Uint8Array(Buffer.from(b64, "base64"));
const out = {};
for (const c of cases) {
  try {
    if (c.type === "receipt") {
      parseReceipt(bytes(c.data));
      out[c.id] = { ok: true, kind: "valid", reason: null };
    } else if (c.type === "receipt-signature") {
      const r = await verifyReceipt({ receipt: bytes(c.data), keys: [c.keys], keyOrigin: c.keyOrigin });
      out[c.id] = { ok: r.ok, kind: r.kind, reason: r.reason };
    } else if (c.type === "manifest-signature") {
      const r = await verifyManifest({ manifest: bytes(c.data), keys: [c.keys], keyOrigin: c.keyOrigin });
      out[c.id] = { ok: r.ok, kind: r.kind, reason: r.reason };
    } else if (c.type === "policy") {
      try {
        parsePolicy(bytes(c.data));
        out[c.id] = { ok: true, kind: "valid", reason: null };
      } catch (e) {
        if (!(e instanceof PolicyError)) throw e;
        out[c.id] = { ok: false, kind: "malformed", reason: e.message };
      }
    } else if (c.type === "manifest") {
      parseManifest(bytes(c.data));
      out[c.id] = { ok: true, kind: "valid", reason: null };
    } else {
      const r = verifyTlogProof({
        proof: bytes(c.data),
        held: c.held,
        source: c.source,
        logKeys: [c.vkey],
        keyOrigin: "pinned",
        policy: c.policy ? bytes(c.policy) : null,
        policyOrigin: c.policyOrigin,
      });
      out[c.id] = { ok: r.ok, kind: r.kind, reason: r.reason };
    }
  } catch (e) {
    if (!e.kind) throw e;
    out[c.id] = { ok: false, kind: e.kind, reason: e.message };
  }
}
process.stdout.write(JSON.stringify(out));
