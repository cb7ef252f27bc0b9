"""formats.gpgkeys: keys read from gpg's colon listing, and whether a key could sign at a time:
created and not expired then; a soft revocation (superseded, retired) applies from its time on,
a hard one (compromised, no reason) at every time; a subkey's primary key counts too."""

from __future__ import annotations

from formats.gpgkeys import parse_key_listing

FPR = "4E06D4B1F2E7063A64C0DEB8C8855EC529EE14F8"
SUB = "1111111111111111111111111111111111111111"
CREATED, EXPIRES, REVOKED = 1796182124, 1796268524, 1796182137

# (as gpg 2.2.40 printed it for a key revoked with reason 2 = "superseded", code 01)
LISTING = f"""tru:o:1:1796182124:1:3:1:5
pub:r:255:22:C8855EC529EE14F8:{CREATED}:{EXPIRES}::u:::sc:::::ed25519:::0:
fpr:::::::::{FPR}:
rev:!::22:C8855EC529EE14F8:{REVOKED}::::Alice <alice@x>:20x,01::{FPR}:::8:::::rotated:
uid:r::::{CREATED}::D91449E6E8F2C05BBD2BBE282F1B53A99F523341::Alice <alice@x>::::::::::0:
sig:!::22:C8855EC529EE14F8:{CREATED}::::Alice <alice@x>:13x::{FPR}:::8:
rev:!::22:C8855EC529EE14F8:{CREATED + 1}::::Alice <alice@x>:30x,20::{FPR}:::8:
"""


def key_with(revocations: str = "", sub: str = "") -> str:
    return (f"pub:u:255:22:C8855EC529EE14F8:{CREATED}:::u:::scSC:\nfpr:::::::::{FPR}:\n"
            f"{revocations}uid:u::::{CREATED}::X::Alice <alice@x>::::\n{sub}")


def test_a_soft_revocation_applies_from_its_time() -> None:
    (key,) = parse_key_listing(LISTING)
    assert key.uids == ()  # (its one user id is revoked: formats.gpglisting leaves it out)
    assert (key.primary.created, key.primary.expires) == (CREATED, EXPIRES)
    assert len(key.primary.revocations) == 1  # (the user id's revocation, class 30, is not)
    rev = key.primary.revocations[0]
    assert rev.soft and rev.reason == 1 and rev.comment == "rotated"
    assert key.refusal_at(FPR, REVOKED - 1) is None
    assert key.refusal_at(FPR, REVOKED) == (
        f"the key {FPR}: revoked at 2026-12-02T03:28:57Z (key is superseded: rotated)")
    assert key.refusal_at(FPR, CREATED - 1) is not None  # before the key existed
    assert key.primary.end() == REVOKED


def test_expiry() -> None:
    (key,) = parse_key_listing(LISTING.replace("rev:!::22:C8855EC529EE14F8:1796182137", "#"))
    assert key.primary.revocations == ()
    assert key.refusal_at(FPR, EXPIRES - 1) is None
    assert key.refusal_at(FPR, EXPIRES) == f"the key {FPR}: expired at 2026-12-03T03:28:44Z"


def test_hard_revocations_apply_at_every_time() -> None:
    for reason in (",02", ",00", ""):
        rev = f"rev:!::22:K:{CREATED + 50}::::A:20x{reason}::{FPR}:::8:\n"
        (key,) = parse_key_listing(key_with(rev))
        refusal = key.refusal_at(FPR, CREATED + 1)
        assert refusal is not None and "hard revocation" in refusal, reason
    # a revocation gpg did not check good ('-' bad, '?' no key) is none
    (key,) = parse_key_listing(key_with(f"rev:-::22:K:{CREATED + 50}::::A:20x,02::{FPR}:\n"))
    assert key.refusal_at(FPR, CREATED + 1) is None


def test_subkeys_and_their_primary() -> None:
    sub = (f"sub:u:255:22:1111:{CREATED + 10}:{CREATED + 100}:::::s:\nfpr:::::::::{SUB}:\n"
           f"sig:!::22:K:{CREATED + 10}::::A:18x::{FPR}:\n"
           f"rev:!::22:K:{CREATED + 60}::::A:28x,03::{FPR}:\n")
    (key,) = parse_key_listing(key_with(sub=sub))
    assert [k.fingerprint for k in key.subkeys] == [SUB]
    assert key.refusal_at(SUB, CREATED + 20) is None
    assert "the subkey 1111" in (key.refusal_at(SUB, CREATED + 5) or "")  # not created yet
    assert "retired" in (key.refusal_at(SUB, CREATED + 60) or "")  # soft revocation, class 28
    assert key.refusal_at(FPR, CREATED + 60) is None  # the primary key is not revoked
    assert key.refusal_at("2" * 40, CREATED + 20) is not None
    two = parse_key_listing(key_with(sub=sub) + key_with().replace(FPR, "3" * 40))
    assert [k.primary.fingerprint for k in two] == [FPR, "3" * 40]
