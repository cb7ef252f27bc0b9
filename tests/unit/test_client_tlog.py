"""client.verify.tlog: a stamp's log proof checked against the stamp held and the log key, over
real logs built here with formats.tlog.merkle and signed with formats.note (no server)."""

from __future__ import annotations

import base64
import hashlib
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from client.verify.errors import Invalid, Malformed
from client.verify.tlog import (
    Held,
    check_proof,
    held_git,
    held_manifest,
    held_receipt,
    load_proof_note,
    pinned_log_keys,
    read_log_key,
    store_proof_note,
)
from formats.note import ED25519, VerifierKey, ed25519_signer, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.entry import Entry
from formats.tlog.merkle import inclusion_proof, leaf_hash, tree_levels, tree_root
from formats.tlog.proof import TlogProof
from tests.helpers import RoutesServer

ORIGIN = "127.0.0.1:8080/tlog"
KEY_FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
DIGEST = hashlib.sha256(b"hello").hexdigest()
MANIFEST = b"# stampd manifest v1\n...signed text and signature as answered...\n"
COMMIT = "1" * 40
OBJECT = "2" * 40


def keypair(seed: bytes) -> tuple[Ed25519PrivateKey, bytes]:
    private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    return private, private.public_key().public_bytes_raw()


LOG_PRIV, LOG_PUB = keypair(b"client log")
OTHER_PRIV, OTHER_PUB = keypair(b"another log")
VKEY = VerifierKey(ORIGIN, ED25519, LOG_PUB).encode()
OTHER_VKEY = VerifierKey(ORIGIN, ED25519, OTHER_PUB).encode()

RECEIPT = Entry(42, "digest", 1_764_170_000, KEY_FPR, algorithm="sha256", digest=DIGEST)
SAME_DIGEST = Entry(43, "digest", 1_764_170_000, KEY_FPR, algorithm="sha256", digest=DIGEST)
MANIFEST_ENTRY = Entry(44, "manifest", 1_764_170_001, KEY_FPR,
                       signed=hashlib.sha256(MANIFEST).hexdigest())
TAG = Entry(45, "tag", 1_764_170_002, KEY_FPR, commit=COMMIT, object_id=OBJECT)

ENTRIES = [Entry(i, "digest", 1_764_160_000 + i, KEY_FPR, algorithm="sha256",
                 digest=hashlib.sha256(b"%d" % i).hexdigest()).encode() for i in range(40)]
ENTRIES[7] = RECEIPT.encode()
ENTRIES[8] = SAME_DIGEST.encode()
ENTRIES[20] = MANIFEST_ENTRY.encode()
ENTRIES[33] = TAG.encode()
LEVELS = tree_levels([leaf_hash(e) for e in ENTRIES])


def node(level: int, index: int) -> bytes:
    return LEVELS[level][index]


def signed_checkpoint(size: int, *, origin: str = ORIGIN, root: bytes | None = None,
                      priv: Ed25519PrivateKey = LOG_PRIV, pub: bytes = LOG_PUB) -> bytes:
    body = Checkpoint(origin, size, root if root is not None else tree_root(size, node)).body()
    return sign_note(body, [ed25519_signer(origin, pub, priv.sign)]).encode()


def proof(index: int, size: int = len(ENTRIES), *, entry: bytes | None = None,
          hashes: tuple[bytes, ...] | None = None, checkpoint: bytes | None = None) -> bytes:
    return TlogProof(
        index,
        hashes if hashes is not None else tuple(inclusion_proof(index, size, node)),
        checkpoint if checkpoint is not None else signed_checkpoint(size),
        ENTRIES[index] if entry is None else entry,
    ).encode()


HELD_RECEIPT = held_receipt(42, 1_764_170_000, KEY_FPR, "sha256", DIGEST)


def refused(data: bytes, held: Held = HELD_RECEIPT, keys: tuple[str, ...] = (VKEY,)) -> str:
    with pytest.raises(Invalid) as e:
        check_proof(data, held, list(keys), source="test")
    return e.value.message


def test_a_good_proof_verifies() -> None:
    assert check_proof(proof(7), HELD_RECEIPT, [VKEY], source="t") == (7, 40)
    assert check_proof(proof(7, 8), HELD_RECEIPT, [VKEY], source="t") == (7, 8)


def test_each_kind_of_stamp_verifies() -> None:
    manifest = held_manifest(44, 1_764_170_001, KEY_FPR, MANIFEST)
    assert check_proof(proof(20), manifest, [VKEY], source="t") == (20, 40)
    tag = held_git("tag", OBJECT, COMMIT, 1_764_170_002, [KEY_FPR])
    assert check_proof(proof(33), tag, [VKEY], source="t") == (33, 40)


