// Proofs that a stamp is in the server's transparency log (`.tlog-proof`, c2sp.org/tlog-proof@v1,
// docs/transparency-formats.md §5), checked in the browser as `stampd verify ... --log-key
// VKEY [--policy FILE]` checks them (client/verify/tlog.py, formats/tlog/): the entry in the
// `extra` line field by field against the receipt or manifest it goes with, the checkpoint's
// origin and its signature by the log key, the RFC 6962 inclusion proof, and the witnesses'
// cosignatures against a policy's quorum (c2sp.org/tlog-policy) or a list of witness keys.
import { sha256 } from "@noble/hashes/sha2.js";

import {
  ED25519,
  ED25519_COSIGNATURE,
  NoteError,
  cosignatureTimestamp,
  openNote,
  parseCheckpoint,
  parseNote,
  parseVkey,
  verifier,
} from "./note.js";
import { Checks, Malformed, asBytes, b64decodeStrict, concatBytes, decodeSurrogateEscape, equalBytes, hex, repr, utc } from "./result.js";

export const MAX_PROOF = 64 * 1024;
export const MAX_POLICY = 64 * 1024;
const PROOF_HEADER = "c2sp.org/tlog-proof@v1";
const MAX_PROOF_HASHES = 63;
const MAX_TREE_SIZE = 2n ** 63n - 1n;
const MAX_ENTRY = 1024;
const ENTRY_HEADER = "stampd-tlog-entry/v1";
const KINDS = ["tag", "branch", "digest", "manifest", "tsa"];
const GIT_KINDS = ["tag", "branch"];
const DIGEST_ALGORITHMS = { sha1: 40, sha224: 56, sha256: 64, sha384: 96, sha512: 128 };

/** A refusal of the log's formats (formats.tlog.errors.TlogError). */
export class TlogError extends Error {
  constructor(message) {
    super(message);
    this.name = "TlogError";
  }
}

// --- Merkle trees (RFC 6962, formats/tlog/merkle.py) ---------------------------------------

export function leafHash(entry) {
  return sha256(concatBytes(new Uint8Array([0]), entry));
}

export function nodeHash(left, right) {
  return sha256(concatBytes(new Uint8Array([1]), left, right));
}

/** RFC 9162 §2.1.3.2: `proof` leads from `leaf` at `index` to `root` of a tree of `size`
 * leaves (BigInts); throws `TlogError` otherwise. */
export function verifyInclusion(leaf, index, size, proof, root) {
  if (size < 0n || size > MAX_TREE_SIZE) throw new TlogError(`tree size ${size} out of range`);
  if (proof.length > MAX_PROOF_HASHES) throw new TlogError(`proof of ${proof.length} hashes, more than ${MAX_PROOF_HASHES}`);
  for (const h of [...proof, leaf, root]) {
    if (h.length !== 32) throw new TlogError(`hash of ${h.length} bytes, not 32`);
  }
  if (!(index >= 0n && index < size)) throw new TlogError(`index ${index} not in a tree of size ${size}`);
  let fn = index;
  let sn = size - 1n;
  let r = leaf;
  for (const p of proof) {
    if (sn === 0n) throw new TlogError("inclusion proof longer than the path");
    if (fn & 1n || fn === sn) {
      r = nodeHash(p, r);
      while (fn && !(fn & 1n)) {
        fn >>= 1n;
        sn >>= 1n;
      }
    } else {
      r = nodeHash(r, p);
    }
    fn >>= 1n;
    sn >>= 1n;
  }
  if (sn !== 0n) throw new TlogError("inclusion proof shorter than the path");
  if (!equalBytes(r, root)) throw new TlogError("inclusion proof does not lead to the root");
}

// --- the proof text (formats/tlog/proof.py) ------------------------------------------------

/** `{index (BigInt), hashes, checkpoint (bytes), extra (bytes or null)}` of a proof's bytes;
 * `TlogError` when it is not one. */
