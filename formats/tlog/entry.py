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


@dataclass(frozen=True)
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
        if self.kind not in KINDS:
            raise MalformedEntry(f"unknown kind {self.kind!r}")
        for name, n in (("serial", self.serial), ("time", self.time)):
            if not 0 <= n < 2**63:
                raise MalformedEntry(f"{name} out of range")
        if not _FINGERPRINT.fullmatch(self.key):
            raise MalformedEntry("key must be a fingerprint (40 or 64 hex digits, or SHA256:...)")
        git = self.kind in GIT_KINDS
        if git:
            if self.commit is None:
                raise MalformedEntry(f"a {self.kind} entry names its commit")
            _git_id(self.commit, "commit")
            if self.object_id is not None:
                _git_id(self.object_id, "object")
        elif self.commit is not None or self.object_id is not None:
            raise MalformedEntry(f"a {self.kind} entry names no git object")
        if self.kind in ("digest", "tsa"):
            if self.algorithm is None or self.digest is None:
                raise MalformedEntry(f"a {self.kind} entry names its digest")
            _digest(self.algorithm, self.digest)
        elif self.algorithm is not None or self.digest is not None:
            raise MalformedEntry(f"a {self.kind} entry has no digest line")
        if self.kind == "manifest":
            if self.signed is not None:
                _digest("sha256", self.signed)
        elif self.signed is not None:
            raise MalformedEntry(f"a {self.kind} entry has no signed line")

    def text(self) -> str:
        lines = [HEADER, f"serial {self.serial}", f"kind {self.kind}", f"time {self.time}",
                 f"key {self.key}"]
        if self.commit is not None:
            lines.append(f"commit {self.commit}")
        if self.object_id is not None:
            lines.append(f"object {self.object_id}")
        if self.digest is not None:
            lines.append(f"digest {self.algorithm} {self.digest}")
        if self.signed is not None:
            lines.append(f"signed sha256 {self.signed}")
        return "".join(line + "\n" for line in lines)

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
