"""Transparency log trust policies (c2sp.org/tlog-policy), pure: which logs and witnesses a
verifier trusts and which witnesses must have cosigned a checkpoint (the quorum).

The file is lines of items separated by spaces and tabs; empty lines and lines starting with
``#`` are ignored::

    log <vkey> [<url>]                  a trusted log (type 0x01 Ed25519 key, named its origin)
    witness <name> <vkey> [<url>]       a witness (type 0x04 Ed25519 cosignature key)
    group <name> all|any|<k> <name>...  k of the members (witnesses or groups defined above)
    quorum <name>|none                  exactly once: what must have witnessed a checkpoint

Names are defined before use, once; a member is listed at most once per group; two logs or
two witnesses with the same public key are refused; ``none`` is no group member.

`Policy.check` opens a checkpoint note with the policy's keys and says which witnesses cosigned
it and when (each cosignature carries the witness's time), whether the quorum holds, and the
earliest time at which it held: the smallest ``t`` such that the cosignatures made at or
before ``t`` already satisfy the quorum. That time is an upper bound, vouched for by the
witnesses, on when the checkpoint (and every entry in it) existed; it is not the stamp's time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from formats.note import (
    ED25519,
    ED25519_COSIGNATURE,
    Ed25519Verifier,
    NoteError,
    Verifier,
    VerifierKey,
    open_note,
)
from formats.tlog.checkpoint import Checkpoint, CosignatureVerifier, cosignature_timestamp
from formats.tlog.errors import TlogError

__all__ = ["MAX_ITEMS", "Group", "Policy", "PolicyError", "PolicyWitness", "Witnessed"]

MAX_ITEMS = 64  # logs, witnesses, groups: each (the spec recommends supporting at least 32)
NONE = "none"
_SPACE = re.compile(r"[ \t]+")
_BAD_OCTETS = re.compile(rb"[\x00-\x08\x0b-\x1f\x7f]")


class PolicyError(TlogError):
    """A policy file is not as c2sp.org/tlog-policy says, or a checkpoint fails a policy."""


@dataclass(frozen=True)
class PolicyWitness:
    name: str
    key: CosignatureVerifier
    url: str | None = None


@dataclass(frozen=True)
class Group:
    """At least ``threshold`` of ``members`` (witness or group names) witnessed."""

    name: str
    threshold: int
    members: tuple[str, ...]


@dataclass(frozen=True)
class Witnessed:
    """A checkpoint opened with a policy: its body, the cosigning witnesses' names and times,
    whether the quorum holds and since when (None: it does not hold)."""

    checkpoint: Checkpoint
    cosigned: Mapping[str, int]
    quorum_holds: bool
    quorum_time: int | None


@dataclass(frozen=True)
class Policy:
    logs: tuple[tuple[Ed25519Verifier, str | None], ...]
    witnesses: tuple[PolicyWitness, ...]
    groups: tuple[Group, ...]
    quorum: str  # a witness or group name, or "none"
    _by_name: dict[str, PolicyWitness | Group] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, PolicyWitness | Group] = {w.name: w for w in self.witnesses}
        by_name.update((g.name, g) for g in self.groups)
        object.__setattr__(self, "_by_name", by_name)

    # -- reading ------------------------------------------------------------------------------
    @classmethod
    def parse(cls, data: bytes) -> Policy:
        if _BAD_OCTETS.search(data):
            raise PolicyError("a policy holds no control characters but tab and newline")
        logs: list[tuple[Ed25519Verifier, str | None]] = []
        witnesses: list[PolicyWitness] = []
        groups: list[Group] = []
        names: set[str] = set()
        keys: set[tuple[int, bytes]] = set()
        quorum: str | None = None
        text = data.decode("utf-8", "surrogateescape")
        for number, raw in enumerate(text.split("\n"), 1):
            items = [i for i in _SPACE.split(raw.strip(" \t")) if i]
            if not items or items[0].startswith("#"):
                continue

            def fail(why: str) -> PolicyError:
                return PolicyError(f"policy line {number}: {why}")  # noqa: B023

            keyword, args = items[0], items[1:]
            if keyword == "log":
                if len(args) not in (1, 2):
                    raise fail("use: log <vkey> [<url>]")
                vk = _vkey(args[0], ED25519, "log", fail)
                if (vk.sig_type, vk.public_key) in keys:
                    raise fail("a log with this public key is listed already")
                keys.add((vk.sig_type, vk.public_key))
                logs.append((Ed25519Verifier(vk), args[1] if len(args) == 2 else None))
            elif keyword == "witness":
                if len(args) not in (2, 3):
                    raise fail("use: witness <name> <vkey> [<url>]")
                name = _new_name(args[0], names, fail)
                vk = _vkey(args[1], ED25519_COSIGNATURE, "witness", fail)
                if (vk.sig_type, vk.public_key) in keys:
                    raise fail("a witness with this public key is listed already")
                keys.add((vk.sig_type, vk.public_key))
                witnesses.append(PolicyWitness(name, CosignatureVerifier(vk),
                                               args[2] if len(args) == 3 else None))
            elif keyword == "group":
                if len(args) < 3:
                    raise fail("use: group <name> all|any|<k> <name>...")
                name = _new_name(args[0], names, fail)
                members = tuple(args[2:])
                for m in members:
                    if m in (NONE, name) or m not in names:
                        raise fail(f"group member {m!r} is not a witness or group defined above")
                if len(set(members)) != len(members):
                    raise fail("a name is listed twice as a member")
                threshold = {"all": len(members), "any": 1}.get(args[1])
                if threshold is None:
                    if not re.fullmatch(r"[1-9][0-9]*", args[1]) or int(args[1]) > len(members):
                        raise fail(f"threshold {args[1]!r} is not all, any or 1 to "
                                   f"{len(members)}")
                    threshold = int(args[1])
                groups.append(Group(name, threshold, members))
            elif keyword == "quorum":
                if len(args) != 1:
                    raise fail("use: quorum <name>|none")
                if quorum is not None:
                    raise fail("a policy has one quorum line")
                if args[0] != NONE and args[0] not in names:
                    raise fail(f"quorum {args[0]!r} is not a witness or group defined above")
                quorum = args[0]
            else:
                raise fail(f"unknown keyword {keyword!r}")
            if max(len(logs), len(witnesses), len(groups)) > MAX_ITEMS:
                raise fail(f"more than {MAX_ITEMS} logs, witnesses or groups")
        if quorum is None:
            raise PolicyError("a policy has a quorum line (quorum none: no witness needed)")
        return cls(tuple(logs), tuple(witnesses), tuple(groups), quorum)

    def encode(self) -> str:
        lines = [f"log {v.key.encode()}" + (f" {url}" if url else "") for v, url in self.logs]
        lines += [f"witness {w.name} {w.key.key.encode()}" + (f" {w.url}" if w.url else "")
                  for w in self.witnesses]
        lines += [f"group {g.name} {g.threshold} {' '.join(g.members)}" for g in self.groups]
        lines.append(f"quorum {self.quorum}")
        return "\n".join(lines) + "\n"

    # -- checking -----------------------------------------------------------------------------
    def log_verifiers(self) -> list[Verifier]:
        return [v for v, _ in self.logs]

    def witness_verifiers(self) -> list[Verifier]:
        return [w.key for w in self.witnesses]

    def holds(self, witnessed: set[str], name: str | None = None) -> bool:
        """Whether the witnesses named in ``witnessed`` satisfy ``name`` (default: the
        quorum)."""
        name = self.quorum if name is None else name
        if name == NONE:
            return True
        item = self._by_name[name]
        if isinstance(item, PolicyWitness):
            return item.name in witnessed
        return sum(self.holds(witnessed, m) for m in item.members) >= item.threshold

    def check(self, note: bytes) -> Witnessed:
        """Open the checkpoint ``note`` with the policy's keys: signed by one of its logs (else
        `PolicyError`), cosigned by which witnesses when, and the quorum. A signature line of a
        known key that does not verify refuses the note (`formats.note.NoteError`)."""
        if not self.logs:
            raise PolicyError("the policy names no log")
        try:
            opened = open_note(note, [*self.log_verifiers(), *self.witness_verifiers()])
        except NoteError as e:
            raise PolicyError(f"the checkpoint does not verify with the policy's keys: {e}") \
                from None
        signed = {(s.name, s.key_id) for s in opened.verified}
        if not signed & {(v.name, v.key_id) for v, _ in self.logs}:
            raise PolicyError("the checkpoint is not signed by a log of the policy")
        checkpoint = Checkpoint.parse(opened.text)
        if checkpoint.origin not in {v.name for v, _ in self.logs}:
            raise PolicyError(f"the checkpoint's origin {checkpoint.origin!r} is no log's "
                              "name in the policy")
        cosigned: dict[str, int] = {}
        for w in self.witnesses:
            for s in opened.verified:
                if (s.name, s.key_id) == (w.key.name, w.key.key_id):
                    cosigned[w.name] = cosignature_timestamp(s.signature)
        holds = self.holds(set(cosigned))
        quorum_time = None
        if holds and self.quorum != NONE:
            for t in sorted(set(cosigned.values())):
                if self.holds({n for n, at in cosigned.items() if at <= t}):
                    quorum_time = t
                    break
        return Witnessed(checkpoint, cosigned, holds, quorum_time)

    def describe(self) -> str:
        """The quorum in words, e.g. ``2 of witnesses (w1, w2, w3)``."""
        if self.quorum == NONE:
            return "no witness"
        item = self._by_name[self.quorum]
        if isinstance(item, PolicyWitness):
            return f"witness {item.name}"
        return f"{item.threshold} of {item.name} ({', '.join(item.members)})"


def _new_name(name: str, names: set[str], fail: Callable[[str], PolicyError]) -> str:
    if name == NONE or name in names:
        raise fail(f"name {name!r} is reserved or defined already")
    names.add(name)
    return name


def _vkey(text: str, sig_type: int, what: str,
          fail: Callable[[str], PolicyError]) -> VerifierKey:
    try:
        vk = VerifierKey.parse(text)
    except NoteError as e:
        raise fail(f"{what} key: {e}") from None
    if vk.sig_type != sig_type:
        raise fail(f"a {what} key is of signature type 0x{sig_type:02x}, not "
                   f"0x{vk.sig_type:02x}")
    return vk
