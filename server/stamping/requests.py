"""The requests the service accepts, validated: each knows its kind, its journal row, the job
that signs it and what the signed job answers, so that nothing else branches on what kind of
request it is. Every kind has one interface, `Request`: the `Stamper` has one path for all.
(The RFC 3161 request, `server.stamping.rfc3161.TimestampRequest`, lives with the rest of
the time-stamping authority.)
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import InitVar, dataclass, field, replace
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from formats.gitobjects import object_format_of
from formats.jobs import CommitJob, Job, ManifestJob, ReceiptJob, TagJob
from formats.keys import STAMPS, ServedKey
from formats.manifests import Buckets, Manifest, Text, buckets
from formats.receipts import Statement
from server.errors import BadRequest, MalformedAnswer

J = TypeVar("J", bound=Job)  # the job a request kind builds
A_co = TypeVar("A_co", covariant=True)  # what its stamp answers


@dataclass(frozen=True)
class StampContext:
    """What a request's job needs besides the request: the journal's time and serial of its
    row, the key that signs it, and the server's public URL."""

    time: int
    serial: int
    key: ServedKey
    url: str

    @property
    def uid(self) -> str | None:
        """The user id a git object names, for keys that carry none of their own (SSH)."""
        return None if self.key.format == "openpgp" else self.key.uid


@dataclass(frozen=True)
class Outcome(Generic[A_co]):
    """What a signed job answers, and what the journal records of it: a git object's id, with
    the next group commit; or the signed text itself (``stored``; a manifest's in the parts
    whose concatenation it is), committed before the answer goes out (so that a GET finds it
    from then on)."""

    answer: A_co
    object_id: str | None = None
    stored: str | tuple[Text, ...] | None = None


class Request(Protocol[J, A_co]):
    """The interface of every request kind."""

    kind: ClassVar[str]  # the journal row's kind, and the metrics' label
    noun: ClassVar[str]  # what its answer is called (in errors)
    # Its job does not name the row's serial (`StampContext.serial`) and is a git object's
    # (`formats.jobs.GitJob`), whose outcome is that object's id and nothing stored: the job
    # can be built before the row is committed, and the row, the job and the outcome are one
    # call to the coordinator (`Stamper`), which journals the outcome itself.
    serial_free: ClassVar[bool]

    def journal_fields(self) -> dict[str, Any]: ...

    def digest_buckets(self) -> Buckets | None: ...

    def job(self, ctx: StampContext) -> J: ...

    def outcome(self, ctx: StampContext, job: J, signed: str) -> Outcome[A_co]:
        """The answer from the worker's signed text; `MalformedAnswer` if it is not one."""
        ...


