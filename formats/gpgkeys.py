"""When an OpenPGP key could sign, pure: each key's creation, expiry and revocations as gpg lists
them (``gpg --with-colons --fixed-list-mode --check-sigs``, read by `formats.gpglisting`, the
one reader of gpg's key listings), and whether it could sign at a given time.

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

from formats import gpglisting
from formats.gpglisting import HARD_REASONS, SOFT_REASONS, KeyPart, Revocation

__all__ = ["GpgKey", "KeyLife", "Revocation", "describe", "parse_key_listing"]

def _iso(t: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def describe(revocation: Revocation) -> str:
    """``revoked at <time> (<reason>: <text>)``."""
    r = revocation
    if r.reason is None:
        words = "no reason given"
    else:
        words = SOFT_REASONS.get(r.reason) or HARD_REASONS.get(r.reason) or f"reason {r.reason}"
    return f"revoked at {_iso(r.time)} ({words}" + (f": {r.comment}" if r.comment else "") + ")"


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
            return (f"{describe(hard[0])}: a hard revocation, which applies to signatures of "
                    "any time")
        soft = sorted((r for r in self.revocations if r.time <= t), key=lambda r: r.time)
        if soft:
            return describe(soft[0])
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


def _life(part: KeyPart) -> KeyLife | None:
    if part.created is None:
        return None
    return KeyLife(part.fingerprint, part.created, part.expires, part.revocations)


def parse_key_listing(text: str) -> list[GpgKey]:
    """The keys of a ``gpg --with-colons --fixed-list-mode --check-sigs`` listing, in order
    (a key or subkey whose fingerprint or creation time is missing is left out; a user id that
    is not UTF-8 is shown with U+FFFD)."""
    keys: list[GpgKey] = []
    for key in gpglisting.parse_key_listing(text.encode(), strict_uids=False):
        head = _life(key.primary)
        if head is not None:
            subs = tuple(life for life in map(_life, key.subkeys) if life is not None)
            keys.append(GpgKey(head, subs, key.uids))
    return keys
