"""The verify page's core (web/src/verify/*.js, docs/web.md) under Node, on real artifacts of a
real stampd server, and against `stampd verify` on the same files.

One server for the module: the test key, an extra OpenPGP key (its receipts are "signed by a
foreign key" to a page that trusts the test key alone), two SSH keys (ed25519, ECDSA P-256), its
transparency log on, and one witness on loopback (tests.helpers.LocalWitness) that cosigns its
checkpoints. From it: digest receipts, a manifest of three files, their `.tlog-proof`s, the log
key and the published policy; then, made here, the damaged copies: a flipped byte in a file, a
changed statement, a proof with a changed hash line, tree size, log signature, entry or
cosignature, a proof of another stamp, a wrong log key, a policy whose quorum is not met,
manifests' files changed, missing or extra.

`node --test web/test/verify-core.test.mjs` checks each case (ok or refused, by which check,
with which reason) and writes what it found; each case is then run through `stampd verify`
(in-process, from the artifacts' folder, so both name the files alike): both accept or both
refuse, and where the browser words its reason as stampd verify does (all but gpg's and
ssh-keygen's own words), the reason is the same line. `web/test/vectors.test.mjs` checks the
worked examples of docs/transparency-formats.md.

Node.js and web/node_modules are required: when node_modules is missing, the test runs
``npm ci --prefer-offline`` in web/ itself, under a file lock (several test processes), and
fails naming what is missing when that is not possible.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import http.client
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from formats.note import ED25519, ED25519_COSIGNATURE, Note, Signature, VerifierKey, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.proof import TlogProof
from stampd import cli
from tests.browser import axe_violations, browser  # noqa: F401  (a fixture)
from tests.helpers import ROOT, LocalWitness, Server, seed_data_dir, start_server

WEB = ROOT / "web"
NODE_TIMEOUT = 120  # seconds for one node run (bounded; a few seconds here)
NPM_TIMEOUT = 300
WITNESS = "w1.webverify.test"
WAIT = 30.0  # seconds at most for the witness's cosignature on a proof
EXTRA_KEYS = "openpgp:nistp256,ssh:ed25519,ssh:ecdsa-p256"


def node_exe() -> str:
    exe = shutil.which("node")
    assert exe, ("node (Node.js 20 or later) is required for the web pages' tests: "
                 "apt-get install nodejs")
    return exe


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """web/node_modules, installed from web/package-lock.json when missing (``npm ci
    --prefer-offline``, under a lock: test processes run in parallel)."""
    modules = WEB / "node_modules"
    wanted = [modules / p / "package.json" for p in ("openpgp", "@noble/curves", "@noble/hashes")]
    if all(p.is_file() for p in wanted):
        return modules
    npm = shutil.which("npm")
    assert npm, f"{modules} is missing and npm is not installed to make it (make assets does)"
    lock = Path(tempfile.gettempdir()) / "stampd-web-npm-ci.lock"
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # (released when the file closes)
        if not all(p.is_file() for p in wanted):
            r = subprocess.run([npm, "ci", "--prefer-offline", "--no-audit", "--no-fund",
                                "--loglevel=error"], cwd=WEB, capture_output=True, text=True,
                               timeout=NPM_TIMEOUT, check=False)
            assert r.returncode == 0, f"npm ci in {WEB} failed:\n{r.stdout}\n{r.stderr}"
            (modules / ".installed").touch()
    assert all(p.is_file() for p in wanted), f"{modules} lacks {wanted}"
    return modules


def run_node(test_file: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([node_exe(), "--test", "--test-reporter=tap", f"web/test/{test_file}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=NODE_TIMEOUT,
                          env={**os.environ, **(env or {})}, check=False)


def tap_counts(out: str) -> dict[str, int]:
    counts = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "#" and parts[1] in ("pass", "fail", "tests"):
            counts[parts[1]] = int(parts[2])
    return counts


# --- the server and what it makes ------------------------------------------------------------

def request(server: Server, method: str, path: str, body: bytes | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def get(server: Server, path: str) -> bytes:
    status, body = request(server, "GET", path)
    assert status == 200, (path, body[:300])
    return body


def stamp(server: Server, data: bytes, key: str | None = None) -> tuple[int, str]:
    """(serial, receipt) of the SHA-256 of ``data`` stamped by ``key`` (None: the primary)."""
    fields = {"sha256": hashlib.sha256(data).hexdigest(), **({"key": key} if key else {})}
    status, body = request(server, "POST", "/v1/stamps", urllib.parse.urlencode(fields).encode(), {
        "Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"})
    assert status == 200, body
    answer = json.loads(body)
    return int(answer["serial"]), str(answer["receipt"])


def cosigned_proof(server: Server, serial: int) -> bytes:
    """The stamp's proof once its checkpoint carries the witness's cosignature."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        status, proof = request(server, "GET", f"/v1/proofs/{serial}?wait=5")
        if status == 200 and any(s.name == WITNESS for s in
                                 parse_note(TlogProof.parse(proof).checkpoint).signatures):
            return proof
        time.sleep(0.2)
    raise AssertionError(f"no cosigned proof of {serial} in {WAIT} s:\n{server.log()}")


