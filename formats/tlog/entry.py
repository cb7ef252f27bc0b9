"""The entries of stampd's transparency log: one short text statement per stamp
(docs/transparency.md, "Entries").

An entry is ASCII text, one ``<field> <value>`` per line, every line ending in LF, the fields
in this order, each at most once::

    stampd-tlog-entry/v1
    serial <n>                   the stamp's serial (its journal row)
    kind <tag|branch|digest|manifest|tsa>
    time <unix seconds>          the stamp's time
    key <fingerprint>            the key that signed it (40 hex digits, or SHA256:... for SSH)
    commit <hex>                 tag, branch: the commit stamped
    object <hex>                 tag, branch: the id of the signed tag or commit answered
    digest <algorithm> <hex>     digest: the digest stamped; tsa: the message imprint
    signed sha256 <hex>          manifest: SHA-256 of the signed manifest as answered

``object`` (``signed``) is absent only for a git stamp (a manifest) whose answer the server
did not record because its process died after signing: the entry then names the commit (the
serial) and the time. Anything else is refused
(`MalformedEntry`): the encoding is canonical, so the same stamp always has the same bytes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from formats.tlog.errors import TlogError

HEADER = "stampd-tlog-entry/v1"
KINDS = ("tag", "branch", "digest", "manifest", "tsa")
GIT_KINDS = ("tag", "branch")
DIGEST_ALGORITHMS = {"sha1": 40, "sha224": 56, "sha256": 64, "sha384": 96, "sha512": 128}
MAX_ENTRY = 1024  # bytes: far above any entry; an entry bundle allows 65,535

_HEX = re.compile(r"[0-9a-f]+")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,18}")
_FINGERPRINT = re.compile(r"[0-9A-F]{40}|[0-9A-F]{64}|SHA256:[A-Za-z0-9+/]{43}")


_KEYS_SEEN: set[str] = set()  # fingerprints already found well-formed


class MalformedEntry(TlogError):
    """Bytes that are not a stampd log entry."""


def _git_id(value: str, what: str) -> str:
    if len(value) not in (40, 64) or not _HEX.fullmatch(value):
        raise MalformedEntry(f"{what} must be 40 or 64 lowercase hex digits")
    return value


def _digest(algorithm: str, value: str) -> None:
    width = DIGEST_ALGORITHMS.get(algorithm)
    if width is None:
        raise MalformedEntry(f"unknown digest algorithm {algorithm!r}")
    if len(value) != width or not _HEX.fullmatch(value):
        raise MalformedEntry(f"a {algorithm} digest is {width} lowercase hex digits")


def _check(serial: int, kind: str, time: int, key: str, commit: str | None,
           object_id: str | None, algorithm: str | None, digest: str | None,
           signed: str | None) -> None:
    if kind not in KINDS:
        raise MalformedEntry(f"unknown kind {kind!r}")
    for name, n in (("serial", serial), ("time", time)):
        if not 0 <= n < 2**63:
            raise MalformedEntry(f"{name} out of range")
    if key not in _KEYS_SEEN:
        if not _FINGERPRINT.fullmatch(key):
            raise MalformedEntry("key must be a fingerprint (40 or 64 hex digits, or SHA256:...)")
        if len(_KEYS_SEEN) < 64:  # (a server has a handful of keys: each is checked once)
            _KEYS_SEEN.add(key)
    if kind in GIT_KINDS:
        if commit is None:
            raise MalformedEntry(f"a {kind} entry names its commit")
        _git_id(commit, "commit")
        if object_id is not None:
            _git_id(object_id, "object")
    elif commit is not None or object_id is not None:
        raise MalformedEntry(f"a {kind} entry names no git object")
    if kind in ("digest", "tsa"):
        if algorithm is None or digest is None:
            raise MalformedEntry(f"a {kind} entry names its digest")
        _digest(algorithm, digest)
    elif algorithm is not None or digest is not None:
        raise MalformedEntry(f"a {kind} entry has no digest line")
    if kind == "manifest":
        if signed is not None:
            _digest("sha256", signed)
    elif signed is not None:
        raise MalformedEntry(f"a {kind} entry has no signed line")


def _text(serial: int, kind: str, time: int, key: str, commit: str | None,
          object_id: str | None, algorithm: str | None, digest: str | None,
          signed: str | None) -> str:
    text = f"{HEADER}\nserial {serial}\nkind {kind}\ntime {time}\nkey {key}\n"
    if commit is not None:
        text += f"commit {commit}\n"
    if object_id is not None:
        text += f"object {object_id}\n"
    if digest is not None:
        text += f"digest {algorithm} {digest}\n"
    if signed is not None:
        text += f"signed sha256 {signed}\n"
    return text


def encode_entry(serial: int, kind: str, time: int, key: str, commit: str | None = None,
                 object_id: str | None = None, algorithm: str | None = None,
                 digest: str | None = None, signed: str | None = None) -> bytes:
    """``Entry(...).encode()`` without making the object (what a log writer calls for each of
    tens of thousands of stamps): the same checks, the same bytes."""
    _check(serial, kind, time, key, commit, object_id, algorithm, digest, signed)
    return _text(serial, kind, time, key, commit, object_id, algorithm, digest,
                 signed).encode("ascii")


@dataclass(frozen=True, slots=True)
class Entry:
    """One stamp as the log records it (see the module docstring)."""

    serial: int
    kind: str
    time: int
    key: str
    commit: str | None = None
    object_id: str | None = None
    algorithm: str | None = None  # digest, tsa: of ``digest``
    digest: str | None = None
    signed: str | None = None  # manifest: SHA-256 (hex) of the signed manifest

    def __post_init__(self) -> None:
        _check(self.serial, self.kind, self.time, self.key, self.commit, self.object_id,
               self.algorithm, self.digest, self.signed)

    def text(self) -> str:
        return _text(self.serial, self.kind, self.time, self.key, self.commit, self.object_id,
                     self.algorithm, self.digest, self.signed)

    def encode(self) -> bytes:
        return self.text().encode("ascii")

    @classmethod
    def parse(cls, data: bytes) -> Entry:
        """The entry ``data`` encodes; `MalformedEntry` unless ``data`` is exactly what
        `encode` makes of it."""
        if len(data) > MAX_ENTRY:
            raise MalformedEntry("entry too long")
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError:
            raise MalformedEntry("an entry is ASCII text") from None
        if not text.endswith("\n"):
            raise MalformedEntry("an entry ends in a newline")
        lines = text[:-1].split("\n")
        if lines[0] != HEADER:
            raise MalformedEntry(f"an entry starts with {HEADER!r}")
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(" ")
            if not sep or not value or name in fields:
                raise MalformedEntry(f"bad line {line[:80]!r}")
            fields[name] = value
        try:
            serial, kind, t, key = (fields.pop(n) for n in ("serial", "kind", "time", "key"))
        except KeyError as e:
            raise MalformedEntry(f"an entry names its {e.args[0]}") from None
        for n in (serial, t):
            if not _NUMBER.fullmatch(n):
                raise MalformedEntry(f"bad number {n[:40]!r}")
        algorithm = digest = signed = None
        if "digest" in fields:
            algorithm, _, digest = fields.pop("digest").partition(" ")
        if "signed" in fields:
            algo, _, signed = fields.pop("signed").partition(" ")
            if algo != "sha256":
                raise MalformedEntry("the signed line is 'signed sha256 <hex>'")
        commit, object_id = fields.pop("commit", None), fields.pop("object", None)
        if fields:
            raise MalformedEntry(f"unknown field {next(iter(fields))[:40]!r}")
        entry = cls(int(serial), kind, int(t), key, commit, object_id, algorithm, digest,
                    signed)
        if entry.encode() != data:
            raise MalformedEntry("fields out of order")
        return entry