export function parseProofBytes(data) {
  const bytes = asBytes(data);
  let sep = -1;
  for (let i = 0; i + 1 < bytes.length; i++) {
    if (bytes[i] === 0x0a && bytes[i + 1] === 0x0a) {
      sep = i;
      break;
    }
  }
  const head = sep < 0 ? bytes : bytes.subarray(0, sep);
  if (head.some((b) => b > 0x7f)) throw new TlogError("the proof lines are ASCII");
  if (sep < 0) throw new TlogError("no empty line before the checkpoint");
  const checkpoint = bytes.subarray(sep + 2);
  const lines = new TextDecoder().decode(head).split("\n"); // (ASCII, checked above)
  if (lines[0] !== PROOF_HEADER) throw new TlogError(`the first line is not ${PROOF_HEADER}`);
  const rest = lines.slice(1);
  let extra = null;
  let index;
  let hashes;
  try {
    if (rest.length && rest[0].startsWith("extra ")) extra = b64decodeStrict(rest.shift().slice(6));
    if (!rest.length || !rest[0].startsWith("index ")) throw new TlogError("no index line");
    index = rest.shift().slice(6);
    if (!/^(0|[1-9][0-9]*)$/.test(index)) throw new TlogError(`index ${repr(index)} is not a decimal without leading zero`);
    hashes = rest.map((line) => b64decodeStrict(line));
  } catch (e) {
    if (e instanceof TlogError) throw e;
    throw new TlogError(e.message);
  }
  if (hashes.length > MAX_PROOF_HASHES || hashes.some((h) => h.length !== 32)) {
    throw new TlogError("an inclusion proof is at most 63 hashes of 32 bytes");
  }
  if (extra !== null && extra.length === 0) throw new TlogError("no extra data is written as no extra line");
  try {
    parseNote(checkpoint);
  } catch (e) {
    throw new TlogError(`the checkpoint is not a signed note: ${e.message}`);
  }
  return { index: BigInt(index), hashes, checkpoint, extra };
}

// --- stampd's log entries (formats/tlog/entry.py) ------------------------------------------

function checkEntry(e) {
  if (!KINDS.includes(e.kind)) throw new TlogError(`unknown kind ${repr(e.kind)}`);
  for (const name of ["serial", "time"]) {
    if (BigInt(e[name]) >= 2n ** 63n) throw new TlogError(`${name} out of range`);
  }
  if (!/^([0-9A-F]{40}|[0-9A-F]{64}|SHA256:[A-Za-z0-9+/]{43})$/.test(e.key)) {
    throw new TlogError("key must be a fingerprint (40 or 64 hex digits, or SHA256:...)");
  }
  const gitId = (value, what) => {
    if (![40, 64].includes(value.length) || !/^[0-9a-f]+$/.test(value)) throw new TlogError(`${what} must be 40 or 64 lowercase hex digits`);
  };
  const digest = (algorithm, value) => {
    const width = DIGEST_ALGORITHMS[algorithm];
    if (width === undefined || !Object.hasOwn(DIGEST_ALGORITHMS, algorithm)) throw new TlogError(`unknown digest algorithm ${repr(algorithm)}`);
    if (value.length !== width || !/^[0-9a-f]+$/.test(value)) throw new TlogError(`a ${algorithm} digest is ${width} lowercase hex digits`);
  };
  if (GIT_KINDS.includes(e.kind)) {
    if (e.commit === null) throw new TlogError(`a ${e.kind} entry names its commit`);
    gitId(e.commit, "commit");
    if (e.object !== null) gitId(e.object, "object");
  } else if (e.commit !== null || e.object !== null) {
    throw new TlogError(`a ${e.kind} entry names no git object`);
  }
  if (e.kind === "digest" || e.kind === "tsa") {
    if (e.algorithm === null || e.digest === null) throw new TlogError(`a ${e.kind} entry names its digest`);
    digest(e.algorithm, e.digest);
  } else if (e.algorithm !== null || e.digest !== null) {
    throw new TlogError(`a ${e.kind} entry has no digest line`);
  }
  if (e.kind === "manifest") {
    if (e.signed !== null) digest("sha256", e.signed);
  } else if (e.signed !== null) {
    throw new TlogError(`a ${e.kind} entry has no signed line`);
  }
}

function entryText(e) {
  let text = `${ENTRY_HEADER}\nserial ${e.serial}\nkind ${e.kind}\ntime ${e.time}\nkey ${e.key}\n`;
  if (e.commit !== null) text += `commit ${e.commit}\n`;
  if (e.object !== null) text += `object ${e.object}\n`;
  if (e.digest !== null) text += `digest ${e.algorithm} ${e.digest}\n`;
  if (e.signed !== null) text += `signed sha256 ${e.signed}\n`;
  return text;
}

/** The stampd log entry of `bytes` (serial and time as decimal strings); `TlogError` unless
 * the bytes are exactly its canonical encoding. */