@pytest.fixture(scope="module")
def witness() -> Iterator[LocalWitness]:
    w = LocalWitness(WITNESS)
    yield w
    w.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, witness: LocalWitness) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("webverify") / "data")
    s = start_server(data, workers=1, args=("--witness", witness.spec), extra_env={
        "STAMPD_TLOG": "on", "STAMPD_EXTRA_KEYS": EXTRA_KEYS, "STAMPD_WITNESS_TIMEOUT": "1",
        "STAMPD_WITNESS_RETRY_BASE": "0.2", "STAMPD_WITNESS_RETRY_MAX": "1"})
    try:
        witness.trust(get(s, "/tlog/vkey").decode().strip())  # (404 to the log until now)
        yield s
    finally:
        s.stop()
        shutil.rmtree(s.runtime_dir, ignore_errors=True)


# --- damaged copies --------------------------------------------------------------------------

def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def flip_last(raw: bytes) -> bytes:
    return raw[:-1] + bytes([raw[-1] ^ 1])


def with_checkpoint(proof: bytes, checkpoint: bytes) -> bytes:
    p = TlogProof.parse(proof)
    return TlogProof(p.index, p.hashes, checkpoint, p.extra).encode()


def tampered_hash(proof: bytes) -> bytes:
    p = TlogProof.parse(proof)
    assert p.hashes, "the proof has no hash to change (a tree of one entry)"
    hashes = (hashlib.sha256(b"another subtree").digest(), *p.hashes[1:])
    return TlogProof(p.index, hashes, p.checkpoint, p.extra).encode()


def tampered_size(proof: bytes) -> bytes:
    note = parse_note(TlogProof.parse(proof).checkpoint)
    cp = Checkpoint.parse(note.text)
    text = Checkpoint(cp.origin, cp.size + 1, cp.root, cp.extensions).body()
    return with_checkpoint(proof, Note(text, note.signatures).encode())


def tampered_signature(proof: bytes, name: str) -> bytes:
    """The signature line of key ``name`` with its last byte changed."""
    note = parse_note(TlogProof.parse(proof).checkpoint)
    assert any(s.name == name for s in note.signatures), name
    sigs = tuple(Signature(s.name, s.key_id, flip_last(s.signature)) if s.name == name else s
                 for s in note.signatures)
    return with_checkpoint(proof, Note(note.text, sigs).encode())


def tampered_entry(proof: bytes, digest: str) -> bytes:
    p = TlogProof.parse(proof)
    assert p.extra is not None
    e = Entry.parse(p.extra)
    entry = Entry(e.serial, e.kind, e.time, e.key, e.commit, e.object_id, e.algorithm, digest,
                  e.signed)
    return TlogProof(p.index, p.hashes, p.checkpoint, entry.encode()).encode()


def a_vkey(name: str, sig_type: int) -> str:
    public = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return VerifierKey(name, sig_type, public).encode()


# --- the cases -------------------------------------------------------------------------------

@dataclass
class Made:
    root: Path
    cases: list[dict[str, Any]]


def ok(case_id: str, **case: Any) -> dict[str, Any]:
    return {"id": case_id, **case, "expect": {"ok": True}}


def refused(case_id: str, check: str | None, *, reason: str | None = None,
            contains: tuple[str, ...] = (), same_reason: bool = True, cli: bool = True,
            kind: str = "invalid", **case: Any) -> dict[str, Any]:
    expect: dict[str, Any] = {"ok": False, "check": check, "contains": list(contains),
                              "kind": kind}
    if reason is not None:
        expect["reason"] = reason
    return {"id": case_id, **case, "expect": expect, "same_reason": same_reason, "cli": cli}


