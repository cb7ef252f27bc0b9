"""The one OpenPGP acceptance check of ``stampd verify`` (git stamps, receipts, manifests) and
``stampd stamp`` (`client.verify.keys.accepted_signature`), on gpg's status lines, and on a real
gpg run where the copies differed: a good signature by a revoked key, which gpg reports with
exit status 0, ``VALIDSIG`` and ``REVKEYSIG``. ``stampd stamp`` used to accept it."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.gpg import SignatureStatus
from client.stamp.answers import Checked
from client.stamp.errors import AnswerRefused
from client.stamp.trust import describe_openpgp, verify_openpgp
from client.verify.errors import Invalid
from client.verify.keys import SIG_BINARY, SIG_TEXT, BadSignature, accepted_signature
from tests.broken_keys import revoked_public_key, sign_as_test_key

DATA = Path(__file__).resolve().parents[1] / "data"
FPR = "474CDCD4B9FAC83751047AD207C6AAE46E9FC8C9"
T = 1795400000
KEYS = frozenset({FPR})

# What gpg 2.2.40 prints (--status-fd) for one good binary signature by the test key made at T,
# by the key as it is, revoked, expired; and for a signature that expired (gpg exits 1).
CONSIDERED = f"[GNUPG:] KEY_CONSIDERED {FPR} 0"
VALIDSIG = f"[GNUPG:] VALIDSIG {FPR} 2026-11-23 {T} 0 4 0 22 8 00 {FPR}"
UID = "07C6AAE46E9FC8C9 stampd Test Key <test@stampd.invalid>"


def status(said: str, *, validsig: str = VALIDSIG, before: str = "") -> SignatureStatus:
    return SignatureStatus.parse("\n".join([
        "[GNUPG:] NEWSIG", CONSIDERED, *([before] if before else []),
        f"[GNUPG:] SIG_ID iFYdgD/XzDyqGS5rio90//KH2Mk 2026-11-23 {T}", CONSIDERED,
        f"[GNUPG:] {said} {UID}", validsig, CONSIDERED, ""]))


def accept(st: SignatureStatus, ok: bool = True, *, sig_class: str = SIG_BINARY,
           made: int = T, keys: frozenset[str] = KEYS) -> str:
    return accepted_signature(st, ok, keys=keys, origin="key file k.asc", sig_class=sig_class,
                              made=made, stated_by="the tag").primary


def test_one_good_signature_is_accepted() -> None:
    assert accept(status("GOODSIG")) == FPR


@pytest.mark.parametrize(("st", "ok", "reason"), [
    # gpg exits 0 for these two: only the status says the key is revoked or expired.
    (status("REVKEYSIG"), True, "REVKEYSIG"),
    (status("EXPKEYSIG", before="[GNUPG:] KEYEXPIRED 1795400100"), True, "EXPKEYSIG"),
    (status("EXPSIG", validsig=VALIDSIG.replace(f"{T} 0 4", f"{T} {T + 60} 4")), False,
     "EXPSIG"),
    (status("BADSIG", validsig=""), False, "BADSIG"),
    (status("GOODSIG"), False, "no valid signature"),  # gpg failed after all
])
def test_a_signature_gpg_did_not_find_good_is_refused(st: SignatureStatus, ok: bool,
                                                      reason: str) -> None:
    with pytest.raises(BadSignature) as caught:
        accept(st, ok)
    assert caught.value.reason == reason
    assert caught.value.message == f"signature does not verify: {reason}"


def test_another_key_is_named_in_the_hint() -> None:
    st = SignatureStatus.parse("[GNUPG:] NEWSIG\n[GNUPG:] ERRSIG 07C6AAE46E9FC8C9 22 8 00 "
                               f"{T} 9 {FPR}\n[GNUPG:] NO_PUBKEY 07C6AAE46E9FC8C9\n")
    with pytest.raises(BadSignature) as caught:
        accept(st, False)
    assert caught.value.message == ("signature does not verify: ERRSIG, NO_PUBKEY (signed by a "
                                    "key that is not the expected one?)")


def test_two_signatures_are_refused() -> None:
    st = status("GOODSIG")
    st.add_lines(f"[GNUPG:] NEWSIG\n[GNUPG:] GOODSIG {UID}\n{VALIDSIG}\n")
    with pytest.raises(Invalid) as caught:
        accept(st)
    assert caught.value.message == "more than one signature (only one is allowed)"


@pytest.mark.parametrize(("kw", "says"), [
    ({"keys": frozenset({"B" * 40})}, f"signed by {FPR}, which is not in the key file k.asc"),
    ({"sig_class": SIG_TEXT}, "signature class 00 is not a text signature (01)"),
    ({"made": T + 1}, f"signature made at {T}, but the tag says {T + 1}"),
])
def test_key_class_and_time(kw: dict[str, object], says: str) -> None:
    with pytest.raises(Invalid) as caught:
        accept(status("GOODSIG"), **kw)  # type: ignore[arg-type]
    assert caught.value.message == says and not isinstance(caught.value, BadSignature)


# -- stampd stamp, with a real gpg


def answer(secret: str, made: int = T) -> Checked:
    payload = b"object 0123\ntype commit\ntag t\ntagger stampd Test Key <test@stampd.invalid> " \
        + f"{T} +0000\n\nstamp\n".encode()
    return Checked(text="", payload=payload,
                   signature=sign_as_test_key(secret, FPR, payload, made), time=T)


def test_stamp_accepts_the_test_keys_signature_and_refuses_one_off_its_tagger_time() -> None:
    secret = (DATA / "test-secret-key.asc").read_text()
    trust = describe_openpgp((DATA / "test-pubkey.asc").read_bytes(), "key file k.asc")
    assert verify_openpgp(answer(secret), trust, "tag") == FPR
    with pytest.raises(AnswerRefused) as caught:
        verify_openpgp(answer(secret, T - 1), trust, "tag")
    assert caught.value.message == f"signature made at {T - 1}, but the tag says {T}"


def test_stamp_refuses_a_signature_by_a_revoked_key() -> None:
    """gpg exits 0 and prints VALIDSIG: the old check of ``stampd stamp`` accepted it, and
    stored a stamp ``stampd verify`` then refused."""
    secret = (DATA / "test-secret-key.asc").read_text()
    revoked = revoked_public_key((DATA / "test-pubkey.asc").read_text(), secret, FPR, T - 60)
    trust = describe_openpgp(revoked.encode(), "key file revoked.asc")
    with pytest.raises(AnswerRefused) as caught:
        verify_openpgp(answer(secret), trust, "tag")
    assert caught.value.message == ("the signature does not verify with the key file revoked.asc "
                                    "(REVKEYSIG)")