def _message(commit: str, url: str, t: int) -> str:
    """The message of a tag or branch stamp (the same text for both)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f"Timestamp of commit {commit}\nby {url} at {when}\n"


@dataclass(frozen=True)
class TagRequest:
    """Zeitgitter ``stamp-tag-v1``: a signed tag of ``commit`` (40 hex digits: a SHA-1
    repository; 64: a SHA-256 one)."""

    kind: ClassVar[str] = "tag"
    noun: ClassVar[str] = "tag"
    serial_free: ClassVar[bool] = True
    commit: str
    tagname: str

    @property
    def object_format(self) -> str:
        return object_format_of(self.commit)

    def journal_fields(self) -> dict[str, Any]:
        return {"commit": self.commit, "tagname": self.tagname}

    def digest_buckets(self) -> None:
        return None

    def job(self, ctx: StampContext) -> TagJob:
        return TagJob(self.commit, self.tagname, ctx.time, _message(self.commit, ctx.url, ctx.time),
                      ctx.uid, self.object_format)

    def outcome(self, ctx: StampContext, job: TagJob, signed: str) -> Outcome[str]:
        """The signed tag; its object id is journalled."""
        return Outcome(signed, object_id=job.object_id(signed.encode("ascii")))


@dataclass(frozen=True)
class BranchRequest:
    """Zeitgitter ``stamp-branch-v1``: a signed merge of ``parent`` (if any) and ``commit``
    with the tree of ``commit``. Its ids are all 40 hex digits (a SHA-1 repository) or all 64
    (a SHA-256 one)."""

    kind: ClassVar[str] = "branch"
    noun: ClassVar[str] = "commit"
    serial_free: ClassVar[bool] = True
    commit: str
    tree: str
    parent: str | None = None

    @property
    def object_format(self) -> str:
        return object_format_of(self.commit)

    def journal_fields(self) -> dict[str, Any]:
        return {"commit": self.commit, "tree": self.tree, "parent": self.parent}

    def digest_buckets(self) -> None:
        return None

    def job(self, ctx: StampContext) -> CommitJob:
        parents = (self.parent, self.commit) if self.parent else (self.commit,)
        return CommitJob(self.tree, parents, ctx.time, _message(self.commit, ctx.url, ctx.time),
                         ctx.uid, self.object_format)

    def outcome(self, ctx: StampContext, job: CommitJob, signed: str) -> Outcome[str]:
        """The signed commit; its object id is journalled."""
        return Outcome(signed, object_id=job.object_id(signed.encode("ascii")))


@dataclass(frozen=True)
class DigestRequest:
    """``POST /v1/stamps``: a receipt for a sha256 or sha512 digest."""

    kind: ClassVar[str] = "digest"
    noun: ClassVar[str] = "receipt"
    serial_free: ClassVar[bool] = False  # (its statement names the serial)
    algorithm: str
    digest: str

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "digest": self.digest}

    def digest_buckets(self) -> None:
        return None

    def statement(self, ctx: StampContext) -> Statement:
        """What the receipt states (`formats.receipts`)."""
        return Statement(algorithm=self.algorithm, digest=self.digest, time=ctx.time,
                         server=ctx.url, serial=ctx.serial, key=ctx.key.fingerprint)

    def job(self, ctx: StampContext) -> ReceiptJob:
        return ReceiptJob(self.statement(ctx).text(), ctx.time)

    def outcome(self, ctx: StampContext, job: ReceiptJob, signed: str
                ) -> Outcome[tuple[Statement, str]]:
        """The statement and the signed receipt, which is stored."""
        return Outcome((self.statement(ctx), signed), stored=signed)


@dataclass(frozen=True)
class ManifestRequest:
    """``POST /v1/manifests``: checksum lines of one algorithm, signed once. Its journal row
    is one stamp; its digests go, in buckets, into ``manifest_digests`` in the same
    transaction (built here, before the journal's thread sees them). The buckets hold the
    digests from then on: the manifest it keeps has none of its own (``digests`` empty), so
    that a request in flight holds its digests once."""

    kind: ClassVar[str] = "manifest"
    noun: ClassVar[str] = "manifest"
    serial_free: ClassVar[bool] = False  # (its statement names the serial)
    manifest: Manifest
    # The index rows when they were built elsewhere (`workers.manifest_check`); else built
    # here from the manifest's digests.
    rows: InitVar[Buckets | None] = None
    _buckets: Buckets = field(init=False, repr=False, compare=False)

    @property
    def algorithm(self) -> str:
        return self.manifest.algorithm

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.manifest.algorithm}

    def digest_buckets(self) -> Buckets:
        return self._buckets

    def __post_init__(self, rows: Buckets | None) -> None:
        m = self.manifest
        object.__setattr__(self, "_buckets", buckets(m.digests, m.width) if rows is None
                           else rows)
        object.__setattr__(self, "manifest", replace(m, digests=b""))

    def job(self, ctx: StampContext) -> ManifestJob:
        return ManifestJob(self.manifest.algorithm, ctx.time, ctx.url, ctx.serial,
                           ctx.key.fingerprint, self.manifest.text, self.manifest.lines)

    def outcome(self, ctx: StampContext, job: ManifestJob, signed: str
                ) -> Outcome[tuple[Text, ...]]:
        """The signed manifest (the header lines, the lines as sent, one signature), which is
        stored: in the parts whose concatenation it is (the lines are not copied)."""
        try:
            parts = job.signed(signed)
        except ValueError as e:
            raise MalformedAnswer(str(e)) from e
        return Outcome(parts, stored=parts)


GitRequest = TagRequest | BranchRequest


def choose_key(keys: Sequence[ServedKey], fmt: str | None, fingerprint: str | None) -> ServedKey:
    """The key a request asked for (``format=openpgp|ssh``, ``key=<fingerprint>``); the
    primary key when it asked for none. Only keys that sign stamps are chosen: the TSA key
    signs RFC 3161 tokens only and the log key checkpoint notes only, so naming either is
    refused like naming a key the server lacks, and ``format=`` never picks them."""
    from formats.keys import MAIL, TLOG, WITNESS

    if fmt is not None and fmt not in ("openpgp", "ssh"):
        raise BadRequest("field 'format' must be 'openpgp' or 'ssh'")
    if fingerprint is not None:
        want = fingerprint if fingerprint.startswith("SHA256:") else fingerprint.upper()
        for key in keys:
            if key.fingerprint == want:
                if key.purpose == TLOG:
                    raise BadRequest(f"key {fingerprint} is the server's transparency log key: "
                                     "it signs log checkpoints only, not stamps")
                if key.purpose == WITNESS:
                    raise BadRequest(f"key {fingerprint} is the server's witness key: it "
                                     "cosigns other logs' checkpoints only, not stamps")
                if key.purpose == MAIL:
                    raise BadRequest(f"key {fingerprint} is the server's mail key: it signs "
                                     "the receipts of mail stamped only")
                if key.purpose != STAMPS:
                    raise BadRequest(f"key {fingerprint} is the server's RFC 3161 key: it signs "
                                     "RFC 3161 time-stamp tokens only, not stamps")
                if fmt is not None and key.format != fmt:
                    raise BadRequest(f"key {fingerprint} is not an {fmt} key")
                return key
        raise BadRequest(f"this server has no key {fingerprint}")
    if fmt is not None:
        for key in keys:
            if key.format == fmt and key.purpose == STAMPS:
                return key
        raise BadRequest(f"this server has no {fmt} key")
    return keys[0]


def key_fields(fields: Mapping[str, Sequence[str]]) -> tuple[str | None, str | None]:
    """The optional ``format`` and ``key`` fields."""
    out = []
    for name in ("format", "key"):
        values = fields.get(name)
        if values and len(values) > 1:
            raise BadRequest(f"field '{name}' given more than once")
        out.append(values[0] if values else None)
    return out[0], out[1]