@pytest.fixture(scope="module")
def made(server: Server, tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("webverify-artifacts")

    def put(name: str, data: bytes | str) -> str:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return name

    keys = json.loads(get(server, "/v1/keys"))["keys"]
    primary = next(k for k in keys if k["primary"])
    foreign = next(k for k in keys if k["format"] == "openpgp" and not k["primary"]
                   and k["purpose"] == "stamps")
    ssh = {k["algorithm"]: k for k in keys if k["format"] == "ssh" and k["purpose"] == "stamps"}
    put("server-key.asc", primary["public_key"])
    put("foreign-key.asc", foreign["public_key"])
    put("allowed_signers", get(server, "/v1/keys/allowed_signers"))
    vkey = get(server, "/tlog/vkey").decode().strip()
    put("policy", get(server, "/tlog/policy"))
    w2 = a_vkey("w2.webverify.test", ED25519_COSIGNATURE)
    put("policy-2", get(server, "/tlog/policy").decode().replace(
        "group witnesses 1 " + WITNESS, f"witness w2.webverify.test {w2}\n"
        f"group witnesses 2 {WITNESS} w2.webverify.test"))
    assert b"group witnesses 2 " in (root / "policy-2").read_bytes(), (root / "policy").read_text()

    stamp(server, b"a first entry, so that every proof has a hash")
    content = os.urandom(4096)
    put("file.bin", content)
    put("flipped.bin", content[:100] + bytes([content[100] ^ 0x01]) + content[101:])
    put("other.bin", b"another file\n")
    serial, receipt = stamp(server, content)
    put("file.bin.asc", receipt)
    put("other.bin.asc", stamp(server, b"another file\n")[1])
    other_serial, _ = stamp(server, content)  # another stamp of the same digest
    put("foreign.asc", stamp(server, content, foreign["fingerprint"])[1])
    ed = next(k for a, k in ssh.items() if "ed25519" in a)
    p256 = next(k for a, k in ssh.items() if "256" in a and "ed25519" not in a)
    put("ssh-ed25519.asc", stamp(server, content, ed["fingerprint"])[1])
    put("ssh-p256.asc", stamp(server, content, p256["fingerprint"])[1])
    put("ssh-changed.asc", receipt_changed(stamp(server, content, ed["fingerprint"])[1]))
    put("changed.asc", receipt_changed(receipt))
    put("rsa.asc", ssh_rsa_receipt(root, (root / "ssh-ed25519.asc").read_text()))
    put("rsa-changed.asc", receipt_changed((root / "rsa.asc").read_text()))

    names = {"a.txt": b"alpha\n", "sub/b.txt": b"bravo\n", "c.txt": os.urandom(1000)}
    for name, data in names.items():
        put(f"tree/{name}", data)
        put(f"changed/{name}", data if name != "sub/b.txt" else b"bravo!\n")
        if name != "c.txt":
            put(f"missing/{name}", data)
    body = "".join(f"{hashlib.sha256(d).hexdigest()} *{n}\n" for n, d in sorted(names.items()))
    status, manifest = request(server, "POST", "/v1/manifests", body.encode(),
                               {"Content-Type": "text/plain"})
    assert status == 200, manifest
    put("SHA256SUMS.asc", manifest)
    status, ssh_manifest = request(server, "POST", "/v1/manifests?format=ssh", body.encode(),
                                   {"Content-Type": "text/plain"})
    assert status == 200, ssh_manifest
    put("SHA256SUMS-ssh.asc", ssh_manifest)
    m_serial = int(manifest.decode().split("# serial: ", 1)[1].split("\n", 1)[0])
    text = manifest.decode()
    put("SHA256SUMS-short.asc", text.replace(text.split("# lines: 3\n", 1)[1].split("\n", 1)[0]
                                             + "\n", "", 1))
    sig_at = text.index("-----BEGIN PGP SIGNATURE-----")
    put("SHA256SUMS-twice.asc", text + text[sig_at:])
    put("SHA256SUMS-changed.asc", manifest.replace(hashlib.sha256(b"alpha\n").hexdigest().encode(),
                                                    hashlib.sha256(b"alpha!\n").hexdigest().encode()))

    proof = cosigned_proof(server, serial)
    put("good.tlog-proof", proof)
    put("hash.tlog-proof", tampered_hash(proof))
    put("size.tlog-proof", tampered_size(proof))
    origin = Checkpoint.parse(parse_note(TlogProof.parse(proof).checkpoint).text).origin
    put("signature.tlog-proof", tampered_signature(proof, origin))
    put("cosignature.tlog-proof", tampered_signature(proof, WITNESS))
    flipped_digest = hashlib.sha256((root / "flipped.bin").read_bytes()).hexdigest()
    put("entry.tlog-proof", tampered_entry(proof, flipped_digest))
    put("other.tlog-proof", cosigned_proof(server, other_serial))
    m_proof = cosigned_proof(server, m_serial)
    put("manifest.tlog-proof", m_proof)
    wrong_vkey = a_vkey(origin, ED25519)
    key_id = VerifierKey.parse(vkey).key_id

    digest = hashlib.sha256(content).hexdigest()
    r: dict[str, Any] = {"type": "receipt", "receipt": "file.bin.asc", "file": "file.bin",
         "keys": ["server-key.asc"]}
    with_proof: dict[str, Any] = {**r, "proof": "good.tlog-proof", "logKey": vkey}
    m: dict[str, Any] = {"type": "manifest", "manifest": "SHA256SUMS.asc",
                         "keys": ["server-key.asc"], "files": {n: f"tree/{n}" for n in names},
                         "dir": "tree"}
    cases = [
        ok("receipt", **r),
        ok("receipt-and-proof", **with_proof),
        ok("receipt-proof-policy", **{**r, "proof": "good.tlog-proof", "policy": "policy"}),
        ok("receipt-other-key", **{**r, "receipt": "foreign.asc", "keys": ["foreign-key.asc"]}),
        ok("ssh-ed25519", **{**r, "receipt": "ssh-ed25519.asc", "keys": ["allowed_signers"]}),
        ok("ssh-p256", **{**r, "receipt": "ssh-p256.asc", "keys": ["allowed_signers"]}),
        ok("cosignature-unknown-without-policy",
           **{**with_proof, "proof": "cosignature.tlog-proof"}),
        refused("flipped-byte", "digest", **{**r, "file": "flipped.bin"},
                reason=f"sha256 of flipped.bin is {flipped_digest}, not the receipt's {digest}"),
        refused("wrong-receipt", "digest", **{**r, "receipt": "other.bin.asc"},
                contains=("sha256 of file.bin is", "not the receipt's")),
        refused("signed-by-foreign-key", "signature", **{**r, "receipt": "foreign.asc"},
                contains=("signature does not verify",), same_reason=False),
        refused("checked-with-foreign-key", "signature", **{**r, "keys": ["foreign-key.asc"]},
                contains=("signature does not verify",), same_reason=False),
        refused("changed-statement", "signature", **{**r, "receipt": "changed.asc"},
                contains=("signature does not verify",), same_reason=False),
        refused("ssh-changed-statement", "signature",
                **{**r, "receipt": "ssh-changed.asc", "keys": ["allowed_signers"]},
                contains=("the SSH signature does not verify",), same_reason=False),
        ok("ssh-rsa", **{**r, "receipt": "rsa.asc", "keys": ["rsa.pub"]}),
        refused("ssh-rsa-changed-statement", "signature", same_reason=False,
                **{**r, "receipt": "rsa-changed.asc", "keys": ["rsa.pub"]},
                contains=("the SSH signature does not verify",)),
        refused("ssh-key-not-given", "key",
                **{**r, "receipt": "ssh-ed25519.asc", "keys": ["server-key.asc"]},
                reason=f"the receipt names key {ed['fingerprint']}, which is not in the key "
                       "file server-key.asc"),
        refused("proof-hash-line", "inclusion", **{**with_proof, "proof": "hash.tlog-proof"},
                contains=("log proof hash.tlog-proof: inclusion: the entry is not at index",
                          "inclusion proof does not lead to the root")),
        refused("proof-tree-size", "signature", **{**with_proof, "proof": "size.tlog-proof"},
                reason=f"log proof size.tlog-proof: signature: the checkpoint is not signed by "
                       f"the log key {origin}+{key_id:08x} (invalid signature for key "
                       f"{origin}+{key_id:08x})"),
        refused("proof-log-signature", "signature",
                **{**with_proof, "proof": "signature.tlog-proof"},
                contains=("log proof signature.tlog-proof: signature: the checkpoint is not "
                          "signed by the log key",)),
        refused("proof-entry", "entry", **{**with_proof, "proof": "entry.tlog-proof"},
                reason="log proof entry.tlog-proof: entry: a proof of another stamp: its "
                       f"entry's digest is {flipped_digest}, not {digest} (the receipt's)"),
        refused("proof-of-another-stamp", "entry", **{**with_proof, "proof": "other.tlog-proof"},
                reason="log proof other.tlog-proof: entry: a proof of another stamp: its "
                       f"entry's serial is {other_serial}, not {serial} (the receipt's)"),
        refused("proof-wrong-log-key", "signature", **{**with_proof, "logKey": wrong_vkey},
                contains=("the checkpoint is not signed by the log key",
                          "no signature from a known key")),
        refused("proof-cosignature", "witnesses",
                **{**r, "proof": "cosignature.tlog-proof", "policy": "policy"},
                contains=("log proof cosignature.tlog-proof: witnesses: the checkpoint does not "
                          f"verify with the policy's keys: invalid signature for key {WITNESS}",)),
        refused("proof-quorum", "witnesses", **{**r, "proof": "good.tlog-proof",
                                                "policy": "policy-2"},
                reason=f"log proof good.tlog-proof: witnesses: cosigned by {WITNESS}; the policy "
                       f"needs 2 of witnesses ({WITNESS}, w2.webverify.test)"),
        ok("manifest", **m),
        ok("manifest-and-proof", **m, proof="manifest.tlog-proof", logKey=vkey),
        ok("manifest-ssh", **{**m, "manifest": "SHA256SUMS-ssh.asc", "keys": ["allowed_signers"]}),
        refused("manifest-ssh-other-key", "key",
                **{**m, "manifest": "SHA256SUMS-ssh.asc", "keys": ["rsa.pub"]},
                contains=("which is not in the key file rsa.pub",)),
        ok("manifest-by-base-names", **{**m, "files": {n.split("/")[-1]: f"tree/{n}"
                                                       for n in names}}, cli=False),
        refused("manifest-changed-file", "file", **{**m, "dir": "changed", "files": {
                    n: f"changed/{n}" for n in names}},
                reason="1 of 3 files do not match the manifest: sub/b.txt"),
        refused("manifest-missing-file", "file", **{**m, "dir": "missing", "files": {
                    n: f"missing/{n}" for n in names if n != "c.txt"}},
                reason="1 of 3 files do not match the manifest: c.txt"),
        refused("manifest-extra-file", "file", **{**m, "files": {
                    **m["files"], "other.bin": "other.bin"}},
                reason="1 file(s) given are not in the manifest: other.bin", cli=False),
        refused("manifest-changed-line", "signature",
                **{**m, "manifest": "SHA256SUMS-changed.asc"},
                contains=("signature does not verify",), same_reason=False),
        refused("manifest-line-left-out", "lines", **{**m, "manifest": "SHA256SUMS-short.asc"},
                reason="the header says 3 lines, but 2 follow it"),
        refused("manifest-two-signatures", "signature",
                **{**m, "manifest": "SHA256SUMS-twice.asc"},
                reason="more than one signed message or signature (only one is allowed)"),
        refused("manifest-foreign-key", "signature", **{**m, "keys": ["foreign-key.asc"]},
                contains=("signature does not verify",), same_reason=False),
        refused("manifest-with-a-receipts-proof", "entry",
                **m, proof="good.tlog-proof", logKey=vkey,
                reason="log proof good.tlog-proof: entry: a proof of another stamp: its entry's "
                       "kind is digest, not manifest (the manifest's)"),
    ]
    (root / "cases.json").write_text(json.dumps({"cases": cases}, indent=1))
    return Made(root, cases)


def ssh_rsa_receipt(root: Path, ssh_receipt: str) -> str:
    """An SSH receipt signed by an RSA key made here (``rsa.pub`` beside it) with
    ``ssh-keygen -Y sign -n stampd`` (rsa-sha2-512), statement and all: the browser checks
    RSA signatures with WebCrypto."""
    key = root / "rsa"
    subprocess.run(["ssh-keygen", "-q", "-t", "rsa", "-b", "2048", "-N", "", "-C", "", "-f",
                    str(key)], check=True, timeout=60, capture_output=True)
    public = key.with_suffix(".pub").read_text()
    blob = base64.b64decode(public.split()[1])
    fingerprint = "SHA256:" + b64(hashlib.sha256(blob).digest()).rstrip("=")
    statement = ssh_receipt.split("-----BEGIN SSH SIGNATURE-----", 1)[0]
    statement = statement[:statement.index("key: ")] + f"key: {fingerprint}\n"
    signed = subprocess.run(["ssh-keygen", "-Y", "sign", "-n", "stampd", "-f", str(key)],
                            input=statement.encode(), check=True, timeout=60,
                            capture_output=True).stdout.decode()
    return statement + signed


def receipt_changed(receipt: str) -> str:
    """The receipt with its statement's serial one higher (its signature then fails)."""
    head, sep, rest = receipt.partition("serial: ")
    number, nl, tail = rest.partition("\n")
    assert sep and nl, receipt
    return f"{head}serial: {int(number) + 1}\n{tail}"


@pytest.fixture(scope="module")
def node_results(made: Made, node_modules: Path) -> tuple[subprocess.CompletedProcess[str],
                                                           dict[str, Any]]:
    r = run_node("verify-core.test.mjs", {"STAMPD_WEB_VERIFY_CASES": str(made.root / "cases.json")})
    results_file = made.root / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else {}
    return r, results


def test_the_core_decides_every_case_in_node(
        made: Made, node_results: tuple[subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    r, results = node_results
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
    counts = tap_counts(r.stdout)
    assert counts.get("pass") == len(made.cases) and counts.get("fail") == 0, r.stdout[-4000:]
    assert set(results) == {c["id"] for c in made.cases}


def cli_args(case: dict[str, Any]) -> list[str]:
    args = ["verify", case.get("receipt") or case["manifest"], "--key", case["keys"][0]]
    if case["type"] == "receipt":
        args += ["--file", case["file"]]
    else:
        args += ["--dir", case["dir"]]
    if "proof" in case:
        args += ["--proof", case["proof"]]
        args += ["--policy", case["policy"]] if "policy" in case else ["--log-key", case["logKey"]]
    return args


def test_stampd_verify_decides_alike(
        made: Made, node_results: tuple[subprocess.CompletedProcess[str], dict[str, Any]],
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    _, results = node_results
    monkeypatch.chdir(made.root)
    compared = 0
    for case in made.cases:
        if case.get("cli") is False or case["id"] not in results:
            continue
        js = results[case["id"]]
        code = cli.main(cli_args(case))
        out, err = capsys.readouterr()
        assert (code == 0) == js["ok"], (case["id"], js["reason"], out, err)
        if not js["ok"] and case.get("same_reason", True):
            assert err == f"stampd verify: {js['kind']}: {js['reason']}\n", case["id"]
        compared += 1
    assert compared >= 30


def test_the_worked_examples_of_the_docs(node_modules: Path) -> None:
    r = run_node("vectors.test.mjs")
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
    counts = tap_counts(r.stdout)
    assert counts.get("pass", 0) >= 5 and counts.get("fail") == 0, r.stdout[-4000:]


# --- the page, in Chromium, offline ----------------------------------------------------------

BIG = 64 << 20  # bytes of the larger file the page hashes

# the result's final states, as one CSS selector (the page's CSP allows no evaluated string)
FINAL = "[data-testid=verify-result]:is(" + ",".join(
    f"[data-state={s}]" for s in ("valid", "invalid", "malformed", "unsupported", "error")) + ")"


def page_check(tab: Any, root: Path, evidence: list[str], files: list[str]) -> tuple[str, str]:
    """(state, text) of the verify page's result for the files chosen: first none (the page
    then says so at once), then the files, then the evidence (which starts the check)."""
    tab.set_input_files("[data-testid=verify-receipt]", [])
    tab.set_input_files("[data-testid=verify-file]", [root / f for f in files])
    tab.set_input_files("[data-testid=verify-receipt]", [root / f for f in evidence])
    tab.wait_for_selector(FINAL, timeout=30_000)
    result = tab.locator("[data-testid=verify-result]")
    return str(result.get_attribute("data-state")), str(result.inner_text())


def verdict(tab: Any) -> str:
    """The verify page's verdict: the line above the steps of its check."""
    return str(tab.locator("[data-testid=verify-result] [data-verdict]").inner_text())


def test_the_verify_page_decides_offline(server: Server, made: Made, browser: Any,  # noqa: F811
                                         tmp_path: Path) -> None:
    root = made.root
    context = browser.new_context()
    try:
        tab = context.new_page()
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        tab.goto(server.url + "verify")
        tab.wait_for_selector("body[data-ready='1']", timeout=15_000)
        asked: list[str] = []  # every request after the load: none may be made

        def refuse(route: Any) -> None:
            asked.append(route.request.url)
            route.abort()

        context.route("**/*", refuse)

        def shoot(name: str) -> None:
            for width in (320, 1280):  # readable at both: nothing wider than the window
                tab.set_viewport_size({"width": width, "height": 900})
                assert tab.evaluate("document.documentElement.scrollWidth") <= width, width
                tab.screenshot(path=str(tmp_path / f"verify-{name}-{width}.png"), full_page=True)

        tree = [f"tree/{n}" for n in ("a.txt", "sub/b.txt", "c.txt")]
        state, text = page_check(tab, root, ["file.bin.asc", "good.tlog-proof"], ["file.bin"])
        assert state == "valid" and "inclusion" in text and "witnesses" in text, text
        shoot("valid")
        # A file that is not the one stamped: the verdict says so in words, first; the two
        # digests are in the step below it, not in the verdict.
        state, text = page_check(tab, root, ["file.bin.asc"], ["flipped.bin"])
        assert state == "invalid" and "sha256 of flipped.bin is" in text, text
        assert verdict(tab) == "Not valid: this file (flipped.bin) is not the one stamped."
        state, text = page_check(tab, root, ["other.bin.asc"], ["file.bin"])
        assert state == "invalid" and "not the receipt's" in text, text
        assert verdict(tab) == "Not valid: this file (file.bin) is not the one stamped."
        state, text = page_check(tab, root, ["file.bin.asc", "foreign-key.asc"], ["file.bin"])
        assert state == "invalid" and "signature does not verify" in text, text
        state, text = page_check(tab, root, ["foreign.asc", "server-key.asc"], ["file.bin"])
        assert state == "invalid" and "signature does not verify" in text, text
        for proof, check in (("hash", "inclusion"), ("size", "signature"),
                             ("signature", "signature"), ("entry", "entry")):
            state, text = page_check(tab, root, ["file.bin.asc", f"{proof}.tlog-proof"],
                                     ["file.bin"])
            assert state == "invalid" and f"{proof}.tlog-proof: {check}:" in text, text
        state, text = page_check(tab, root, ["file.bin.asc", "good.tlog-proof", "policy-2"],
                                 ["file.bin"])
        assert state == "invalid" and "the policy needs 2 of witnesses" in text, text
        state, text = page_check(tab, root, ["SHA256SUMS.asc", "manifest.tlog-proof"], tree)
        assert state == "valid" and "3 checked: all match" in text, text
        state, text = page_check(tab, root, ["SHA256SUMS.asc"],
                                 [f.replace("tree/", "changed/") for f in tree])
        assert state == "invalid" and "sub/b.txt" in text, text
        shoot("changed")
        state, text = page_check(tab, root, ["SHA256SUMS.asc"], [*tree[:2], "other.bin"])
        assert state == "invalid" and "MISSING: c.txt" in text and "EXTRA: other.bin" in text
        state, text = page_check(tab, root, ["file.bin"], ["file.bin"])
        assert state == "malformed" and "no receipt, manifest" in text, text
        # a larger file: hashed in the page, streamed (the time is printed, never asserted)
        big = tmp_path / "big.bin"
        with open(big, "wb") as f:
            f.truncate(BIG)
            f.seek(BIG // 2)
            f.write(os.urandom(64))
        (tmp_path / "big.bin.asc").write_text(stamp(server, big.read_bytes())[1])
        started = time.monotonic()
        state, text = page_check(tab, tmp_path, ["big.bin.asc"], ["big.bin"])
        took = time.monotonic() - started
        assert state == "valid" and "sha256 of big.bin is the receipt's" in text, text
        print(f"verify page: {BIG >> 20} MiB file checked in {took:.2f} s "
              f"({BIG / took / 1e6:.0f} MB/s with the file's transfer to the browser)")
        # a newer choice while the larger file is being hashed: only the newer check answers
        tab.set_input_files("[data-testid=verify-file]", [big])
        tab.set_input_files("[data-testid=verify-file]", [root / "flipped.bin"])
        tab.wait_for_selector(FINAL, timeout=30_000)
        tab.wait_for_timeout(1000)  # (time for the older check to answer, were it to)
        text = tab.locator("[data-testid=verify-result]").inner_text()
        assert "sha256 of flipped.bin is" in text and "big.bin" not in text, text
        assert asked == [] and errors == [], (asked, errors)
        print(f"screenshots of the verify page: {tmp_path}/verify-*.png")
    finally:
        context.close()
    # axe-core is injected as an inline script, which the page's CSP forbids: a context that
    # bypasses the CSP, for the accessibility check alone (a result with its list shown)
    context = browser.new_context(bypass_csp=True)
    try:
        tab = context.new_page()
        tab.goto(server.url + "verify")
        tab.wait_for_selector("body[data-ready='1']", timeout=15_000)
        assert page_check(tab, root, ["file.bin.asc"], ["flipped.bin"])[0] == "invalid"
        assert axe_violations(tab) == []
    finally:
        context.close()


# --- the parsers and the proof check, on many damaged inputs, against stampd verify's --------

MUTATIONS = 120  # per artifact: each a seeded, single change
SIGNATURES = 60  # of them for a whole receipt checked with gpg (each a gpg run)
CHARS = b"0aZ9-+/=: #\t\r\n\xc3\x80\x00"


def mutations(data: bytes, seed: int) -> list[bytes]:
    """``data`` and ``MUTATIONS`` copies with one change each: a byte's bit flipped, a byte
    replaced or inserted, a byte or a line deleted, a line doubled, two lines swapped."""
    import random

    rng = random.Random(seed)
    out = [data]
    for i in range(MUTATIONS):
        lines = data.split(b"\n")
        at = rng.randrange(len(data))
        n = rng.randrange(len(lines))
        op = i % 7
        if op == 0:
            m = data[:at] + bytes([data[at] ^ (1 << rng.randrange(8))]) + data[at + 1:]
        elif op == 1:
            m = data[:at] + bytes([rng.choice(CHARS)]) + data[at + 1:]
        elif op == 2:
            m = data[:at] + bytes([rng.choice(CHARS)]) + data[at:]
        elif op == 3:
            m = data[:at] + data[at + 1:]
        elif op == 4:
            m = b"\n".join(lines[:n] + lines[n + 1:])
        elif op == 5:
            m = b"\n".join(lines[:n + 1] + lines[n:])
        else:
            k = min(n + 1, len(lines) - 1)
            lines[n], lines[k] = lines[k], lines[n]
            m = b"\n".join(lines)
        out.append(m)
    return out


def armor_variants(sig: bytes) -> list[bytes]:
    """An armored signature block written in the ways gpg reads or refuses: spaces, CRs, empty
    lines, headers, the checksum changed, short, long or left out, padding or data misplaced."""
    lines = sig.split(b"\n")
    body, crc = lines[2], next(x for x in lines if x.startswith(b"=") and len(x) == 5)
    last = lines[lines.index(crc) - 1]
    return [
        sig.replace(body, body[:4] + b" " + body[4:]),
        sig.replace(body, body[:4] + b"!" + body[4:]),
        sig.replace(crc, crc[:1] + b"\r" + crc[1:]), sig.replace(crc, b"= " + crc[1:]),
        sig.replace(crc, b"=AAAA"), sig.replace(crc, crc[:4]), sig.replace(crc, crc + b"A"),
        sig.replace(crc + b"\n", b""), sig.replace(crc + b"\n", crc + b"\nzzzz\n"),
        sig.replace(crc + b"\n", crc + b"\n" + crc + b"\n"), sig.replace(body, body + b"\n"),
        sig.replace(body, body + b"\n-----"), sig.replace(body, body[:-4] + b"AA=="),
        sig.replace(last, last + b"AAAA"), sig.replace(b"-----\n\n", b"-----\nVersion: x\n\n", 1),
        sig.replace(b"-----\n\n", b"-----\nVersion x\n\n", 1),
        sig.replace(b"-----\n\n", b"-----\n", 1), sig.replace(body, body + b"  "),
        sig.replace(crc, crc[:3] + b" " + crc[3:]), sig.replace(crc, crc + b"!!"),
        sig.replace(crc, crc[:2] + b"!" + crc[2:]), sig.replace(b"-----END", b"------END"),
        sig.replace(b"-----END", b"x-----END"), sig.replace(crc + b"\n", b"").replace(
            b"-----END", b"------END"), sig.replace(crc + b"\n", b"").replace(
            b"-----END", b"x-----END"),
    ]


def same(python: dict[str, Any], js: dict[str, Any] | None) -> bool:
    """The same outcome: acceptance, kind, and reason, except where stampd verify gives gpg's
    status (BADSIG, NO_PUBKEY...) or ssh-keygen's last line and the browser its own words."""
    if js is None or (python["ok"], python["kind"]) != (js["ok"], js["kind"]):
        return False
    for tool in ("signature does not verify: ", "the SSH signature does not verify"):
        if python["reason"] and python["reason"].startswith(tool):  # (gpg's, ssh-keygen's words)
            return bool(js["reason"] and js["reason"].startswith(tool))
    return bool(python["reason"] == js["reason"])


def python_outcome(kind: str, data: bytes, **kw: Any) -> dict[str, Any]:
    """What stampd verify's own code says of ``data``: the receipt or manifest parsed, or the
    proof checked as `stampd verify --proof --log-key|--policy` checks it."""
    from client.verify.errors import Invalid, VerifyError
    from client.verify.manifest import parse_manifest, verify_manifest
    from client.verify.receipt import parse_receipt, receipt_text, verify_receipt
    from client.verify.tlog import check_proof, parse_policy, quorum_missing, witnessed_by
    from formats.tlog.policy import Policy, PolicyError

    try:
        if kind == "receipt":
            parse_receipt(receipt_text(data))
        elif kind == "receipt-signature":
            verify_receipt(receipt_text(data), key_file=kw["key_file"])
        elif kind == "manifest-signature":
            verify_manifest(data, key_file=kw["key_file"])
        elif kind == "manifest":
            parse_manifest(data)
        elif kind == "policy":
            try:
                Policy.parse(data)
            except PolicyError as e:
                return {"ok": False, "kind": "malformed", "reason": str(e)}
        else:
            policy = None
            keys = [kw["vkey"]]
            if kw.get("policy") is not None:
                policy = parse_policy(kw["policy"], kw["policy_origin"])
                keys = [v.key.encode() for v, _ in policy.logs]
            check_proof(data, kw["held"], keys, source=kw["source"])
            if policy is not None:
                w = witnessed_by(data, policy, source=kw["source"])
                if not w.quorum_holds:
                    raise Invalid(f"log proof {kw['source']}: witnesses: "
                                  f"{quorum_missing(w, policy)}")
    except VerifyError as e:
        return {"ok": False, "kind": e.kind, "reason": e.message}
    return {"ok": True, "kind": "valid", "reason": None}


def test_parsers_and_proof_checks_agree_with_stampd_verify(
        made: Made, node_modules: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from client.verify.receipt import parse_receipt, receipt_text
    from client.verify.tlog import held_manifest, held_receipt
    from formats.manifests import parse_header
    from tests.helpers import TEST_FPR

    root = made.root
    monkeypatch.chdir(root)  # (stampd verify names the key file as given)
    st = parse_receipt(receipt_text((root / "file.bin.asc").read_bytes()))[0]
    held = held_receipt(st.serial, st.time, st.key, st.algorithm, st.digest, TEST_FPR)
    held_js = {"what": "receipt", "kind": "digest", "time": st.time, "keys": sorted(held.keys),
               "serial": str(st.serial), "algorithm": st.algorithm, "digest": st.digest}
    manifest = (root / "SHA256SUMS.asc").read_bytes()
    h = parse_header(manifest.decode().split("\n\n", 1)[1])
    m_held = held_manifest(h.serial, h.time, h.key, manifest, TEST_FPR)
    m_held_js = {"what": "manifest", "kind": "manifest", "time": h.time,
                 "keys": sorted(m_held.keys), "serial": str(h.serial), "signed": m_held.signed}
    vkey = next(c["logKey"] for c in made.cases if "logKey" in c)
    policy = (root / "policy").read_bytes()
    sources: list[tuple[str, bytes, dict[str, Any], dict[str, Any]]] = [
        ("receipt", (root / "file.bin.asc").read_bytes(), {}, {}),
        ("receipt", (root / "ssh-ed25519.asc").read_bytes(), {}, {}),
        ("manifest", manifest, {}, {}),
        ("policy", (root / "policy-2").read_bytes(), {}, {}),
        ("proof", (root / "good.tlog-proof").read_bytes(),
         {"held": held, "vkey": vkey, "source": "p"}, {"held": held_js, "vkey": vkey}),
        ("proof", (root / "good.tlog-proof").read_bytes(),
         {"held": held, "vkey": vkey, "source": "p", "policy": policy, "policy_origin": "pol"},
         {"held": held_js, "vkey": vkey, "policy": b64(policy), "policyOrigin": "pol"}),
        ("proof", (root / "manifest.tlog-proof").read_bytes(),
         {"held": m_held, "vkey": vkey, "source": "p"}, {"held": m_held_js, "vkey": vkey}),
    ]
    # whole receipts with their signatures (gpg for stampd verify: fewer, each a gpg run), the
    # changes in the signature block
    receipt = (root / "file.bin.asc").read_bytes()
    at = receipt.index(b"-----BEGIN PGP SIGNATURE-----")
    key = {"keys": (root / "server-key.asc").read_text(), "keyOrigin": "key file server-key.asc"}
    signatures = [receipt[:at] + m for m in [*mutations(receipt[at:], seed=99)[:SIGNATURES],
                                               *armor_variants(receipt[at:])]]
    ssh = (root / "ssh-ed25519.asc").read_bytes()
    at = ssh.index(b"-----BEGIN SSH SIGNATURE-----")
    ssh_key = {"keys": (root / "allowed_signers").read_text(),
               "keyOrigin": "key file allowed_signers"}
    cases, expected, inputs = [], {}, {}
    p256 = (root / "ssh-p256.asc").read_bytes()
    p256_at = p256.index(b"-----BEGIN SSH SIGNATURE-----")
    for name, kind, key_file, js_key, variants in (
            ("sig", "receipt-signature", "server-key.asc", key, signatures),
            ("ssh", "receipt-signature", "allowed_signers", ssh_key,
             [ssh[:at] + m for m in mutations(ssh[at:], seed=98)[:SIGNATURES]]),
            ("p256", "receipt-signature", "allowed_signers", ssh_key,
             [p256[:p256_at] + m
              for m in mutations(p256[p256_at:], seed=97)[:SIGNATURES // 2]]),
            ("rsa", "receipt-signature", "rsa.pub",
             {"keys": (root / "rsa.pub").read_text(), "keyOrigin": "key file rsa.pub"},
             mutations((root / "rsa.asc").read_bytes(), seed=95)[:SIGNATURES // 2]),
            ("msig", "manifest-signature", "server-key.asc", key,
             mutations(manifest, seed=96)[:SIGNATURES]),
            ("mssh", "manifest-signature", "allowed_signers", ssh_key,
             mutations((root / "SHA256SUMS-ssh.asc").read_bytes(), seed=94)[:SIGNATURES // 2])):
        for i, m in enumerate(variants):
            inputs[f"{name}.{i}"] = m
            cases.append({"id": f"{name}.{i}", "type": kind, "data": b64(m), **js_key})
            expected[f"{name}.{i}"] = python_outcome(kind, m, key_file=Path(key_file))
    for n, (kind, data, py, js) in enumerate(sources):
        for i, m in enumerate(mutations(data, seed=n)):
            case_id = f"{n}.{i}"
            cases.append({"id": case_id, "type": kind, "data": b64(m), "source": "p", **js})
            expected[case_id] = python_outcome(kind, m, **py)
    r = subprocess.run([node_exe(), "web/test/differential.mjs"], cwd=ROOT, capture_output=True,
                       text=True, timeout=NODE_TIMEOUT, input=json.dumps({"cases": cases}),
                       check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    got = json.loads(r.stdout)
    differ = {k: (e, got.get(k)) for k, e in expected.items()
              if not same(e, got.get(k))}
    # Known and on the safe side: gpg skips some control characters inside the base64 of a
    # signature block (a manifest may hold them, a receipt may not); the browser refuses them.
    stricter = {k for k, (e, g) in differ.items() if k.startswith("msig.") and e["ok"]
                and g is not None and g["kind"] == "invalid"
                and re.search(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]",
                              inputs[k].split(b"-----BEGIN PGP SIGNATURE-----", 1)[-1])}
    differ = {k: v for k, v in differ.items() if k not in stricter}
    refused = sum(not e["ok"] for e in expected.values())
    print(f"{len(cases)} inputs, {refused} refused by both, {len(differ)} differ, "
          f"{len(stricter)} refused only here (control characters in a manifest's armor)")
    assert not differ, json.dumps(dict(list(differ.items())[:5]), indent=1)
    assert refused > len(cases) // 2 and len({e["reason"] for e in expected.values()}) > 30
