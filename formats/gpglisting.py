"""GnuPG's key listing, ``gpg --with-colons`` (GnuPG's doc/DETAILS), read once: the key store
(describing a key file, finding the key to export) and the gpg-agent of every worker (the key
that signs, its keygrip and user id) read the same records the same way. Pure: gpg's output
in, `Key` values out.

- Records: ``pub``/``sec`` begin a key, ``sub``/``ssb`` a subkey of it; ``fpr`` and ``grp``
  (``--with-keygrip``) belong to the record before them, ``uid`` to the key. A key or subkey
  whose fingerprint is not listed is left out, and so is a revoked user id (validity ``r``).
- `KeyPart.can_sign`: signing-capable, not revoked, expired, invalid or disabled, and, in a
  secret-key listing, with its secret key at hand in the home (field 15 ``+``; ``#`` is a
  stub, anything else a smartcard's serial number). `Key.signing_key` is the first such part
  of a usable key.
- `KeyPart.created`, `expires` (fields 6 and 7: seconds since the epoch; expires None: never)
  and `revocations`: the ``rev`` records gpg checked good (field 2 ``!``, with
  ``--check-sigs``) of the key's own class, 20 after its ``pub``, 28 after a ``sub`` (field 11
  ``<class>x,<reason>``, field 21 the reason's text); a user id's revocation (class 30) is not
  the key's. `formats.gpgkeys` says when such a key could sign.
- User ids: gpg escapes ``:``, ``\\`` and control characters (``\\x3a``, ``\\x5c``, ``\\n``...)
  and passes every other byte as it is. The bytes, unescaped, must be UTF-8; a user id that is
  not is refused (`ListingError`), never changed: stampd writes the key's user id into every
  tag and commit it signs, and `git timestamp` compares it with the key's own, byte for byte,
  so a user id with U+FFFD in place of its bytes would make a server whose stamps every
  client refuses. A key stampd cannot sign with faithfully is better refused when it is
  imported or described than when a worker starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["UNUSABLE", "Key", "KeyPart", "ListingError", "Revocation", "parse_key_listing",
           "unescape_field"]

UNUSABLE = frozenset("reid")  # validity: revoked, expired, invalid, disabled
SECRET_HERE = "+"  # field 15 of a secret-key listing: the secret key is in the home

_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|[nrfvb0\\])")
_SIMPLE_ESCAPES = {b"n": b"\n", b"r": b"\r", b"f": b"\f", b"v": b"\v", b"b": b"\b", b"0": b"\0",
                   b"\\": b"\\"}


class ListingError(ValueError):
    """A listing stampd cannot read faithfully (a user id that is not UTF-8)."""


def unescape_field(value: bytes, *, strict: bool = True) -> str:
    r"""A ``--with-colons`` field with gpg's escapes (``\x3a``, ``\n``, ``\\``...) undone, as
    UTF-8; `ListingError` if it is not UTF-8 (``strict``; else U+FFFD in its place, for text
    only shown)."""
    def replace(m: re.Match[bytes]) -> bytes:
        escape = m.group(1)
        return bytes([int(escape[1:], 16)]) if escape[:1] == b"x" else _SIMPLE_ESCAPES[escape]

    raw = _ESCAPE.sub(replace, value)
    if not strict:
        return raw.decode("utf-8", "replace")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ListingError(f"user id is not valid UTF-8: {raw!r} ({e.reason} at byte "
                           f"{e.start})") from None


def _field(fields: Sequence[bytes], index: int) -> str:
    return fields[index].decode("ascii", "replace") if len(fields) > index else ""


def _number(value: str) -> int:
    return int(value) if value.isdigit() else 0


def _time(value: str) -> int | None:
    return int(value) if value.isdigit() else None


KEY_REVOCATION = "20"
SUBKEY_REVOCATION = "28"
SOFT_REASONS = {1: "key is superseded", 3: "key is retired and no longer used"}
HARD_REASONS = {0: "no reason specified", 2: "key material has been compromised"}


@dataclass(frozen=True)
class Revocation:
    """A revocation of a key or subkey that gpg checked good: its time, its reason code (None
    when it gives none) and the reason's text."""

    time: int
    reason: int | None
    comment: str = ""

    @property
    def soft(self) -> bool:
        """Superseded or retired (RFC 4880 5.2.3.23): what was signed before it stays good."""
        return self.reason in SOFT_REASONS


def _revocation(f: Sequence[bytes]) -> tuple[str, Revocation] | None:
    """(class, revocation) of a ``rev`` record gpg checked good; None for any other."""
    if len(f) < 11 or _field(f, 1) != "!":
        return None
    created = _time(_field(f, 5))
    sig_class, _, reason = _field(f, 10).partition(",")
    if created is None or sig_class[:2] not in (KEY_REVOCATION, SUBKEY_REVOCATION):
        return None
    code = int(reason, 16) if reason and all(c in "0123456789abcdefABCDEF" for c in reason) \
        else None
    comment = unescape_field(f[20], strict=False) if len(f) > 20 else ""
    return sig_class[:2], Revocation(created, code, comment)


