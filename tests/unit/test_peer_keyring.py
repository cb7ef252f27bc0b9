"""A peer's stamp of our log is checked as strictly as `stampd verify` checks a stamp: one
signature, good, by the pinned key, and a key that gpg reports revoked or expired refused
(gpg exits 0 and prints VALIDSIG for such a signature, and says so only in its status)."""

from __future__ import annotations

from pathlib import Path

import pytest

from formats.openpgp import armor_signature, dearmor_signature
from server.errors import PeerError
from server.gitlog.peers import PeerKeyring
from tests.broken_keys import revoked_public_key, sign_as_test_key

DATA = Path(__file__).resolve().parents[1] / "data"
FPR = "474CDCD4B9FAC83751047AD207C6AAE46E9FC8C9"
T = 1795400000
PAYLOAD = b"tree 0123\nparent 4567\nauthor a <a@b> 1795400000 +0000\n\nstamp\n"


def keyring(armored: str) -> PeerKeyring:
    return PeerKeyring(armored, FPR)


def test_a_good_signature_by_the_pinned_key_gives_its_time() -> None:
    secret = (DATA / "test-secret-key.asc").read_text()
    ring = keyring((DATA / "test-pubkey.asc").read_text())
    try:
        assert ring.verify(PAYLOAD, sign_as_test_key(secret, FPR, PAYLOAD, T)) == T
        with pytest.raises(PeerError, match="does not verify"):
            ring.verify(PAYLOAD + b"x", sign_as_test_key(secret, FPR, PAYLOAD, T))
    finally:
        ring.close()


def test_a_signature_by_the_revoked_pinned_key_is_refused() -> None:
    secret = (DATA / "test-secret-key.asc").read_text()
    revoked = revoked_public_key((DATA / "test-pubkey.asc").read_text(), secret, FPR, T - 60)
    ring = keyring(revoked)
    try:
        with pytest.raises(PeerError, match="REVKEYSIG"):
            ring.verify(PAYLOAD, sign_as_test_key(secret, FPR, PAYLOAD, T))
    finally:
        ring.close()


def test_two_signatures_are_refused() -> None:
    secret = (DATA / "test-secret-key.asc").read_text()
    ring = keyring((DATA / "test-pubkey.asc").read_text())
    one = sign_as_test_key(secret, FPR, PAYLOAD, T)
    two = sign_as_test_key(secret, FPR, PAYLOAD, T + 1)
    both = armor_signature(dearmor_signature(one) + dearmor_signature(two))
    try:
        with pytest.raises(PeerError, match="more than one signature"):
            ring.verify(PAYLOAD, both)
    finally:
        ring.close()