export function parseEntry(bytes) {
  if (bytes.length > MAX_ENTRY) throw new TlogError("entry too long");
  if (bytes.some((b) => b > 0x7f)) throw new TlogError("an entry is ASCII text");
  const text = new TextDecoder().decode(bytes); // (ASCII, checked above)
  if (!text.endsWith("\n")) throw new TlogError("an entry ends in a newline");
  const lines = text.slice(0, -1).split("\n");
  if (lines[0] !== ENTRY_HEADER) throw new TlogError(`an entry starts with '${ENTRY_HEADER}'`);
  const fields = new Map();
  for (const line of lines.slice(1)) {
    const sp = line.indexOf(" ");
    const name = sp < 0 ? line : line.slice(0, sp);
    const value = sp < 0 ? "" : line.slice(sp + 1);
    if (sp < 0 || !value || fields.has(name)) throw new TlogError(`bad line ${repr(line.slice(0, 80))}`);
    fields.set(name, value);
  }
  const take = (n) => {
    const v = fields.get(n);
    fields.delete(n);
    return v ?? null;
  };
  const e = { serial: null, kind: null, time: null, key: null };
  for (const n of ["serial", "kind", "time", "key"]) {
    e[n] = take(n);
    if (e[n] === null) throw new TlogError(`an entry names its ${n}`);
  }
  for (const n of [e.serial, e.time]) {
    if (!/^(0|[1-9][0-9]{0,18})$/.test(n)) throw new TlogError(`bad number ${repr(n.slice(0, 40))}`);
  }
  e.algorithm = null;
  e.digest = null;
  e.signed = null;
  const digestLine = take("digest");
  if (digestLine !== null) {
    const sp = digestLine.indexOf(" ");
    e.algorithm = sp < 0 ? digestLine : digestLine.slice(0, sp);
    e.digest = sp < 0 ? "" : digestLine.slice(sp + 1);
  }
  const signedLine = take("signed");
  if (signedLine !== null) {
    const sp = signedLine.indexOf(" ");
    if ((sp < 0 ? signedLine : signedLine.slice(0, sp)) !== "sha256") throw new TlogError("the signed line is 'signed sha256 <hex>'");
    e.signed = sp < 0 ? "" : signedLine.slice(sp + 1);
  }
  e.commit = take("commit");
  e.object = take("object");
  if (fields.size) throw new TlogError(`unknown field ${repr([...fields.keys()][0].slice(0, 40))}`);
  checkEntry(e);
  if (entryText(e) !== text) throw new TlogError("fields out of order");
  return e;
}

// --- what the user holds (client/verify/tlog.py `Held`) ------------------------------------

/** What a checked receipt says its log entry must be (`verifyReceipt`'s result). */
export function heldReceipt(result) {
  const st = result.statement;
  return {
    what: "receipt",
    kind: "digest",
    time: st.time,
    keys: [...new Set([st.key, result.primary].filter(Boolean))],
    serial: st.serial,
    algorithm: st.algorithm,
    digest: st.digest,
  };
}

/** What a checked manifest says its log entry must be: SHA-256 of its exact bytes. */
export function heldManifest(result, bytes) {
  const h = result.manifest.header;
  return {
    what: "manifest",
    kind: "manifest",
    time: h.time,
    keys: [...new Set([h.key, result.signer].filter(Boolean))],
    serial: h.serial,
    signed: hex(sha256(asBytes(bytes))),
  };
}

function entryMismatch(entry, held) {
  if (entry.kind !== held.kind) return `kind is ${entry.kind}, not ${held.kind}`;
  if (held.serial != null && entry.serial !== String(held.serial)) return `serial is ${entry.serial}, not ${held.serial}`;
  if (entry.time !== String(held.time)) return `time is ${entry.time}, not ${held.time}`;
  if (!held.keys.includes(entry.key)) return `key is ${entry.key}, not ${[...held.keys].sort().join(" or ")}`;
  for (const [field, name] of [["commit", "commit"], ["object", "object"], ["algorithm", "algorithm"], ["digest", "digest"], ["signed", "signed sha256"]]) {
    const want = held[field];
    if (want != null && entry[field] !== want) return `${name} is ${entry[field] || "absent"}, not ${want}`;
  }
  return null;
}

// --- policies (c2sp.org/tlog-policy, formats/tlog/policy.py) -------------------------------

/** A refusal of a policy or of a checkpoint under it. */
export class PolicyError extends TlogError {
  constructor(message) {
    super(message);
    this.name = "PolicyError";
  }
}

const MAX_ITEMS = 64;

