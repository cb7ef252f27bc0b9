"""formats.tlog.checkpoint: checkpoint bodies and v1 Ed25519 cosignatures, with the examples of
c2sp.org/tlog-checkpoint and c2sp.org/tlog-cosignature."""

from __future__ import annotations

import base64
import hashlib

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from formats.note import (
    ED25519,
    ED25519_COSIGNATURE,
    Ed25519Verifier,
    InvalidSignature,
    MalformedVerifierKey,
    VerifierKey,
    ed25519_signer,
    open_note,
    parse_note,
    sign_note,
)
from formats.tlog.checkpoint import (
    Checkpoint,
    CosignatureVerifier,
    cosign,
    cosignature_message,
    cosignature_timestamp,
)
from formats.tlog.errors import MalformedCheckpoint
from formats.tlog.merkle import EMPTY_ROOT

# c2sp.org/tlog-checkpoint and c2sp.org/tlog-cosignature: the example checkpoint.
SPEC_BODY = "example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"
SPEC_COSIGNED = (
    SPEC_BODY + "\n— example.com/behind-the-sofa "
    "Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8=\n"
    "— witness.example.com/w1 "
    "jWbPPwAAAABkGFDLEZMHwSRaJNiIDoe9DYn/zXcrtPHeolMI5OWXEhZCB9dlrDJsX3b2oyin1nPZqhf5nNo0xUe+mbIUBkBIfZ+qnA==\n"
)

LOG_KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test log").digest())
WITNESS_KEY = Ed25519PrivateKey.from_private_bytes(hashlib.sha256(b"test witness").digest())
LOG_PUB = LOG_KEY.public_key().public_bytes_raw()
WITNESS_PUB = WITNESS_KEY.public_key().public_bytes_raw()
LOG = Ed25519Verifier(VerifierKey("example.com/log", ED25519, LOG_PUB))
WITNESS = CosignatureVerifier(VerifierKey("witness.example/w1", ED25519_COSIGNATURE, WITNESS_PUB))