def test_a_proof_of_another_stamp_of_the_same_digest_is_refused() -> None:
    assert "entry: a proof of another stamp: its entry's serial is 43, not 42" in refused(
        proof(8))


@pytest.mark.parametrize(("held", "why"), [
    (held_receipt(42, 1_764_170_001, KEY_FPR, "sha256", DIGEST), "time is 1764170000, not"),
    (held_receipt(42, 1_764_170_000, "F" * 40, "sha256", DIGEST), f"key is {KEY_FPR}, not"),
    (held_receipt(42, 1_764_170_000, KEY_FPR, "sha256", "0" * 64), f"digest is {DIGEST}, not"),
    (held_manifest(42, 1_764_170_000, KEY_FPR, MANIFEST), "kind is digest, not manifest"),
])
def test_an_entry_that_is_not_the_stamp_held_names_the_field(held: Held, why: str) -> None:
    assert why in refused(proof(7), held)


def test_a_manifest_changed_since_is_not_the_entry() -> None:
    held = held_manifest(44, 1_764_170_001, KEY_FPR, MANIFEST + b"x")
    assert "its entry's signed sha256 is" in refused(proof(20), held)


def test_a_git_stamp_of_another_object_or_commit_is_refused() -> None:
    other = held_git("tag", "3" * 40, COMMIT, 1_764_170_002, [KEY_FPR])
    assert "object is 2222" in refused(proof(33), other)
    branch = held_git("commit", OBJECT, COMMIT, 1_764_170_002, [KEY_FPR])
    assert "kind is tag, not branch" in refused(proof(33), branch)


def test_a_tampered_entry_is_refused() -> None:
    # The same stamp's entry under another serial: in the proof, but not the leaf proven.
    forged = Entry(42, "digest", 1_764_170_000, KEY_FPR, algorithm="sha256",
                   digest=DIGEST).encode()
    assert "inclusion" in refused(proof(8, entry=forged))
    assert "entry: not a stampd log entry" in refused(proof(7, entry=b"stamp 7\n"))


def test_a_proof_without_its_entry_is_refused() -> None:
    data = TlogProof(7, tuple(inclusion_proof(7, 40, node)), signed_checkpoint(40)).encode()
    assert "no extra line" in refused(data)


def test_a_changed_proof_hash_index_root_or_size_is_refused() -> None:
    hashes = list(inclusion_proof(7, 40, node))
    hashes[1] = bytes(32)
    assert "log proof test: inclusion:" in refused(proof(7, hashes=tuple(hashes)))
    assert "inclusion:" in refused(proof(7, hashes=tuple(inclusion_proof(6, 40, node))))
    # index: the entry of 7 claimed at 6
    assert "inclusion:" in refused(TlogProof(
        6, tuple(inclusion_proof(6, 40, node)), signed_checkpoint(40), ENTRIES[7]).encode())
    # a root that is not the tree's, signed by the log key
    assert "inclusion:" in refused(proof(7, checkpoint=signed_checkpoint(40, root=bytes(32))))
    # the size: a checkpoint of another size than the proof's path
    assert "inclusion:" in refused(proof(7, hashes=tuple(inclusion_proof(7, 40, node)),
                                         checkpoint=signed_checkpoint(39)))


def test_a_bad_signature_is_refused() -> None:
    data = bytearray(proof(7))
    at = data.rindex(b"\n", 0, len(data) - 1) + len("\n— 127.0.0.1:8080/tlog ") + 10
    data[at] = ord("A") if data[at] != ord("A") else ord("B")
    assert "signature:" in refused(bytes(data))


def test_a_checkpoint_signed_by_another_key_or_with_a_wrong_pin_is_refused() -> None:
    other = proof(7, checkpoint=signed_checkpoint(40, priv=OTHER_PRIV, pub=OTHER_PUB))
    assert "signature: the checkpoint is not signed by the log key" in refused(other)
    assert "signature:" in refused(proof(7), keys=(OTHER_VKEY,))


def test_a_checkpoint_of_another_origin_is_refused() -> None:
    data = proof(7, checkpoint=signed_checkpoint(40, origin="example.org/log"))
    assert "origin: the checkpoint is of 'example.org/log', not of the log key's " \
        "'127.0.0.1:8080/tlog'" in refused(data)


def test_a_malformed_proof_or_key_is_malformed() -> None:
    with pytest.raises(Malformed):
        check_proof(b"not a proof\n\n", HELD_RECEIPT, [VKEY], source="t")
    with pytest.raises(Malformed):
        check_proof(proof(7), HELD_RECEIPT, ["nonsense"], source="t")