/** A policy's text or bytes: `{logs: [verifier], witnesses: [{name, key}], groups:
 * Map(name -> {threshold, members}), quorum}`; `PolicyError` naming the line otherwise. */
export function parsePolicy(data) {
  const bytes = asBytes(data);
  if (bytes.some((b) => (b <= 0x08) || (b >= 0x0b && b <= 0x1f) || b === 0x7f)) {
    throw new PolicyError("a policy holds no control characters but tab and newline");
  }
  const logs = [];
  const witnesses = [];
  const groups = new Map();
  const names = new Set();
  const keys = new Set();
  let quorum = null;
  const text = decodeSurrogateEscape(bytes);
  text.split("\n").forEach((raw, i) => {
    const items = raw.replace(/^[ \t]+|[ \t]+$/g, "").split(/[ \t]+/).filter(Boolean);
    if (!items.length || items[0].startsWith("#")) return;
    const fail = (why) => new PolicyError(`policy line ${i + 1}: ${why}`);
    const vkeyOf = (t, sigType, what) => {
      let vk;
      try {
        vk = parseVkey(t);
      } catch (e) {
        throw fail(`${what} key: ${e.message}`);
      }
      const hx = (n) => `0x${n.toString(16).padStart(2, "0")}`;
      if (vk.sigType !== sigType) throw fail(`a ${what} key is of signature type ${hx(sigType)}, not ${hx(vk.sigType)}`);
      const id = `${vk.sigType}:${hex(vk.publicKey)}`;
      if (keys.has(id)) throw fail(`a ${what} with this public key is listed already`);
      keys.add(id);
      return vk;
    };
    const newName = (name) => {
      if (name === "none" || names.has(name)) throw fail(`name ${repr(name)} is reserved or defined already`);
      names.add(name);
      return name;
    };
    const [keyword, ...args] = items;
    if (keyword === "log") {
      if (args.length !== 1 && args.length !== 2) throw fail("use: log <vkey> [<url>]");
      logs.push(verifier(vkeyOf(args[0], ED25519, "log"), "log"));
    } else if (keyword === "witness") {
      if (args.length !== 2 && args.length !== 3) throw fail("use: witness <name> <vkey> [<url>]");
      const name = newName(args[0]);
      witnesses.push({ name, key: verifier(vkeyOf(args[1], ED25519_COSIGNATURE, "witness"), "witness") });
    } else if (keyword === "group") {
      if (args.length < 3) throw fail("use: group <name> all|any|<k> <name>...");
      const name = newName(args[0]);
      const members = args.slice(2);
      for (const m of members) {
        if (m === "none" || m === name || !names.has(m)) throw fail(`group member ${repr(m)} is not a witness or group defined above`);
      }
      if (new Set(members).size !== members.length) throw fail("a name is listed twice as a member");
      let threshold = { all: members.length, any: 1 }[args[1]];
      if (threshold === undefined) {
        if (!/^[1-9][0-9]*$/.test(args[1]) || Number(args[1]) > members.length) {
          throw fail(`threshold ${repr(args[1])} is not all, any or 1 to ${members.length}`);
        }
        threshold = Number(args[1]);
      }
      groups.set(name, { name, threshold, members });
    } else if (keyword === "quorum") {
      if (args.length !== 1) throw fail("use: quorum <name>|none");
      if (quorum !== null) throw fail("a policy has one quorum line");
      if (args[0] !== "none" && !names.has(args[0])) throw fail(`quorum ${repr(args[0])} is not a witness or group defined above`);
      quorum = args[0];
    } else {
      throw fail(`unknown keyword ${repr(keyword)}`);
    }
    if (Math.max(logs.length, witnesses.length, groups.size) > MAX_ITEMS) throw fail(`more than ${MAX_ITEMS} logs, witnesses or groups`);
  });
  if (quorum === null) throw new PolicyError("a policy has a quorum line (quorum none: no witness needed)");
  return { logs, witnesses, groups, quorum };
}

function holds(policy, witnessed, name = policy.quorum) {
  if (name === "none") return true;
  const w = policy.witnesses.find((x) => x.name === name);
  if (w) return witnessed.has(name);
  const g = policy.groups.get(name);
  return g.members.filter((m) => holds(policy, witnessed, m)).length >= g.threshold;
}

/** The quorum in words, e.g. `2 of witnesses (w1, w2, w3)`. */
export function describePolicy(policy) {
  if (policy.quorum === "none") return "no witness";
  if (policy.witnesses.some((w) => w.name === policy.quorum)) return `witness ${policy.quorum}`;
  const g = policy.groups.get(policy.quorum);
  return `${g.threshold} of ${g.name} (${g.members.join(", ")})`;
}