def test_the_spec_checkpoint() -> None:
    cp = Checkpoint.parse(SPEC_BODY)
    assert cp.origin == "example.com/behind-the-sofa"
    assert cp.size == 20852163
    assert cp.root == base64.b64decode("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert cp.extensions == ()
    assert cp.body() == SPEC_BODY
    note = parse_note(SPEC_COSIGNED.encode())
    assert note.text == SPEC_BODY
    assert [s.name for s in note.signatures] == [
        "example.com/behind-the-sofa",
        "witness.example.com/w1",
    ]


def test_the_spec_cosignature_message_and_timestamp() -> None:
    # c2sp.org/tlog-cosignature, "Ed25519 signed message": the example at time 1679315147.
    assert cosignature_message(SPEC_BODY, 1679315147) == (
        b"cosignature/v1\ntime 1679315147\n" + SPEC_BODY.encode()
    )
    # The example's witness signature carries that very timestamp after its key ID.
    witness = parse_note(SPEC_COSIGNED.encode()).signatures[1]
    assert cosignature_timestamp(witness.signature) == 1679315147


def test_extensions_round_trip() -> None:
    cp = Checkpoint("example.com/log", 5, bytes(range(32)), ("ext one", "ext two"))
    assert cp.body().endswith("\next one\next two\n")
    assert Checkpoint.parse(cp.body()) == cp


@pytest.mark.parametrize(
    "body",
    [
        SPEC_BODY[:-1],  # no final newline
        "example.com/log\n5\n",  # two lines
        "\n5\n" + SPEC_BODY.split("\n")[2] + "\n",  # empty origin
        SPEC_BODY.replace("20852163", "020852163"),
        SPEC_BODY.replace("20852163", "+20852163"),
        SPEC_BODY.replace("20852163", "2_0852163"),
        SPEC_BODY.replace("20852163", "\u0662"),  # Arabic-Indic digit
        SPEC_BODY.replace("20852163", "-1"),
        SPEC_BODY.replace("20852163", " 20852163"),
        SPEC_BODY.replace("20852163", str(2**63)),
        SPEC_BODY.replace("q2I=", "q2I"),  # unpadded
        SPEC_BODY.replace("q2I=", "q2J="),  # non-canonical
        SPEC_BODY.replace("q2I=", "q2Iq"),  # 33 bytes... or not base64 length
        SPEC_BODY.replace("CsUY", "CsU"),
        SPEC_BODY + "\n",  # an empty extension line
        SPEC_BODY + "ext\n\n",
        SPEC_BODY + "ext\tension\n",
        # size 0 with a root other than SHA-256("")
        "example.com/log\n0\n" + base64.b64encode(bytes(32)).decode() + "\n",
    ],
)
def test_malformed_checkpoints_are_refused(body: str) -> None:
    with pytest.raises(MalformedCheckpoint):
        Checkpoint.parse(body)


def test_the_empty_tree() -> None:
    cp = Checkpoint("example.com/log", 0, EMPTY_ROOT)
    assert cp.body() == "example.com/log\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"
    assert Checkpoint.parse(cp.body()) == cp


def signed_and_cosigned(timestamp: int = 1_700_000_000) -> bytes:
    body = Checkpoint("example.com/log", 8, bytes(range(32))).body()
    note = sign_note(body, [ed25519_signer("example.com/log", LOG_PUB, LOG_KEY.sign)])
    cosig = cosign(body, "witness.example/w1", WITNESS_PUB, timestamp, WITNESS_KEY.sign)
    return sign_note(body, [], keep=[*note.signatures, cosig]).encode()


def test_cosignatures_verify() -> None:
    msg = signed_and_cosigned()
    opened = open_note(msg, [LOG, WITNESS])
    assert [s.name for s in opened.verified] == ["example.com/log", "witness.example/w1"]
    assert cosignature_timestamp(opened.verified[1].signature) == 1_700_000_000
    # The cosignature key ID uses type 0x04: the same key as a 0x01 key has another ID.
    assert WITNESS.key_id != VerifierKey("witness.example/w1", ED25519, WITNESS_PUB).key_id
    assert WITNESS.key.encode().startswith("witness.example/w1+")
    assert CosignatureVerifier.from_vkey(WITNESS.key.encode()) == WITNESS
    with pytest.raises(MalformedVerifierKey):
        CosignatureVerifier.from_vkey(LOG.key.encode())
    with pytest.raises(MalformedVerifierKey):
        Ed25519Verifier.from_vkey(WITNESS.key.encode())


def test_tampered_cosignatures_are_refused() -> None:
    msg = signed_and_cosigned().decode()
    body, _, sigs = msg.partition("\n\n")
    log_line, witness_line = sigs.splitlines()
    name, b64 = witness_line[2:].split(" ")
    raw = bytearray(base64.b64decode(b64))
    for i in (4, 11, 12, 75):  # the timestamp's first and last bytes, the signature's
        changed = bytearray(raw)
        changed[i] ^= 1
        line = f"— {name} {base64.b64encode(bytes(changed)).decode()}"
        with pytest.raises(InvalidSignature):
            open_note(f"{body}\n\n{log_line}\n{line}\n".encode(), [LOG, WITNESS])
    with pytest.raises(InvalidSignature):  # the body changed under the cosignature
        open_note(msg.replace("\n8\n", "\n9\n").encode(), [WITNESS])
    # A cosignature does not verify as a plain note signature, nor the other way round.
    assert not WITNESS.verify(body.encode() + b"\n", raw[4 + 8 :])
    short = bytes(raw[4:-1])
    assert not WITNESS.verify((body + "\n").encode(), short)


def test_cosigning_refusals() -> None:
    body = SPEC_BODY
    with pytest.raises(MalformedCheckpoint):
        cosign(body, "w", WITNESS_PUB, -1, WITNESS_KEY.sign)
    with pytest.raises(MalformedCheckpoint):
        cosign(body, "w", WITNESS_PUB, 2**63, WITNESS_KEY.sign)
    with pytest.raises(MalformedCheckpoint):
        cosign(body, "w", WITNESS_PUB, 1, LOG_KEY.sign)  # not the witness's key
    too_late = (2**63).to_bytes(8, "big") + bytes(64)
    with pytest.raises(MalformedCheckpoint):
        cosignature_timestamp(too_late)
    assert not WITNESS.verify(body.encode(), too_late)
