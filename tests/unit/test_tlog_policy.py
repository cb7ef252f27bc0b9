"""formats.tlog.policy: c2sp.org/tlog-policy files, and checkpoints checked against them with
signatures and cosignatures made by `cryptography` keys."""

from __future__ import annotations

import base64
import struct

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from formats.note import ED25519, ED25519_COSIGNATURE, Note, Signature, VerifierKey
from formats.tlog.checkpoint import Checkpoint, cosignature_message
from formats.tlog.merkle import EMPTY_ROOT
from formats.tlog.policy import Policy, PolicyError

ORIGIN = "example.com/log"


class Key:
    def __init__(self, name: str, sig_type: int) -> None:
        self.private = Ed25519PrivateKey.generate()
        raw = self.private.public_key().public_bytes(serialization.Encoding.Raw,
                                                     serialization.PublicFormat.Raw)
        self.vkey = VerifierKey(name, sig_type, raw)

    @property
    def line(self) -> str:
        return self.vkey.encode()

    def sign(self, text: str) -> Signature:
        return Signature(self.vkey.name, self.vkey.key_id, self.private.sign(text.encode()))

    def cosign(self, text: str, t: int) -> Signature:
        # the spec's message, built here: "cosignature/v1\ntime <t>\n" + body
        message = b"cosignature/v1\ntime %d\n" % t + text.encode()
        assert message == cosignature_message(text, t)
        return Signature(self.vkey.name, self.vkey.key_id,
                         struct.pack(">Q", t) + self.private.sign(message))


LOG = Key(ORIGIN, ED25519)
W = {n: Key(f"w{n}.example/witness", ED25519_COSIGNATURE) for n in range(1, 7)}
TEXT = Checkpoint(ORIGIN, 5, b"\x07" * 32).body()


def policy(*lines: str) -> Policy:
    return Policy.parse(("\n".join(lines) + "\n").encode())


def witnesses(*numbers: int) -> list[str]:
    return [f"witness W{n} {W[n].line}" for n in numbers]


def note(*cosigs: tuple[int, int], text: str = TEXT, log: Key = LOG) -> bytes:
    return Note(text, (log.sign(text), *(W[n].cosign(text, t) for n, t in cosigs))).encode()


def test_k_of_n_and_earliest_quorum_time() -> None:
    p = policy(f"log {LOG.line} http://127.0.0.1/", *witnesses(1, 2, 3),
               "group g 2 W1 W2 W3", "quorum g")
    w = p.check(note((1, 300), (3, 100), (2, 200)))
    assert w.quorum_holds and dict(w.cosigned) == {"W1": 300, "W2": 200, "W3": 100}
    assert w.quorum_time == 200  # W3 at 100 and W2 at 200: two of three by 200
    one = p.check(note((2, 50)))
    assert not one.quorum_holds and one.quorum_time is None
    assert p.check(note()).cosigned == {}


def test_nested_groups_of_the_spec() -> None:
    p = policy(f"log {LOG.line}", *witnesses(1, 2, 3), "group X 2 W1 W2 W3",
               *witnesses(4, 5, 6), "group Y any W4 W5 W6", "group XY all X Y", "quorum XY")
    assert not p.check(note((1, 10), (2, 20))).quorum_holds  # no Y
    assert not p.check(note((1, 10), (5, 20))).quorum_holds  # one X
    w = p.check(note((1, 10), (5, 40), (2, 20), (6, 30)))
    assert w.quorum_holds and w.quorum_time == 30


def test_quorum_none_and_a_single_witness() -> None:
    assert policy(f"log {LOG.line}", "quorum none").check(note()).quorum_holds
    p = policy(f"log {LOG.line}", *witnesses(1), "quorum W1")
    assert p.check(note((1, 7))).quorum_time == 7
    assert not p.check(note()).quorum_holds


def test_checkpoints_the_policy_refuses() -> None:
    p = policy(f"log {LOG.line}", *witnesses(1), "quorum W1")
    with pytest.raises(PolicyError, match="not signed by a log"):
        p.check(note((1, 7), log=Key(ORIGIN, ED25519)))
    forged = Note(TEXT, (LOG.sign(TEXT), Signature(W[1].vkey.name, W[1].vkey.key_id,
                                                   struct.pack(">Q", 7) + b"\0" * 64)))
    with pytest.raises(PolicyError, match="does not verify"):
        p.check(forged.encode())
    other = Checkpoint("other.example/log", 0, EMPTY_ROOT).body()
    with pytest.raises(PolicyError):  # another origin's checkpoint, though a known key signs
        p.check(note(text=other))


def test_encode_round_trip_and_comments() -> None:
    p = policy("# a comment", "", f"  log\t{LOG.line}  http://x/ ", *witnesses(1, 2),
               "group g all W1 W2", "quorum g")
    assert Policy.parse(p.encode().encode()).encode() == p.encode()
    assert p.describe() == "2 of g (W1, W2)"


@pytest.mark.parametrize(("lines", "why"), [
    (["log nonsense", "quorum none"], "line 1: log key"),
    ([f"log {W[1].line}", "quorum none"], "signature type"),
    ([f"witness W1 {LOG.line}", "quorum none"], "signature type"),
    ([f"log {LOG.line}", f"log {LOG.line}", "quorum none"], "listed already"),
    ([*witnesses(1), f"witness W2 {W[1].line}", "quorum none"], "listed already"),
    ([*witnesses(1), *witnesses(1), "quorum none"], "defined already"),
    ([f"witness none {W[1].line}", "quorum none"], "reserved"),
    ([*witnesses(1), "group g 1 W2", "quorum g"], "not a witness or group"),
    ([*witnesses(1), "group g 1 W1 W1", "quorum g"], "listed twice"),
    ([*witnesses(1), "group g 2 W1", "quorum g"], "threshold"),
    ([*witnesses(1), "group g 0 W1", "quorum g"], "threshold"),
    ([*witnesses(1), "group g 1 none", "quorum g"], "not a witness or group"),
    ([*witnesses(1), "quorum g"], "not a witness or group"),
    ([*witnesses(1), "quorum W1", "quorum none"], "one quorum"),
    ([*witnesses(1)], "quorum line"),
    (["frobnicate", "quorum none"], "unknown keyword"),
    (["quorum none\x01"], "control"),
])
def test_policies_refused(lines: list[str], why: str) -> None:
    with pytest.raises(PolicyError, match=why):
        policy(*lines)


def test_a_policy_of_too_many_witnesses_is_refused() -> None:
    keys = [Key(f"w{i}", ED25519_COSIGNATURE) for i in range(65)]
    with pytest.raises(PolicyError, match="more than 64"):
        policy(*(f"witness n{i} {k.line}" for i, k in enumerate(keys)), "quorum none")


def test_a_key_name_that_is_not_utf8_is_refused() -> None:
    """A policy is read with surrogateescape; a name holding a byte that is no UTF-8 was a
    UnicodeEncodeError (a traceback of `stampd verify --policy`), not a PolicyError."""
    key = base64.b64encode(bytes([ED25519]) + bytes(32)).decode()
    with pytest.raises(PolicyError, match="invalid key name"):
        Policy.parse(b"log bad\xffname+00000000+" + key.encode() + b" http://x/\nquorum none\n")