/** Open a checkpoint note with the policy's keys: `{checkpoint, cosigned: Map(name -> time),
 * quorumHolds, quorumTime}` (formats/tlog/policy.py `Policy.check`). */
export function checkPolicy(policy, note) {
  if (!policy.logs.length) throw new PolicyError("the policy names no log");
  let opened;
  try {
    opened = openNote(note, [...policy.logs, ...policy.witnesses.map((w) => w.key)]);
  } catch (e) {
    throw new PolicyError(`the checkpoint does not verify with the policy's keys: ${e.message}`);
  }
  const signedBy = (v) => opened.verified.some((s) => s.name === v.name && s.keyId === v.keyId);
  if (!policy.logs.some(signedBy)) throw new PolicyError("the checkpoint is not signed by a log of the policy");
  const checkpoint = parseCheckpoint(opened.text);
  if (!policy.logs.some((v) => v.name === checkpoint.origin)) {
    throw new PolicyError(`the checkpoint's origin ${repr(checkpoint.origin)} is no log's name in the policy`);
  }
  const cosigned = new Map();
  for (const w of policy.witnesses) {
    for (const s of opened.verified) {
      if (s.name === w.key.name && s.keyId === w.key.keyId) cosigned.set(w.name, Number(cosignatureTimestamp(s.signature)));
    }
  }
  const quorumHolds = holds(policy, new Set(cosigned.keys()));
  let quorumTime = null;
  if (quorumHolds && policy.quorum !== "none") {
    for (const t of [...new Set(cosigned.values())].sort((a, b) => a - b)) {
      if (holds(policy, new Set([...cosigned].filter(([, at]) => at <= t).map(([n]) => n)))) {
        quorumTime = t;
        break;
      }
    }
  }
  return { checkpoint, cosigned, quorumHolds, quorumTime };
}

// --- the whole check (client/verify/tlog.py `check_proof`, `witnessed_by`) -----------------

/**
 * Check a `.tlog-proof` offline for the stamp `held` (`heldReceipt` / `heldManifest`).
 *
 * - `proof`: its bytes or text; `source`: its name, for messages;
 * - `logKeys`: the log's verifier keys (vkeys) to trust, `keyOrigin` where they come from;
 * - `policy`: a c2sp tlog-policy text (its logs are then the keys trusted, and its quorum
 *   must hold), `policyOrigin` its name; or
 * - `witnesses`: witness vkeys, of which `quorum` must have cosigned.
 *
 * Returns `{ok, kind, reason, checks, index, size, origin, cosigned, quorumTime}`: the steps
 * entry, checkpoint, origin, signature, inclusion, witnesses. Throws `Malformed` for a proof,
 * key or policy that is not one.
 */
