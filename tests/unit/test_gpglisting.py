"""gpg's ``--with-colons`` key listing, read once for the key store and the workers' agents
(formats/gpglisting.py), on listings gpg 2.2.40 printed and on the lines where the two readers
it replaces differed: a user id that is not UTF-8 (one reader put U+FFFD in, the other refused
it), a revoked user id, and which part may sign (one reader looked at the capability alone, the
other at validity and the secret key too)."""

from __future__ import annotations

import pytest

from formats.gpglisting import ListingError, parse_key_listing, unescape_field

PRIMARY = "9CE841AE44CC0B99C72AC54D63D2BE1FB6A86503"
SUBKEY = "6D402CC19DE8DC775663380C12484A43ACD6E02A"
UID = b"uid:-::::1577836800::600F99B979A84D85B33B29194F78251FAE781882::Test ed25519-subkey <t@example>::::::::::0:"  # noqa: E501

# gpg --with-colons --fingerprint --with-keygrip --show-keys tests/data/keys/ed25519-subkey.*
PUBLIC = b"""pub:-:255:22:63D2BE1FB6A86503:1577836800:::-:::cSC:::::ed25519:::0:
fpr:::::::::9CE841AE44CC0B99C72AC54D63D2BE1FB6A86503:
grp:::::::::46BE9514F82B95397D57D5F0E74ED698868FBBA4:
%(uid)s
sub:-:255:22:12484A43ACD6E02A:1577836800::::::s:::::ed25519::
fpr:::::::::6D402CC19DE8DC775663380C12484A43ACD6E02A:
grp:::::::::39D5FCEB31A8E7327E3B757DA08700EFCCE6EE83:
""" % {b"uid": UID}
# The secret key file shown: "#" in field 15, the secret keys are not in the home; an agent's
# home that imported it lists "+" there.
STUBS = PUBLIC.replace(b"pub:", b"sec:").replace(b"sub:", b"ssb:") \
    .replace(b":cSC:::::", b":cSC:::#::").replace(b"::::::s:::::", b"::::::s:::#::")
SECRET = STUBS.replace(b":::#::", b":::+::")


def test_a_public_listing() -> None:
    [key] = parse_key_listing(PUBLIC)
    assert key.fingerprint == PRIMARY and key.fingerprints == (PRIMARY, SUBKEY)
    assert key.uids == ("Test ed25519-subkey <t@example>",)
    assert (key.primary.curve, key.primary.algo, key.primary.bits) == ("ed25519", 22, 255)
    assert key.primary.keygrip == "46BE9514F82B95397D57D5F0E74ED698868FBBA4"
    assert not key.primary.secret and not key.primary.can_sign  # (certifies only)
    assert key.signing_key is not None and key.signing_key.fingerprint == SUBKEY


def test_a_secret_key_signs_only_where_it_is_in_the_home() -> None:
    [stubs] = parse_key_listing(STUBS)
    assert stubs.primary.secret and not stubs.subkeys[0].secret_here
    assert stubs.signing_key is None  # the key store's reader took the stub subkey
    [key] = parse_key_listing(SECRET)
    assert key.signing_key is not None and key.signing_key.fingerprint == SUBKEY


@pytest.mark.parametrize("validity", [b"r", b"e", b"i", b"d"])
def test_an_unusable_subkey_does_not_sign_and_the_next_one_does(validity: bytes) -> None:
    other = b"sub:-:255:22:1111111111111111:1577836800::::::s:::::ed25519::\nfpr:::::::::" \
        + b"1" * 40 + b":\n"
    listing = PUBLIC.replace(b"sub:-:", b"sub:" + validity + b":") + other
    [key] = parse_key_listing(listing)
    assert key.subkeys[0].fingerprint == SUBKEY and not key.subkeys[0].can_sign
    assert key.signing_key is not None and key.signing_key.fingerprint == "1" * 40


def test_an_unusable_primary_key_has_no_signing_key() -> None:
    [key] = parse_key_listing(PUBLIC.replace(b"pub:-:", b"pub:e:"))
    assert key.subkeys[0].can_sign and key.signing_key is None


def test_a_revoked_user_id_is_left_out() -> None:
    revoked = UID.replace(b"uid:-:", b"uid:r:").replace(b"Test ed25519-subkey", b"Old")
    [key] = parse_key_listing(PUBLIC.replace(UID, revoked + b"\n" + UID))
    assert key.uids == ("Test ed25519-subkey <t@example>",)


def test_a_part_without_its_fingerprint_is_left_out() -> None:
    [key] = parse_key_listing(PUBLIC.replace(b"fpr:::::::::" + SUBKEY.encode() + b":\n", b""))
    assert key.subkeys == () and key.signing_key is None
    assert parse_key_listing(PUBLIC.replace(b"fpr:::::::::" + PRIMARY.encode(), b"x")) == []


# User ids as gpg 2.2.40 lists them: ":" and "\" escaped (\x3a, \x5c), a newline as \n, every
# other byte as it is, UTF-8 or not.
@pytest.mark.parametrize(("listed", "uid"), [
    (b"Caf\xc3\xa9 \xc3\xbc <c@x>", "Caf\u00e9 \u00fc <c@x>"),
    (b"a\\x3ab\\x5c\\x5cc\\n <c@x>", "a:b\\\\c\n <c@x>"),
    (b"a\\\\b\\0", "a\\b\0"),  # the short escapes gpg's escaping also knows
    (b"\\xc3\\xa9", "\u00e9"),  # escaped bytes are UTF-8 too
])
def test_user_ids_are_unescaped_as_utf8(listed: bytes, uid: str) -> None:
    assert unescape_field(listed) == uid
    [key] = parse_key_listing(PUBLIC.replace(b"Test ed25519-subkey <t@example>", listed))
    assert key.uids == (uid,)


@pytest.mark.parametrize("listed", [b"Caf\xe9 a\\x3ab <c@x>", b"Caf\\xe9 <c@x>"])
def test_a_user_id_that_is_not_utf8_is_refused_not_changed(listed: bytes) -> None:
    """Written into every stamp, a user id with U+FFFD in place of its bytes would not be the
    key's: `git timestamp` refuses such stamps. (The key store's reader put U+FFFD in.)"""
    with pytest.raises(ListingError, match="user id is not valid UTF-8"):
        parse_key_listing(PUBLIC.replace(b"Test ed25519-subkey <t@example>", listed))
