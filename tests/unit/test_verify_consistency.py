"""client.verify.consistency: the proof's checkpoint against other checkpoints of the same log
(those `stampd audit` kept, and the server's tree): two that cannot both hold are a fork."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from client.audit.state import SeenCheckpoints, SeenLog
from client.verify.consistency import Forked, Signed, check_consistency, seen_checkpoints
from formats.note import ED25519, Ed25519Verifier, VerifierKey, ed25519_signer, sign_note
from formats.tlog.checkpoint import Checkpoint
from formats.tlog.merkle import inclusion_proof, leaf_hash, tree_levels, tree_root
from formats.tlog.proof import TlogProof

ORIGIN = "example.test/log"
KEY = Ed25519PrivateKey.from_private_bytes(b"\x05" * 32)
PUBLIC = KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
VERIFIER = Ed25519Verifier(VerifierKey(ORIGIN, ED25519, PUBLIC))
ENTRIES = [b"entry %d" % i for i in range(9)]
LEVELS = tree_levels([leaf_hash(e) for e in ENTRIES])


def node(level: int, index: int) -> bytes:
    return LEVELS[level][index]


def signed(what: str, size: int, root: bytes | None = None) -> Signed:
    body = Checkpoint(ORIGIN, size, tree_root(size, node) if root is None else root)
    note = sign_note(body.body(), [ed25519_signer(ORIGIN, PUBLIC, KEY.sign)]).encode()
    return Signed(what, note, body)


def proof_at(size: int) -> bytes:
    return TlogProof(2, tuple(inclusion_proof(2, size, node)), signed("p", size).note,
                     ENTRIES[2]).encode()


FORK_ROOT = hashlib.sha256(b"another tree").digest()


def test_offline_only_checkpoints_of_the_same_size_are_compared() -> None:
    proof = proof_at(len(ENTRIES))
    assert check_consistency(proof, VERIFIER, [signed("same", 9), signed("smaller", 5)]) == 1
    with pytest.raises(Forked) as info:
        check_consistency(proof, VERIFIER, [signed("kept forked", 9, FORK_ROOT)])
    assert "cannot both hold" in str(info.value)
    assert signed("kept forked", 9, FORK_ROOT).note.decode() in info.value.evidence


def test_with_the_servers_tree_every_smaller_checkpoint_is_compared() -> None:
    proof = proof_at(7)
    current = (signed("server", 9), ENTRIES)
    assert check_consistency(proof, VERIFIER, [signed("kept", 5)], current) == 2
    with pytest.raises(Forked, match="kept bad"):
        check_consistency(proof, VERIFIER, [signed("kept bad", 5, FORK_ROOT)], current)
    # a server whose entries do not make its checkpoint: no evidence either way
    assert check_consistency(proof, VERIFIER, [], (signed("server", 9, FORK_ROOT),
                                                   ENTRIES)) == 0


def test_the_audit_state_is_read(tmp_path: Path) -> None:
    forked = signed("x", 9, FORK_ROOT)
    vkey = VERIFIER.key.encode()
    SeenCheckpoints(tmp_path / "s.json", {ORIGIN: SeenLog(vkey, [forked.note.decode()])}).save()
    got = seen_checkpoints(ORIGIN, VERIFIER, tmp_path / "s.json")
    assert [s.checkpoint for s in got] == [forked.checkpoint]
    assert seen_checkpoints("other.test/log", VERIFIER, tmp_path / "s.json") == []