@dataclass(frozen=True)
class KeyPart:
    """A primary key or a subkey of a listing (a ``pub``/``sec`` or ``sub``/``ssb`` record)."""

    fingerprint: str  # upper-case hex
    algo: int  # OpenPGP public-key algorithm (1 RSA, 17 DSA, 19 ECDSA, 22 EdDSA...)
    bits: int
    curve: str | None
    capabilities: str  # e.g. "scSC": lower case for this key, upper case for the whole key
    validity: str  # "-", "u", "r" (revoked), "e" (expired)...
    keygrip: str  # with --with-keygrip, else ""
    secret: bool  # from a secret-key listing (``sec``/``ssb``)
    secret_here: bool = False  # (secret listings) its secret key is in the home, field 15 "+"
    created: int | None = None
    expires: int | None = None  # None: never
    revocations: tuple[Revocation, ...] = ()  # checked good (listed with --check-sigs)

    @property
    def usable(self) -> bool:
        """Not revoked, expired, invalid or disabled."""
        return self.validity not in UNUSABLE

    @property
    def can_sign(self) -> bool:
        """Signing-capable and usable; in a secret-key listing, with its secret key in the
        home (not a stub, not on a card)."""
        return "s" in self.capabilities and self.usable and (self.secret_here or not self.secret)


@dataclass(frozen=True)
class Key:
    """One key of a listing: its primary key, subkeys and user ids (not revoked), in listing
    order."""

    primary: KeyPart
    subkeys: tuple[KeyPart, ...] = ()
    uids: tuple[str, ...] = ()

    @property
    def fingerprint(self) -> str:
        """The primary key's fingerprint."""
        return self.primary.fingerprint

    @property
    def parts(self) -> tuple[KeyPart, ...]:
        return (self.primary, *self.subkeys)

    @property
    def fingerprints(self) -> tuple[str, ...]:
        """Fingerprints of the primary key and every subkey."""
        return tuple(p.fingerprint for p in self.parts)

    @property
    def signing_key(self) -> KeyPart | None:
        """The first part (primary key, then subkeys) that can sign; None when there is none
        or the primary key itself is not usable."""
        if not self.primary.usable:
            return None
        return next((p for p in self.parts if p.can_sign), None)


@dataclass
class _Building:
    record: list[bytes]
    fingerprint: str = ""
    keygrip: str = ""
    subkeys: list[_Building] = field(default_factory=list)
    uids: list[str] = field(default_factory=list)
    revocations: list[Revocation] = field(default_factory=list)

    def part(self) -> KeyPart:
        r = self.record
        return KeyPart(fingerprint=self.fingerprint, algo=_number(_field(r, 3)),
                       bits=_number(_field(r, 2)), curve=_field(r, 16) or None,
                       capabilities=_field(r, 11), validity=_field(r, 1),
                       keygrip=self.keygrip, secret=r[0] in (b"sec", b"ssb"),
                       secret_here=_field(r, 14) == SECRET_HERE,
                       created=_time(_field(r, 5)), expires=_time(_field(r, 6)),
                       revocations=tuple(self.revocations))

    def key(self) -> Key:
        return Key(self.part(), tuple(s.part() for s in self.subkeys if s.fingerprint),
                   tuple(self.uids))


def parse_key_listing(listing: bytes, *, strict_uids: bool = True) -> list[Key]:
    """The keys of a ``gpg --with-colons`` listing (``--list-keys``, ``--list-secret-keys``,
    ``--show-keys``, with ``--fingerprint`` or anything else that prints ``fpr`` records; with
    ``--check-sigs``, their revocations too), as gpg wrote it. Raise `ListingError` for a user
    id that is not UTF-8 (``strict_uids``; else U+FFFD in its place, for ids only shown)."""
    keys: list[_Building] = []
    current: _Building | None = None
    signed: _Building | None = None  # what a ``rev`` record now revokes (None: a user id)
    for line in listing.splitlines():
        f = line.split(b":")
        kind = f[0]
        if kind in (b"pub", b"sec"):
            current = signed = _Building(f)
            keys.append(current)
        elif kind in (b"sub", b"ssb") and keys:
            current = signed = _Building(f)
            keys[-1].subkeys.append(current)
        elif kind == b"fpr" and current is not None and not current.fingerprint:
            current.fingerprint = _field(f, 9).upper()
        elif kind == b"grp" and current is not None and not current.keygrip:
            current.keygrip = _field(f, 9).upper()
        elif kind in (b"uid", b"uat"):
            signed = None  # (the signatures after it are about the user id)
            if kind == b"uid" and keys and _field(f, 1) != "r":
                keys[-1].uids.append(unescape_field(f[9] if len(f) > 9 else b"",
                                                    strict=strict_uids))
        elif kind == b"rev" and signed is not None:
            found = _revocation(f)
            own = KEY_REVOCATION if signed.record[0] in (b"pub", b"sec") else SUBKEY_REVOCATION
            if found is not None and found[0] == own:
                signed.revocations.append(found[1])
    return [k.key() for k in keys if k.fingerprint]
