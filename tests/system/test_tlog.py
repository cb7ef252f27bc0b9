"""The transparency log of a real `stampd serve` (STAMPD_TLOG=on): every stamp gets a proof,
checked with the log's verifier key by `cryptography` (the Ed25519 signature) and pymerkle (the
tree, rebuilt from the served entry bundles), both not stampd's code; the tiles are the C2SP
layout over HTTP; bad input to every new endpoint is a 4xx; the git log pins the checkpoint."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import subprocess
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pymerkle import InmemoryTree

from formats.note import Ed25519Verifier, VerifierKey, open_note, parse_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.merkle import consistency_proof, inclusion_proof, verify_consistency
from formats.tlog.proof import TlogProof, verify_proof
from formats.tlog.tiles import Tile, parse_entry_bundle, tile_node_reader, tiles_for_size
from tests.helpers import (
    TEST_FPR,
    Server,
    log_commits,
    seed_data_dir,
    stamp_tag,
    start_server,
    wait_for,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    data = seed_data_dir(tmp_path_factory.mktemp("tlog"))
    s = start_server(data, workers=1, commit_interval=2, extra_env={"STAMPD_TLOG": "on"})
    yield s
    s.stop()


def get(server: Server, path: str, accept: str = "*/*") -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=90)
    conn.request("GET", path, headers={"Accept": accept})
    r = conn.getresponse()
    return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()


def post_digest(server: Server, digest: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/stamps", body=f"sha256={digest}",
                 headers={"Content-Type": "application/x-www-form-urlencoded",
                          "Accept": "application/json"})
    r = conn.getresponse()
    body = json.loads(r.read())
    assert r.status == 200, body
    return int(body["serial"])


def vkey(server: Server) -> str:
    status, headers, body = get(server, "/tlog/vkey")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    line = body.decode()
    assert line.endswith("\n") and line.count("\n") == 1
    return line.strip()


def check(server: Server, proof: bytes) -> tuple[Entry, int, int]:
    """(entry, index, tree size) of a proof that verifies, by stampd's code and by code that
    is not ours."""
    key = vkey(server)
    parsed = TlogProof.parse(proof)
    assert parsed.extra is not None
    origin = VerifierKey.parse(key).name
    assert origin == f"127.0.0.1:{server.port}/tlog"
    index, size = verify_proof(proof, parsed.extra, origin=origin,
                               log_keys=[Ed25519Verifier.from_vkey(key)])
    note = parse_note(parsed.checkpoint)
    Ed25519PublicKey.from_public_bytes(VerifierKey.parse(key).public_key).verify(
        note.signatures[0].signature, note.text.encode())
    return Entry.parse(parsed.extra), index, size


def test_a_digest_stamp_has_a_proof(server: Server) -> None:
    digest = hashlib.sha256(b"tlog digest").hexdigest()
    serial = post_digest(server, digest)
    status, headers, proof = get(server, f"/v1/proofs/{serial}?wait=20")
    assert status == 200, proof
    assert headers["x-stampd-serial"] == str(serial)
    entry, index, _size = check(server, proof)
    assert headers["x-stampd-log-index"] == str(index)
    assert (entry.serial, entry.kind, entry.digest, entry.key) == (serial, "digest", digest,
                                                                  TEST_FPR)


def test_a_git_stamp_has_a_proof_by_its_object_id(server: Server, tmp_path: Path) -> None:
    commit = hashlib.sha1(b"tlog commit").hexdigest()
    tag = stamp_tag(server, commit, "tlog-tag")
    object_id = subprocess.run(["git", "hash-object", "-t", "tag", "--stdin", "--literally"],
                               input=tag.encode(), capture_output=True, check=True,
                               cwd=tmp_path).stdout.decode().strip()
    status, _, proof = get(server, f"/v1/proofs/git/{object_id}?wait=20")
    assert status == 200, proof
    entry, _, _ = check(server, proof)
    assert (entry.kind, entry.commit, entry.object_id) == ("tag", commit, object_id)
    status, _, by_commit = get(server, f"/v1/proofs/git/{commit}")
    assert status == 200 and check(server, by_commit)[0] == entry


def http_tile(server: Server, tile: Tile) -> bytes:
    status, headers, data = get(server, "/tlog/" + tile.path())
    assert status == 200 and headers["cache-control"] == "public, max-age=31536000, immutable"
    return data


def test_tiles_rebuild_the_tree_and_checkpoints_are_consistent(server: Server) -> None:
    for n in range(5):
        post_digest(server, hashlib.sha256(b"tiles %d" % n).hexdigest())
    serial = post_digest(server, hashlib.sha256(b"tiles last").hexdigest())
    assert get(server, f"/v1/proofs/{serial}?wait=20")[0] == 200
    status, headers, note = get(server, "/tlog/checkpoint")
    assert status == 200 and headers["cache-control"] == "no-cache"
    opened = open_note(note, [Ed25519Verifier.from_vkey(vkey(server))])
    cp = Checkpoint.parse(opened.text)
    entries: list[bytes] = []
    for tile in tiles_for_size(cp.size):
        if tile.level == 0:
            _, _, bundle = get(server, "/tlog/" + tile.entries_path())
            entries += parse_entry_bundle(bundle, tile.width)
    theirs = InmemoryTree(algorithm="sha256")
    for e in entries:
        theirs.append_entry(e)
    assert theirs.get_root(cp.size) == cp.root  # the served entries make the signed tree
    node = tile_node_reader(cp.size, lambda t: http_tile(server, t))
    for i in range(cp.size):
        assert inclusion_proof(i, cp.size, node) == theirs.prove_inclusion(i + 1, cp.size).path[1:]
    # a later checkpoint extends this one
    later = post_digest(server, hashlib.sha256(b"tiles later").hexdigest())
    assert get(server, f"/v1/proofs/{later}?wait=20")[0] == 200
    new = Checkpoint.parse(parse_note(get(server, "/tlog/checkpoint")[2]).text)
    assert new.size > cp.size
    proof = consistency_proof(cp.size, new.size,
                              tile_node_reader(new.size, lambda t: http_tile(server, t)))
    verify_consistency(cp.size, new.size, cp.root, new.root, proof)


@pytest.mark.parametrize(("path", "status"), [
    ("/v1/proofs/abc", 400),
    ("/v1/proofs/-1", 400),
    ("/v1/proofs/99999999", 404),
    ("/v1/proofs/1?wait=abc", 400),
    ("/v1/proofs/1?wait=61", 400),
    ("/v1/proofs/1?wait=nan", 400),
    ("/v1/proofs/git/XYZ", 400),
    ("/v1/proofs/git/" + "0" * 40, 404),
    ("/tlog/tile/0/5", 404),
    ("/tlog/tile/0/x000/005", 404),
    ("/tlog/tile/0/999", 404),
    ("/tlog/tile/entries/000.p/256", 404),
    ("/tlog/tile/../../keys/secret-key.asc", 404),
    ("/tlog/tile/%2e%2e/%2e%2e/stampd.sqlite3", 404),
])
def test_bad_input_is_refused(server: Server, path: str, status: int) -> None:
    got, headers, body = get(server, path)
    assert got == status, body
    if path.startswith("/v1/"):
        assert headers["content-type"] == "application/problem+json"


def test_not_in_the_log_yet_says_when_to_ask_again(server: Server) -> None:
    serial = post_digest(server, hashlib.sha256(b"not yet").hexdigest())
    status, headers, body = get(server, f"/v1/proofs/{serial}?wait=0")
    if status == 404:  # (the sequencer may already have run: then the proof is there)
        assert headers["retry-after"] == "1"
        assert "ask again" in json.loads(body)["detail"]
    else:
        assert status == 200


def test_the_log_key_is_served_and_signs_no_stamp(server: Server) -> None:
    _, _, body = get(server, "/v1/keys")
    keys = {k["id"]: k for k in json.loads(body)["keys"]}
    tlog = keys["tlog-ed25519"]
    assert tlog["purpose"] == "tlog" and tlog["allowed_signers"] is None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    digest = hashlib.sha256(b"with the log key").hexdigest()
    conn.request("POST", "/v1/stamps",
                 body=urllib.parse.urlencode({"sha256": digest, "key": tlog["fingerprint"]}),
                 headers={"Content-Type": "application/x-www-form-urlencoded"})
    r = conn.getresponse()
    assert r.status == 400 and b"log key" in r.read()


def test_the_git_log_carries_the_checkpoint(server: Server) -> None:
    post_digest(server, hashlib.sha256(b"git log").hexdigest())
    key = Ed25519Verifier.from_vkey(vkey(server))

    def carried() -> bool:
        commits = log_commits(server.data_dir)
        return bool(commits) and "tlog-checkpoint" in commits[0].tree

    wait_for(carried, timeout=30, what="a log commit with tlog-checkpoint")
    blob = log_commits(server.data_dir)[0].tree["tlog-checkpoint"]
    opened = open_note(blob.data, [key])  # type: ignore[attr-defined]
    assert Checkpoint.parse(opened.text).origin == VerifierKey.parse(vkey(server)).name


def test_the_status_page_shows_the_verifier_key(server: Server) -> None:
    status, _, page = get(server, "/", accept="text/html")
    assert status == 200
    assert f'<pre id="tlog-vkey">{vkey(server)}</pre>'.encode() in page


def test_readiness_and_metrics_show_the_log(server: Server) -> None:
    status, _, body = get(server, "/readyz")
    checks = json.loads(body)["checks"]
    assert status == 200 and checks["tlog"] == {"ok": True, "detail": "ok"}
    assert checks["key:tlog-ed25519"]["ok"]
    size = Checkpoint.parse(parse_note(get(server, "/tlog/checkpoint")[2]).text).size
    metrics = get(server, "/metrics")[2].decode()
    line = next(x for x in metrics.splitlines() if x.startswith("stampd_tlog_checkpoint_size "))
    assert float(line.split()[1]) >= size


def test_a_tampered_proof_is_refused(server: Server) -> None:
    """A real proof with its entry, one proof line, the root, the size or the signature
    changed: each is refused (the signature by `cryptography`, through formats.note)."""
    from formats.note import NoteError
    from formats.tlog.errors import TlogError

    serial = post_digest(server, hashlib.sha256(b"tamper").hexdigest())
    for n in range(3):  # (a tree of a few entries more: the proof has lines to change)
        post_digest(server, hashlib.sha256(b"tamper %d" % n).hexdigest())
    status, _, proof = get(server, f"/v1/proofs/{serial}?wait=20")
    assert status == 200
    key = vkey(server)
    origin = VerifierKey.parse(key).name
    parsed = TlogProof.parse(proof)
    assert parsed.extra is not None and parsed.hashes
    note = parse_note(parsed.checkpoint)
    cp = Checkpoint.parse(note.text)

    def refused(proof_bytes: bytes, entry: bytes) -> None:
        with pytest.raises((TlogError, NoteError)):
            verify_proof(proof_bytes, entry, origin=origin,
                         log_keys=[Ed25519Verifier.from_vkey(key)])

    verify_proof(proof, parsed.extra, origin=origin, log_keys=[Ed25519Verifier.from_vkey(key)])
    refused(proof, parsed.extra.replace(b"kind digest", b"kind tsa"))  # the entry
    line = base64.b64encode(parsed.hashes[0]).decode()
    flipped = base64.b64encode(bytes([parsed.hashes[0][0] ^ 1]) + parsed.hashes[0][1:]).decode()
    refused(proof.replace(line.encode(), flipped.encode(), 1), parsed.extra)  # a proof line
    root = base64.b64encode(cp.root).decode()
    other = base64.b64encode(bytes(32)).decode()
    refused(proof.replace(root.encode(), other.encode()), parsed.extra)  # the root
    refused(proof.replace(f"\n{cp.size}\n".encode(), f"\n{cp.size + 1}\n".encode()),
            parsed.extra)  # the size
    sig = note.signatures[0]
    line_b64 = base64.b64encode(sig.key_id.to_bytes(4, "big") + sig.signature).decode()
    bad = base64.b64encode(sig.key_id.to_bytes(4, "big") + bytes(64)).decode()
    refused(proof.replace(line_b64.encode(), bad.encode()), parsed.extra)  # the signature
