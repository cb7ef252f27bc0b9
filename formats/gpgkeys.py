"""OpenPGP public keys as gpg lists them (``gpg --with-colons --fixed-list-mode --check-sigs``),
pure: each key's creation, expiry and revocations, and whether it could sign at a given time.

The listing is records of ``:``-separated fields (gnupg's doc/DETAILS): ``pub``/``sub`` (field
6 created, 7 expires, both seconds since the epoch; field 7 empty: never), ``fpr`` (field 10 the
fingerprint of the key before it), ``uid`` (field 10 the user id), and signatures ``sig``/``rev``
(field 2 ``!`` when gpg checked it good, field 6 its time, field 11 its class and, for a
revocation, ``,<reason>``; field 21 the reason's text). A key revocation is class 20 after its
``pub``, a subkey revocation class 28 after its ``sub``; only those gpg checked good count.

**When a key could sign** (`KeyLife.refusal_at`). A signature that existed at time ``t`` is
accepted when, at ``t``, its key and (for a subkey) its primary key were created and not expired,
and neither carries a revocation that applies at ``t``. Revocations follow RFC 4880 5.2.3.23 as
Sequoia reads it: a *soft* revocation -- reason 1 "key is superseded" or 3 "key is retired
and no longer used" -- applies from its own time on, so what was signed before it stays valid
(a key rotated out of use); a *hard* one -- reason 2 "key material has been compromised", 0 "no
reason specified", or none or any other -- applies at every time, since whoever holds a leaked
key can sign with any date. The expiry is the one the newest self-signature gives (gpg's): a
key whose expiry was moved later counts as valid in the gap.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["HARD", "SOFT_REASONS", "GpgKey", "KeyLife", "Revocation", "parse_key_listing"]

SOFT_REASONS = {1: "key is superseded", 3: "key is retired and no longer used"}
HARD = {0: "no reason specified", 2: "key material has been compromised"}
KEY_REVOCATION = "20"
SUBKEY_REVOCATION = "28"


def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass(frozen=True)
class Revocation:
    time: int
    reason: int | None  # the reason code, None when the revocation gives none
    comment: str = ""

    @property
    def soft(self) -> bool:
        return self.reason in SOFT_REASONS

    def describe(self) -> str:
        if self.reason is None:
            words = "no reason given"
        else:
            words = SOFT_REASONS.get(self.reason) or HARD.get(self.reason) or \
                f"reason {self.reason}"
        return f"revoked at {_iso(self.time)} ({words}" + \
            (f": {self.comment}" if self.comment else "") + ")"


@dataclass(frozen=True)
class KeyLife:
    """One primary key or subkey: fingerprint, creation, expiry (None: never), revocations."""

    fingerprint: str
    created: int
    expires: int | None
    revocations: tuple[Revocation, ...] = ()

    def refusal_at(self, t: int) -> str | None:
        """Why this key could not make a signature that existed at ``t`` (None: it could)."""
        hard = [r for r in self.revocations if not r.soft]
        if hard:
            return (f"{hard[0].describe()}: a hard revocation, which applies to signatures of "
                    "any time")
        soft = sorted((r for r in self.revocations if r.time <= t), key=lambda r: r.time)
        if soft:
            return soft[0].describe()
        if t < self.created:
            return f"created at {_iso(self.created)}"
        if self.expires is not None and t >= self.expires:
            return f"expired at {_iso(self.expires)}"
        return None

    def end(self) -> int | None:
        """The first time at which the key no longer signs (expiry or soft revocation)."""
        ends = [r.time for r in self.revocations if r.soft]
        if self.expires is not None:
            ends.append(self.expires)
        return min(ends) if ends else None


@dataclass(frozen=True)
class GpgKey:
    """A public key of the listing: its primary key, subkeys and user ids."""

    primary: KeyLife
    subkeys: tuple[KeyLife, ...]
    uids: tuple[str, ...]

    def life_of(self, fingerprint: str) -> KeyLife | None:
        fingerprint = fingerprint.upper()
        return next((k for k in (self.primary, *self.subkeys) if k.fingerprint == fingerprint),
                    None)

    def refusal_at(self, signing_fingerprint: str, t: int) -> str | None:
        """Why the (sub)key ``signing_fingerprint`` of this key could not make a signature that
        existed at ``t``: its own state or its primary key's; None: it could."""
        life = self.life_of(signing_fingerprint)
        if life is None:
            return f"{signing_fingerprint} is not a key of {self.primary.fingerprint}"
        primary = self.primary.refusal_at(t)
        if primary is not None:
            return f"the key {self.primary.fingerprint}: {primary}"
        if life is not self.primary:
            sub = life.refusal_at(t)
            if sub is not None:
                return f"the subkey {life.fingerprint}: {sub}"
        return None


def _number(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _revocation(fields: list[str]) -> tuple[str, Revocation] | None:
    """(class, revocation) of a checked-good ``rev`` record; None for any other."""
    if len(fields) < 11 or fields[1] != "!":
        return None
    created = _number(fields[5])
    sig_class, _, reason = fields[10].partition(",")
    if created is None or sig_class[:2] not in (KEY_REVOCATION, SUBKEY_REVOCATION):
        return None
    code = int(reason, 16) if reason and all(c in "0123456789abcdefABCDEF" for c in reason) \
        else None
    comment = fields[20] if len(fields) > 20 else ""
    return sig_class[:2], Revocation(created, code, comment.replace("\\x3a", ":"))


def parse_key_listing(text: str) -> list[GpgKey]:
    """The keys of a ``gpg --with-colons --fixed-list-mode --check-sigs`` listing, in order
    (a key or subkey whose fingerprint or creation time is missing is left out)."""
    keys: list[GpgKey] = []
    primary: dict[str, object] | None = None
    subkeys: list[dict[str, object]] = []
    current: dict[str, object] | None = None
    uids: list[str] = []

    def life(d: dict[str, object]) -> KeyLife | None:
        fpr, created = d.get("fpr"), d.get("created")
        if not isinstance(fpr, str) or not isinstance(created, int):
            return None
        revs = d.get("revs", [])
        assert isinstance(revs, list)
        expires = d.get("expires")
        return KeyLife(fpr.upper(), created, expires if isinstance(expires, int) else None,
                       tuple(revs))

    def close() -> None:
        if primary is None:
            return
        head = life(primary)
        if head is not None:
            subs = tuple(s for s in (life(d) for d in subkeys) if s is not None)
            keys.append(GpgKey(head, subs, tuple(uids)))

    for line in text.splitlines():
        fields = line.split(":")
        kind = fields[0]
        if kind == "pub":
            close()
            primary, subkeys, uids = {}, [], []
            current = primary
        elif kind == "sub" and primary is not None:
            current = {}
            subkeys.append(current)
        elif kind in ("uid", "uat"):
            current = None  # (its signatures are about the user id)
            if kind == "uid" and len(fields) > 9 and primary is not None:
                uids.append(fields[9])
            continue
        elif kind == "fpr" and current is not None and "fpr" not in current:
            if len(fields) > 9:
                current["fpr"] = fields[9]
            continue
        elif kind == "rev" and current is not None:
            found = _revocation(fields)
            wanted = KEY_REVOCATION if current is primary else SUBKEY_REVOCATION
            if found is not None and found[0] == wanted:
                revs = current.setdefault("revs", [])
                assert isinstance(revs, list)
                revs.append(found[1])
            continue
        else:
            continue
        if current is not None and len(fields) > 6:
            current["created"] = _number(fields[5])
            current["expires"] = _number(fields[6])
    close()
    return keys
