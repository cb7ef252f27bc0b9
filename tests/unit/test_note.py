"""formats.note: signed notes and verifier keys, with the vectors of c2sp.org/signed-note and
golang.org/x/mod/sumdb/note (note_test.go, BSD-3-Clause; commit fe2ec04f7c3c)."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from formats.note import (
    ED25519,
    Ed25519Verifier,
    InvalidSignature,
    InvalidSigner,
    MalformedNote,
    MalformedVerifierKey,
    Note,
    NoteError,
    Signature,
    UnverifiedNote,
    VerifierKey,
    ed25519_signer,
    key_id,
    open_note,
    parse_note,
    sign_note,
)

# golang.org/x/mod/sumdb/note note_test.go: keys and signatures of TestSign and TestOpen.
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
# The private key of PETER_VKEY, "PRIVATE+KEY+PeterNeumann+c74f20a3+<base64(0x01 || seed)>".
PETER_SEED = base64.b64decode("AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz")[1:]
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
TEXT = (
    "If you think cryptography is the answer to your problem,\n"
    "then you don't know what your problem is.\n"
)
PETER_B64 = (
    "x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM="
)
PETER_SIG = f"— PeterNeumann {PETER_B64}\n"
ENOCH_SIG = (
    "— EnochRoot "
    "rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1RvMc+QQ=\n"
)

# c2sp.org/signed-note, "Verifier keys / Example".
SPEC_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
SPEC_NOTE = (
    "This is an example message.\n\n"
    "— example.com/foo "
    "Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n"
)

PETER = Ed25519Verifier.from_vkey(PETER_VKEY)
ENOCH = Ed25519Verifier.from_vkey(ENOCH_VKEY)
PETER_KEY = Ed25519PrivateKey.from_private_bytes(PETER_SEED)


def test_the_spec_example_verifies() -> None:
    opened = open_note(SPEC_NOTE.encode(), [Ed25519Verifier.from_vkey(SPEC_VKEY)])
    assert opened.text == "This is an example message.\n"
    assert [s.name for s in opened.verified] == ["example.com/foo"]
    assert VerifierKey.parse(SPEC_VKEY).encode() == SPEC_VKEY


def test_key_ids() -> None:
    key = VerifierKey.parse(PETER_VKEY)
    assert key.sig_type == ED25519 and key.key_id == 0xC74F20A3 == PETER.key_id
    assert key_id("PeterNeumann", ED25519, key.public_key) == 0xC74F20A3
    assert PETER_KEY.public_key().public_bytes_raw() == key.public_key
    assert VerifierKey("PeterNeumann", ED25519, key.public_key).encode() == PETER_VKEY


def test_signing_through_a_callable_is_byte_exact() -> None:
    # golang.org/x/mod/sumdb/note TestSign: Ed25519 is deterministic.
    signer = ed25519_signer("PeterNeumann", PETER.key.public_key, PETER_KEY.sign)
    assert signer.key_id == 0xC74F20A3
    note = sign_note(TEXT, [signer])
    assert note.encode().decode() == TEXT + "\n" + PETER_SIG
    # An existing signature of the same key is replaced, others are kept before.
    stale = Signature("PeterNeumann", 0xC74F20A3, b"BADSIGN")
    enoch = parse_note((TEXT + "\n" + ENOCH_SIG).encode()).signatures[0]
    again = sign_note(TEXT, [signer], keep=[enoch, stale])
    assert again.encode().decode() == TEXT + "\n" + ENOCH_SIG + PETER_SIG


def test_signing_refusals() -> None:
    signer = ed25519_signer("PeterNeumann", PETER.key.public_key, PETER_KEY.sign)
    with pytest.raises(MalformedNote):
        sign_note("abc", [signer])  # no final newline
    with pytest.raises(MalformedNote):
        sign_note("a\x01b\n", [signer])
    other = Ed25519PrivateKey.generate()
    liar = ed25519_signer("PeterNeumann", PETER.key.public_key, other.sign)
    with pytest.raises(InvalidSigner):
        sign_note(TEXT, [liar])
    with pytest.raises(MalformedVerifierKey):
        ed25519_signer("bad name", PETER.key.public_key, PETER_KEY.sign)
    with pytest.raises(MalformedNote):
        sign_note(TEXT, [])


def test_open() -> None:
    # golang.org/x/mod/sumdb/note TestOpen.
    msg = (TEXT + "\n" + PETER_SIG + ENOCH_SIG).encode()
    one = open_note(msg, [PETER])
    assert one.text == TEXT
    assert [(s.name, s.key_id) for s in one.verified] == [("PeterNeumann", 0xC74F20A3)]
    assert [(s.name, s.key_id) for s in one.unverified] == [("EnochRoot", 0xAF0CFE78)]
    both = open_note(msg, [PETER, ENOCH])
    assert [s.name for s in both.verified] == ["PeterNeumann", "EnochRoot"]
    assert both.unverified == ()
    with pytest.raises(UnverifiedNote) as e:
        open_note(msg, [])
    assert [s.name for s in e.value.note.signatures] == ["PeterNeumann", "EnochRoot"]
    with pytest.raises(NoteError):  # two verifiers for one key
        open_note((TEXT + "\n" + PETER_SIG).encode(), [ENOCH, PETER, ENOCH])
    # Duplicated lines are verified and reported once.
    dup = open_note((TEXT + "\n" + PETER_SIG * 2 + ENOCH_SIG * 2).encode(), [PETER])
    assert len(dup.verified) == 1 and len(dup.unverified) == 1


def test_unknown_keys_sharing_a_name_or_an_id_are_ignored() -> None:
    # c2sp.org/signed-note: "Verifiers MUST ignore signatures from unknown keys, even if they
    # share a name or ID (but not both) with a known key."
    other_name = PETER_SIG.replace("PeterNeumann", "PeterNeuman")
    opened = open_note((TEXT + "\n" + other_name + PETER_SIG).encode(), [PETER])
    assert [s.name for s in opened.unverified] == ["PeterNeuman"]
    other_id = Signature("PeterNeumann", 0xC74F20A4, bytes(64)).line()
    opened = open_note((TEXT + "\n" + other_id + PETER_SIG).encode(), [PETER])
    assert [s.key_id for s in opened.unverified] == [0xC74F20A4]


def test_tampering_is_refused() -> None:
    msg = TEXT + "\n" + PETER_SIG
    # golang.org/x/mod/sumdb/note TestOpen: "Invalid signature" (ABCD inserted).
    with pytest.raises(InvalidSignature):
        open_note((TEXT + "\n" + PETER_SIG[:60] + "ABCD" + PETER_SIG[60:]).encode(), [PETER])
    with pytest.raises(InvalidSignature):
        open_note(msg.replace("problem,", "problem;").encode(), [PETER])
    with pytest.raises(InvalidSignature):  # a bad signature rejects the note despite a good one
        bad = Signature("PeterNeumann", 0xC74F20A3, bytes(64)).line()
        open_note((TEXT + "\n" + PETER_SIG + bad).encode(), [PETER])


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_any_changed_byte_is_refused(data: st.DataObject) -> None:
    msg = bytearray((TEXT + "\n" + PETER_SIG).encode())
    i = data.draw(st.integers(0, len(msg) - 1))
    msg[i] = data.draw(st.integers(0, 255).filter(lambda b: b != msg[i]))
    with pytest.raises(NoteError):
        open_note(bytes(msg), [PETER])


@pytest.mark.parametrize(
    "msg",
    [
        # golang.org/x/mod/sumdb/note TestOpen badMsgs.
        TEXT,
        TEXT + "\n",
        TEXT + "\n" + PETER_SIG[:-1],
        "\x01" + TEXT + "\n" + PETER_SIG,
        TEXT + "\n" + f"— Bad Name {PETER_B64}",
        TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
        # And ours.
        TEXT + "\n" + PETER_SIG.replace("—", "-"),  # a hyphen, not the em dash
        TEXT + "\n" + PETER_SIG.replace("— ", "—  "),
        TEXT + "\n" + PETER_SIG.replace("AM=", "AM"),  # unpadded
        TEXT + "\n" + PETER_SIG.replace("AM=", "AN="),  # non-canonical last bits
        TEXT + "\n" + PETER_SIG.replace("Peter", "Peter+"),
        TEXT + "\n" + PETER_SIG.replace("Peter", "Peter\u00a0"),  # a Unicode space
        TEXT + "\n" + "— PeterNeumann x08g\n",  # too short
        TEXT + "\n" + "— PeterNeumann \n",
        TEXT + "\n" + PETER_SIG + "\n",
        TEXT + "\n" + PETER_SIG.replace("\n", "\r\n"),
        TEXT.replace("\n", "\t\n", 1) + "\n" + PETER_SIG,
    ],
)
def test_malformed_notes_are_refused(msg: str) -> None:
    with pytest.raises(MalformedNote):
        open_note(msg.encode(), [PETER])


def test_non_utf8_and_too_many_signatures_are_refused() -> None:
    with pytest.raises(MalformedNote):
        open_note(b"\xff" + (TEXT + "\n" + PETER_SIG).encode(), [PETER])
    # golang.org/x/mod/sumdb/note TestOpen: 101 signatures are too many (our limit is 100;
    # the spec asks to accept at least 16).
    with pytest.raises(MalformedNote):
        open_note((TEXT + "\n" + PETER_SIG * 101).encode(), [PETER])
    assert len(open_note((TEXT + "\n" + PETER_SIG * 100).encode(), [PETER]).verified) == 1


def test_the_text_ends_at_the_last_blank_line() -> None:
    text = "one\n\ntwo\n"
    signer = ed25519_signer("PeterNeumann", PETER.key.public_key, PETER_KEY.sign)
    msg = sign_note(text, [signer]).encode()
    assert open_note(msg, [PETER]).text == text
    assert parse_note(msg) == Note(text, parse_note(msg).signatures)


def test_a_key_whose_base64_holds_a_plus_parses() -> None:
    """Only the first two "+" separate a vkey's fields (Go's note.NewVerifier chops them off
    one by one): base64 of the key may hold more."""
    key = VerifierKey("example.com/log", 0x01, bytes(range(224, 256)))
    vkey = key.encode()
    assert "+" in vkey.split("+", 2)[2]
    assert VerifierKey.parse(vkey) == key


def test_malformed_verifier_keys_are_refused() -> None:
    # golang.org/x/mod/sumdb/note TestNewVerifier: every substring and every byte changed.
    b = PETER_VKEY
    for i in range(len(b) + 1):
        for j in range(i + 1, len(b) + 1):
            if (i, j) != (0, len(b)):
                with pytest.raises(MalformedVerifierKey):
                    VerifierKey.parse(b[i:j])
    for i in range(len(b)):
        with pytest.raises(MalformedVerifierKey):
            VerifierKey.parse(b[:i] + chr(ord(b[i]) + 1) + b[i + 1 :])
    for bad in (
        # wrong length key, with adjusted key hash; unknown algorithm, with adjusted key hash
        "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
        "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
        PETER_VKEY.replace("c74f20a3", "C74F20A3"),  # hex is lowercase
        PETER_VKEY + "+",
    ):
        with pytest.raises(MalformedVerifierKey):
            VerifierKey.parse(bad)