def test_log_key_given_or_in_a_file(tmp_path: Path) -> None:
    assert read_log_key(VKEY) == (VKEY, "given with --log-key")
    f = tmp_path / "vkey"
    f.write_text(VKEY + "\n")
    assert read_log_key(str(f)) == (VKEY, f"log key file {f}")
    with pytest.raises(Malformed):
        read_log_key(str(tmp_path / "missing"))
    bad = VKEY[:-4] + "AAAA"
    with pytest.raises(Malformed):
        read_log_key(bad)


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for k, v in (("user.name", "t"), ("user.email", "t@example.org")):
        subprocess.run(["git", "-C", str(repo), "config", k, v], check=True)
    return repo


def test_pinned_keys_and_git_notes(tmp_path: Path) -> None:
    repo = _repo(tmp_path)
    subprocess.run(["git", "-C", str(repo), "config", "timestamper.127-0-0-1-8080.tlogkey",
                    VKEY], check=True)
    assert pinned_log_keys(repo, "http://127.0.0.1:8080/") == [VKEY]
    assert pinned_log_keys(repo, "http://other:8080") == []
    subprocess.run(["git", "-C", str(repo), "config", "stampd.server", "http://other:8080"],
                   check=True)
    subprocess.run(["git", "-C", str(repo), "config", "stampd.tlogkey", OTHER_VKEY],
                   check=True)
    assert pinned_log_keys(repo, "http://other:8080") == [OTHER_VKEY]
    assert sorted(pinned_log_keys(repo, None)) == sorted([VKEY, OTHER_VKEY])

    subprocess.run(["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"],
                   check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert load_proof_note(repo, head) is None
    store_proof_note(repo, head, proof(7))
    store_proof_note(repo, head, proof(7))  # replaced, not refused
    assert load_proof_note(repo, head) == proof(7)
    assert check_proof(load_proof_note(repo, head) or b"", HELD_RECEIPT, [VKEY],
                       source="note") == (7, 40)


def test_proof_text_is_the_c2sp_one() -> None:
    text = proof(7).decode()
    assert text.startswith("c2sp.org/tlog-proof@v1\nextra ")
    assert base64.b64decode(text.split("\n")[1][6:]) == RECEIPT.encode()


def test_stamp_keeps_the_proof_and_pins_the_log_key(tmp_path: Path) -> None:
    from client.stamp.proofs import obtain_proof

    repo = _repo(tmp_path)
    manifest = tmp_path / "SHA256SUMS.asc"
    manifest.write_bytes(MANIFEST)
    held = held_manifest(44, 1_764_170_001, KEY_FPR, MANIFEST)
    log = RoutesServer({"/tlog/vkey": (200, VKEY.encode() + b"\n", {}),
                "/v1/proofs/44": (200, proof(20), {}),
                "/v1/proofs/42": (404, b"{}", {"Retry-After": "1"})})
    try:
        out = obtain_proof(repo, log.url, held, 2, in_repository=True, serial=44, file=manifest)
        assert out.note is None and out.line is not None
        assert "in the log at index 20, checkpoint of size 40" in out.line
        assert (tmp_path / "SHA256SUMS.asc.tlog-proof").read_bytes() == proof(20)
        assert pinned_log_keys(repo, log.url) == [VKEY]
        # not ready in time: a note, not an error
        out = obtain_proof(repo, log.url, HELD_RECEIPT, 1, in_repository=True, serial=42,
                           file=tmp_path / "r.asc")
        assert out.line is None and out.note is not None and "not ready" in out.note
        # a proof of another stamp is refused and not kept
        other = tmp_path / "other.asc"
        out = obtain_proof(repo, log.url, held_manifest(44, 1_764_170_001, KEY_FPR, b"x"), 1,
                           in_repository=True, serial=44, file=other)
        assert out.note is not None and "refused" in out.note
        assert not (tmp_path / "other.asc.tlog-proof").exists()
        # the pinned key differs from the server's now: no proof kept
        subprocess.run(["git", "-C", str(repo), "config", "--replace-all",
                        f"timestamper.127-0-0-1-{log.url.rsplit(':', 1)[1]}.tlogkey",
                        OTHER_VKEY], check=True)
        out = obtain_proof(repo, log.url, held, 1, in_repository=True, serial=44, file=other)
        assert out.note is not None and "not the pinned" in out.note
    finally:
        log.close()


def test_stamp_with_a_server_without_log_says_so(tmp_path: Path) -> None:
    from client.stamp.proofs import obtain_proof

    log = RoutesServer({})
    try:
        out = obtain_proof(tmp_path, log.url, HELD_RECEIPT, 2, in_repository=False, serial=42,
                           file=tmp_path / "r.asc")
    finally:
        log.close()
    assert out.line is None
    assert out.note is not None and "keeps no transparency log" in out.note