export function verifyTlogProof({ proof, held, source = "proof", logKeys = [], keyOrigin = "given log key", policy = null, policyOrigin = "policy", witnesses = [], quorum = 0 }) {
  const c = new Checks();
  const refuse = (check, detail) => {
    c.fail(check, detail, `log proof ${source}: ${check}: ${detail}`);
    return c.result({ index: null, size: null });
  };
  const bytes = asBytes(proof);
  if (bytes.length > MAX_PROOF) throw new Malformed(`the log proof ${source} is larger than ${MAX_PROOF} bytes`);
  let parsed;
  try {
    parsed = parseProofBytes(bytes);
  } catch (e) {
    throw new Malformed(`log proof ${source}: not a c2sp.org/tlog-proof@v1: ${e.message}`);
  }
  let pol = null;
  let keys = logKeys;
  let origin = keyOrigin;
  if (policy !== null) {
    const policyBytes = asBytes(policy);
    if (policyBytes.length > MAX_POLICY) throw new Malformed(`the policy ${policyOrigin} is larger than ${MAX_POLICY} bytes`);
    try {
      pol = parsePolicy(policyBytes);
    } catch (e) {
      throw new Malformed(`the policy ${policyOrigin}: ${e.message}`);
    }
    if (!pol.logs.length) throw new Malformed(`the policy ${policyOrigin} names no log`);
    keys = pol.logs.map((v) => v.key.vkey);
    origin = `policy ${policyOrigin}`;
  }
  if (parsed.extra === null) return refuse("entry", "the proof carries no log entry (no extra line)");
  let entry;
  try {
    entry = parseEntry(parsed.extra);
  } catch (e) {
    return refuse("entry", `not a stampd log entry: ${e.message}`);
  }
  const mismatch = entryMismatch(entry, held);
  if (mismatch !== null) return refuse("entry", `a proof of another stamp: its entry's ${mismatch} (the ${held.what}'s)`);
  c.pass("entry", `the log entry is the ${held.what}'s: ${entry.kind} stamp, serial ${entry.serial}, time ${entry.time}, key ${entry.key}`);
  const known = new Map();
  for (const vkey of Array.isArray(keys) ? keys : [keys]) {
    let v;
    try {
      v = verifier(vkey, "log");
    } catch (e) {
      throw new Malformed(`the log key ${origin} is not an Ed25519 verifier key: ${e.message}`);
    }
    known.set(v.name, v);
  }
  let checkpoint;
  try {
    checkpoint = parseCheckpoint(parseNote(parsed.checkpoint).text);
  } catch (e) {
    return refuse("checkpoint", e.message);
  }
  const v = known.get(checkpoint.origin);
  if (!v) {
    const names = [...known.keys()].sort().map(repr).join(" or ");
    return refuse("origin", `the checkpoint is of ${repr(checkpoint.origin)}, not of the log key's ${names}`);
  }
  c.pass("origin", `the checkpoint is of the log ${checkpoint.origin} (${origin})`);
  const id = v.keyId.toString(16).padStart(8, "0");
  let opened;
  try {
    opened = openNote(parsed.checkpoint, [v]);
  } catch (e) {
    return refuse("signature", `the checkpoint is not signed by the log key ${v.name}+${id} (${e.message})`);
  }
  if (!opened.verified.some((s) => s.name === v.name && s.keyId === v.keyId)) {
    return refuse("signature", "the checkpoint is not signed by the log key");
  }
  c.pass("signature", `the checkpoint of size ${checkpoint.size} is signed by the log key ${v.name}+${id}`);
  try {
    verifyInclusion(leafHash(parsed.extra), parsed.index, checkpoint.size, parsed.hashes, checkpoint.root);
  } catch (e) {
    return refuse("inclusion", `the entry is not at index ${parsed.index} of the checkpoint's tree of size ${checkpoint.size} (${e.message})`);
  }
  c.pass("inclusion", `the entry is at index ${parsed.index} of the checkpoint's tree of size ${checkpoint.size}`);
  const found = { index: parsed.index.toString(), size: checkpoint.size.toString(), origin: checkpoint.origin, cosigned: null, quorumTime: null };
  if (pol !== null) {
    let w;
    try {
      w = checkPolicy(pol, parsed.checkpoint);
    } catch (e) {
      return refuse("witnesses", e.message);
    }
    found.cosigned = Object.fromEntries(w.cosigned);
    found.quorumTime = w.quorumTime;
    if (!w.quorumHolds) {
      const names = [...w.cosigned.keys()].sort().join(", ") || "no witness";
      c.fail("witnesses", `cosigned by ${names}; the policy needs ${describePolicy(pol)}`, `log proof ${source}: witnesses: cosigned by ${names}; the policy needs ${describePolicy(pol)}`);
      return c.result(found);
    }
    let line = `${w.cosigned.size} of ${pol.witnesses.length} witnesses (quorum: ${describePolicy(pol)})`;
    if (w.quorumTime !== null) line += `, by ${utc(w.quorumTime)}`;
    c.pass("witnesses", line);
  } else if (witnesses.length) {
    let ws;
    try {
      ws = witnesses.map((x) => verifier(x, "witness"));
    } catch (e) {
      throw new Malformed(`a witness key is not an Ed25519 cosignature verifier key: ${e.message}`);
    }
    let openedAll;
    try {
      openedAll = openNote(parsed.checkpoint, [v, ...ws]);
    } catch (e) {
      return refuse("witnesses", e.message);
    }
    const cosigned = {};
    for (const s of openedAll.verified) {
      const w = ws.find((x) => x.name === s.name && x.keyId === s.keyId);
      if (w) cosigned[w.name] = Number(cosignatureTimestamp(s.signature));
    }
    found.cosigned = cosigned;
    const n = Object.keys(cosigned).length;
    if (n < quorum) return refuse("witnesses", `${n} witnesses cosigned the checkpoint, not ${quorum}`);
    c.pass("witnesses", `${n} of ${ws.length} witnesses cosigned the checkpoint` + (n ? `: ${Object.keys(cosigned).sort().join(", ")}` : ""));
  }
  return c.result(found);
}

export { NoteError };
