"""formats.tlog.proof: c2sp.org/tlog-proof@v1 texts and their verification, end to end over a
log built with formats.tlog.merkle and signed with formats.note."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from formats.note import (
    ED25519,
    ED25519_COSIGNATURE,
    Ed25519Verifier,
    NoteError,
    VerifierKey,
    ed25519_signer,
    sign_note,
)
from formats.tlog.checkpoint import Checkpoint, CosignatureVerifier, cosign
from formats.tlog.errors import InvalidProof, MalformedProof, TlogError
from formats.tlog.merkle import inclusion_proof, leaf_hash, tree_levels, tree_root
from formats.tlog.proof import TlogProof, verify_proof
from formats.tlog.tiles import entry_bundle


def key(seed: bytes) -> tuple[Ed25519PrivateKey, bytes]:
    private = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(seed).digest())
    return private, private.public_key().public_bytes_raw()


ORIGIN = "stampd.example/log"
LOG_PRIV, LOG_PUB = key(b"log")
W1_PRIV, W1_PUB = key(b"w1")
W2_PRIV, W2_PUB = key(b"w2")
LOG = Ed25519Verifier(VerifierKey(ORIGIN, ED25519, LOG_PUB))
W1 = CosignatureVerifier(VerifierKey("w1.example", ED25519_COSIGNATURE, W1_PUB))
W2 = CosignatureVerifier(VerifierKey("w2.example", ED25519_COSIGNATURE, W2_PUB))

ENTRIES = [b"stamp %d" % i for i in range(1000)]
_LEVELS = tree_levels([leaf_hash(e) for e in ENTRIES])


def node(level: int, index: int) -> bytes:
    return _LEVELS[level][index]


def checkpoint_note(size: int, origin: str = ORIGIN, log_signs: bool = True) -> bytes:
    body = Checkpoint(origin, size, tree_root(size, node)).body()
    signers = [ed25519_signer(origin, LOG_PUB, LOG_PRIV.sign)] if log_signs else []
    cosigs = [
        cosign(body, "w1.example", W1_PUB, 1_700_000_000, W1_PRIV.sign),
        cosign(body, "w2.example", W2_PUB, 1_700_000_001, W2_PRIV.sign),
    ]
    return sign_note(body, signers, keep=cosigs).encode()


def make_proof(index: int, size: int, **kw: bytes | None) -> bytes:
    hashes = tuple(inclusion_proof(index, size, node))
    return TlogProof(index, hashes, checkpoint_note(size), kw.get("extra")).encode()


def test_a_proof_verifies() -> None:
    proof = make_proof(123, 1000, extra=b"context")
    got = verify_proof(proof, ENTRIES[123], origin=ORIGIN, log_keys=[LOG], witnesses=[W1, W2])
    assert got == (123, 1000)
    assert got.leaf_index == 123 and got.tree_size == 1000
    assert verify_proof(
        proof, ENTRIES[123], origin=ORIGIN, log_keys=[LOG], witnesses=[W1, W2], quorum=2
    ) == (123, 1000)
    assert verify_proof(make_proof(0, 1), ENTRIES[0], origin=ORIGIN, log_keys=[LOG]) == (0, 1)


def test_the_text_is_byte_exact() -> None:
    proof = make_proof(5, 8, extra=b"age-v1")
    lines = proof.decode().split("\n")
    assert lines[:3] == ["c2sp.org/tlog-proof@v1", "extra YWdlLXYx", "index 5"]
    assert lines[3:6] == [base64.b64encode(h).decode() for h in inclusion_proof(5, 8, node)]
    assert lines[6] == ""
    assert proof.endswith(b"\n\n" + checkpoint_note(8))
    parsed = TlogProof.parse(proof)
    assert parsed.encode() == proof
    assert parsed.extra == b"age-v1" and parsed.index == 5 and len(parsed.hashes) == 3
    assert TlogProof.parse(make_proof(5, 8)).extra is None


def test_the_spec_example_parses() -> None:
    # c2sp.org/tlog-proof: the example, with its elided signatures replaced by a real one
    # (the proof lines and checkpoint body are the spec's).
    body = "example.com/fancylog\n109482\nsFodV/vSp5O8n9a8QpW6PRY97tfOSW5bsc2Xl/EQi08=\n"
    note = sign_note(body, [ed25519_signer("example.com/fancylog", LOG_PUB, LOG_PRIV.sign)])
    text = (
        b"c2sp.org/tlog-proof@v1\n"
        b"extra YWdlLXYxLjIuMS1kYXJ3aW4tYXJtNjQudGFyLmd6kYXJ3aW4tYXJ\n"
        b"index 73894\n"
        b"gSKyXoYZUgZ6jduWYrkDOARinOMGJveXjgMkBTcdPlQ=\n"
        b"B95lDa8R83lS8n0eG+o0buTxRKQTYFi//1U8anccXmA=\n"
        b"EKNzoDWG8LGC0Yp9o+sv3qllpMP9uHQ9B20KNL+Q1zs=\n"
        b"RoopEkOdqkYqMB4MJXrbt/hMjOxsVn0IrWjpz1ZMMes=\n"
        b"AHCioX9nLjsrse6YhjRRmk1WUEirVOLLRoOQ6vfO5vk=\n"
        b"\n"
    ) + note.encode()
    parsed = TlogProof.parse(text)
    assert parsed.index == 73894 and len(parsed.hashes) == 5
    assert parsed.extra is not None and parsed.extra.startswith(b"age-v1.2.1-darwin-arm64.tar.gz")
    assert parsed.encode() == text
    # Its hashes are not a proof of anything we know: verification refuses it.
    log = Ed25519Verifier(VerifierKey("example.com/fancylog", ED25519, LOG_PUB))
    with pytest.raises(InvalidProof):
        verify_proof(text, b"entry", origin="example.com/fancylog", log_keys=[log])


def test_refusals() -> None:
    proof = make_proof(123, 1000)
    ok = {"origin": ORIGIN, "log_keys": [LOG], "witnesses": [W1, W2]}
    with pytest.raises(InvalidProof):
        verify_proof(proof, ENTRIES[124], **ok)  # another entry
    with pytest.raises(InvalidProof):
        verify_proof(proof.replace(b"index 123", b"index 122"), ENTRIES[123], **ok)
    with pytest.raises(InvalidProof):
        verify_proof(proof.replace(b"index 123", b"index 1000"), ENTRIES[123], **ok)
    with pytest.raises(TlogError):
        verify_proof(proof, ENTRIES[123], origin="other.example/log", log_keys=[LOG])
    with pytest.raises(TlogError):  # quorum not met
        verify_proof(proof, ENTRIES[123], origin=ORIGIN, log_keys=[LOG], witnesses=[W1], quorum=2)
    with pytest.raises(NoteError):  # no known key
        verify_proof(proof, ENTRIES[123], origin=ORIGIN, log_keys=[])
    # Cosigned by the witnesses but not signed by the log.
    unsigned = TlogProof(
        123, tuple(inclusion_proof(123, 1000, node)), checkpoint_note(1000, log_signs=False)
    ).encode()
    with pytest.raises(TlogError):
        verify_proof(unsigned, ENTRIES[123], **ok)
    # A flipped hash in the proof, and a checkpoint whose size was changed.
    lines = proof.split(b"\n")
    lines[3] = base64.b64encode(bytes(32))
    with pytest.raises(InvalidProof):
        verify_proof(b"\n".join(lines), ENTRIES[123], **ok)
    with pytest.raises(NoteError):
        verify_proof(proof.replace(b"\n1000\n", b"\n1001\n"), ENTRIES[123], **ok)


@pytest.mark.parametrize(
    "change",
    [
        lambda p: p.replace(b"c2sp.org/tlog-proof@v1", b"c2sp.org/tlog-proof@v2"),
        lambda p: b"\n" + p,
        lambda p: p.replace(b"index 123", b"index 0123"),
        lambda p: p.replace(b"index 123", b"index  123"),
        lambda p: p.replace(b"index 123", b"index -1"),
        lambda p: p.replace(b"index 123\n", b""),
        lambda p: p.replace(b"index 123\n", b"index 123\nextra YQ==\n"),
        lambda p: p.replace(b"index 123\n", b"index 123\nnot base64\n"),
        lambda p: p.replace(b"index 123\n", b"index 123\nYQ==\n"),  # not 32 bytes
        lambda p: p.replace(b"\n\n", b"\n", 1),
        lambda p: p.replace(b"index", b"extra \nindex"),
        lambda p: p.replace(b"index 123\n", b"index 123\n" + (b"A" * 43 + b"=\n") * 64),
        lambda p: p.split(b"\n\n")[0] + b"\n\n",  # no checkpoint
        lambda p: p.replace(b"index 123", "index \u0661\u0662\u0663".encode()),
    ],
)
def test_malformed_proofs_are_refused(change: object) -> None:
    proof = make_proof(123, 1000)
    bad = change(proof)  # type: ignore[operator]
    with pytest.raises(MalformedProof):
        TlogProof.parse(bad)


def test_the_worked_example_of_the_docs() -> None:
    # docs/transparency-formats.md: three entries, keys from fixed seeds (Ed25519 is
    # deterministic, so every byte is fixed).
    entries = [b"stamp 0", b"stamp 1", b"stamp 2"]
    levels = tree_levels([leaf_hash(e) for e in entries])
    small = lambda level, index: levels[level][index]  # noqa: E731
    log_priv, log_pub = key(b"stampd docs log")
    w_priv, w_pub = key(b"stampd docs witness")
    origin = "stampd.example/log"
    log = Ed25519Verifier(VerifierKey(origin, ED25519, log_pub))
    witness = CosignatureVerifier(VerifierKey("witness.example/w1", ED25519_COSIGNATURE, w_pub))
    assert (
        log.key.encode()
        == "stampd.example/log+a0cdd061+AYUaNCgjh2bab57BGMCifoPL7eVilY/xDEEFOL8Nyoai"
    )
    assert witness.key.encode() == (
        "witness.example/w1+7769a4e7+BKFmEWAIJH7L90S5+RZMAQwg836zbdopV4NSoM42Lgun"
    )
    body = Checkpoint(origin, 3, tree_root(3, small)).body()
    signed = sign_note(body, [ed25519_signer(origin, log_pub, log_priv.sign)])
    cosig = cosign(body, "witness.example/w1", w_pub, 1_700_000_000, w_priv.sign)
    note = sign_note(body, [], keep=[*signed.signatures, cosig]).encode()
    proof = TlogProof(1, tuple(inclusion_proof(1, 3, small)), note).encode()
    assert proof.decode() == (
        "c2sp.org/tlog-proof@v1\n"
        "index 1\n"
        "UewS4FyO4w1Yzgfqx0zC81pgeGGZi0+myZDiQzz5oX8=\n"
        "QumiaYhsS5QVtg+YwTHKwuSgCANZ1qs9wFI21q7CS6c=\n"
        "\n"
        "stampd.example/log\n"
        "3\n"
        "i8ei10N9zB7gNiVJc+o+64V4vzdG+AZkUvHKR2zpMHI=\n"
        "\n"
        "— stampd.example/log oM3QYRWyi5FjJKjzsxg2fEW7Kyu9nUjweVSux/i5ty9oYf95JXcX1t/lFBYgv8b2"
        "qpnk+ap0JVe6DLqe2yFxO4tRewA=\n"
        "— witness.example/w1 d2mk5wAAAABlU/EAgDap9Pu/KWHPRA17D68dIbl4zVghljFJhfF+vRO3q3m26h+u"
        "fkuS5WFCO9aOaxsBE4fR2nwoeXAjDoQo8oftBQ==\n"
    )
    got = verify_proof(
        proof, b"stamp 1", origin=origin, log_keys=[log], witnesses=[witness], quorum=1
    )
    assert got == (1, 3)
    assert entry_bundle(entries).hex() == ("00077374616d70203000077374616d70203100077374616d702032")
