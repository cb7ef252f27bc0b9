"""The job contract between the service and its signing workers.

A job is one object for a worker to build and sign: a git tag (`TagJob`), a git commit
(`CommitJob`: branch stamps and log commits), a digest receipt (`ReceiptJob`), a manifest
(`ManifestJob`), an RFC 3161 time-stamp token (`TimestampJob`) or the signature of a
transparency log's checkpoint note (`NoteJob`, the log key's only kind) or a witness's
cosignature of another log's checkpoint (`CosignJob`, the witness key's only kind). The service
builds jobs; a worker decodes them, builds the object, has its agent sign it and answers with a
`Result`. A worker first introduces itself with a `Hello`. Each job class names its
``op`` (its type on the wire) and its ``kind``: what a worker builds of it, tag and commit jobs
both git objects (a worker looks up what builds each kind, and signs the jobs of one kind
together where its agent can). Every message is a JSON object, and a msgspec struct here
(a tagged union of the jobs, tagged by ``op``): msgspec encodes it and, as it decodes it,
refuses a missing or mistyped field by its path (``$.time``), where 11 hand-written
``to_dict``/``from_dict`` pairs did before at half to a fifth of the speed
(``python -m bench.jobcodec``); each type's own rules (ids, digests, newlines) are its
``__post_init__``, run when a job is built as when it is decoded. Each message is encoded and
decoded here and nowhere else.

Over the dispatcher's Unix socket (one host) a message travels as a frame: a 4-byte big-endian
length, then that many bytes of UTF-8 JSON. A manifest job's lines are not in its JSON: they
follow its frame as raw UTF-8, as many bytes as its ``lines_bytes`` says (`job_frame`; the
frames and what reads them back, `formats.frames`), so that neither side escapes, copies or
parses them as JSON. Through
PostgreSQL (several hosts) a job's JSON (a manifest's lines in it) is the ``jobs.payload``
column and its result the ``result``/``error`` columns. docs/jobs.md shows every message.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import msgspec

from formats import gitobjects, manifests
from formats.frames import HEADER, MANIFEST_OP, MalformedMessage, frame, int_field


class JobState(enum.StrEnum):
    """A job's state in the ``jobs`` table (several hosts: the service queues a job there, a
    worker of any host claims it and writes its result; `workers.jobtable` holds every
    statement on it, `server.models` the table)."""

    QUEUED = "queued"  # waiting for a worker holding its key
    CLAIMED = "claimed"  # a worker is signing it (``worker``, ``claimed_at``)
    DONE = "done"  # ``result`` holds the signed object
    FAILED = "failed"  # ``error`` says why; never retried


class _Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """A message as msgspec encodes and checks it: its fields in order, those at their
    default (an absent ``uid``, SHA-1) left out, so that a job of a 40-hex request has the
    JSON it always had (non-ASCII characters are UTF-8, which the stdlib encoder escaped:
    the same JSON text to any decoder); decoding refuses a missing or mistyped field (a bool
    is not an int, nor 1.0)."""


def _op(name: str) -> str:
    return name.removesuffix("Job").lower()


class _Job(_Message, frozen=True, tag_field="op", tag=_op):
    """A job: ``op`` (its class's name without ``Job``, ``tag`` for `TagJob`) is its type on
    the wire, the tag that picks its class when it is decoded."""

    kind: ClassVar[str]

    @property
    def op(self) -> str:
        return str(self.__struct_config__.tag)

    def to_dict(self) -> dict[str, Any]:
        """The job's JSON object, ``op`` and all."""
        d: dict[str, Any] = msgspec.to_builtins(self)
        return d


_HEX = re.compile(r"[0-9a-f]+")


def _check_ids(object_format: str, *ids: str) -> None:
    """The ids of a git job have the length of its object format."""
    if object_format not in gitobjects.OBJECT_FORMATS:
        raise MalformedMessage(f"unknown object format {object_format!r}")
    digits = gitobjects.OBJECT_FORMATS[object_format][0]
    for oid in ids:
        if len(oid) != digits or not _HEX.fullmatch(oid):
            raise MalformedMessage(f"a {object_format} object id is {digits} lowercase hex "
                                   f"digits, not {oid[:80]!r}")


class TagJob(_Job, frozen=True):
    """A signed tag of ``commit`` named ``tagname``, in a repository of ``object_format``
    (``sha1`` or ``sha256``: the length of ``commit``; absent on the wire for SHA-1, so the
    jobs of 40-hex requests are unchanged)."""

    kind: ClassVar[str] = "git"  # what a worker builds: a git object (as for a CommitJob)
    object_type: ClassVar[str] = "tag"  # the git object it builds
    commit: str
    tagname: str
    time: int
    message: str
    uid: str | None = None  # tagger user id, for keys that have none of their own (SSH)
    object_format: str = gitobjects.SHA1

    def __post_init__(self) -> None:
        _check_ids(self.object_format, self.commit)

    def payload(self, uid: str) -> bytes:
        """The tag without its signature (what is signed)."""
        return gitobjects.tag_payload(self.commit, self.tagname, uid, self.time, self.message)

    def embed(self, payload: bytes, signature: str) -> bytes:
        """A tag's signature follows its message in both object formats."""
        return gitobjects.embed_tag_signature(payload, signature)

    def object_id(self, signed: bytes) -> str:
        """The id of the signed tag ``signed`` in its repository."""
        return gitobjects.git_object_id(self.object_type, signed, self.object_format)


class CommitJob(_Job, frozen=True):
    """A signed commit of ``tree`` with ``parents`` (a branch stamp, or a log commit), in a
    repository of ``object_format`` (``sha1`` or ``sha256``: the length of every id)."""

    kind: ClassVar[str] = "git"  # what a worker builds: a git object (as for a TagJob)
    object_type: ClassVar[str] = "commit"  # the git object it builds
    tree: str
    parents: tuple[str, ...]
    time: int
    message: str
    uid: str | None = None  # author/committer user id, for keys without one (SSH)
    object_format: str = gitobjects.SHA1

    def __post_init__(self) -> None:
        _check_ids(self.object_format, self.tree, *self.parents)

    def payload(self, uid: str) -> bytes:
        """The commit without its signature (what is signed)."""
        return gitobjects.commit_payload(self.tree, self.parents, uid, self.time, self.message)

    def embed(self, payload: bytes, signature: str) -> bytes:
        """The signature in ``gpgsig`` (SHA-1) or ``gpgsig-sha256`` (SHA-256), as git writes
        it in a repository of that format."""
        return gitobjects.embed_commit_signature(
            payload, signature, gitobjects.signature_header(self.object_format))

    def object_id(self, signed: bytes) -> str:
        """The id of the signed commit ``signed`` in its repository."""
        return gitobjects.git_object_id(self.object_type, signed, self.object_format)


class ReceiptJob(_Job, frozen=True):
    """A signed receipt of the statement ``text`` (see `formats.receipts`)."""

    kind: ClassVar[str] = "receipt"  # what a worker builds
    text: str
    time: int


class _ManifestFields(_Job, frozen=True):
    algorithm: str
    time: int
    server: str
    serial: int
    key: str


class _ManifestHead(_ManifestFields, frozen=True, tag="manifest"):
    """A manifest job's frame on the socket: its lines follow it, ``lines_bytes`` of them."""

    lines_bytes: int


class _ManifestText(_ManifestFields, frozen=True, tag="manifest"):
    """A manifest job as JSON, lines and all (``jobs.payload``, and a socket frame once
    `FrameBuffer` has put its lines in)."""

    lines: str

    def job(self) -> ManifestJob:
        return ManifestJob(self.algorithm, self.time, self.server, self.serial, self.key,
                           self.lines)


@dataclass(frozen=True)
class ManifestJob:
    """A signed manifest (see `formats.manifests`): the header built from these fields,
    then ``lines``, the checksum lines as the client sent them. The worker checks the lines
    again and that ``key`` is its own key's fingerprint, and signs header and lines with one
    signature (OpenPGP: cleartext-signed; SSH: the text, then its SSH signature, namespace
    ``stampd``). Its result leaves the lines out (`manifests.signed_parts` puts them back): the
    result stays small. ``count``: how many lines there are, where the builder knows it
    (not sent: the worker counts them as it checks them); else they are counted when the
    header is made (a whole pass over them).

    Not a msgspec struct as the other jobs: the service holds the lines as the bytes it
    received (256 MiB at most, not copied into a str), which no struct field can type; it is
    encoded as `_ManifestHead` (socket) or `_ManifestText` (``jobs.payload``), and decoded
    from the latter."""

    op: ClassVar[str] = MANIFEST_OP
    kind: ClassVar[str] = "manifest"  # what a worker builds
    algorithm: str
    time: int
    server: str
    serial: int
    key: str
    lines: manifests.Text  # str as a worker reads it; the service may hold the bytes received
    count: int | None = field(default=None, compare=False)

    def header(self, count: int | None = None) -> manifests.Header:
        """The header of ``count`` lines (default `count`, else the lines counted)."""
        count = count if count is not None else self.count
        return manifests.Header(self.algorithm, self.time, self.server, self.serial, self.key,
                                manifests.count_lines(self.lines) if count is None
                                else count)

    def signed(self, answer: str) -> tuple[str, manifests.Text, str]:
        """The signed manifest from a worker's ``answer`` to this job, in the three parts
        whose concatenation it is (`manifests.signed_parts`: the lines are not copied)."""
        return manifests.signed_parts(answer, self.header().text(), self.lines)

    def to_dict(self) -> dict[str, Any]:
        return self._text().to_dict()

    def _text(self) -> _ManifestText:
        return _ManifestText(self.algorithm, self.time, self.server, self.serial, self.key,
                             manifests.as_str(self.lines))

    def _head(self) -> _ManifestHead:
        return _ManifestHead(self.algorithm, self.time, self.server, self.serial, self.key,
                             self.lines_size())

    def lines_size(self) -> int:
        """Bytes of the lines in UTF-8 (an ASCII text's length; else counted a piece at a
        time, not encoded whole)."""
        return manifests.utf8_size(self.lines)

    def pieces(self) -> Iterator[bytes]:
        """The lines in UTF-8, a piece at a time (no copy of them all)."""
        return manifests.utf8_pieces(self.lines)


_OID = re.compile(r"[0-2](\.(0|[1-9][0-9]*))+")
_DECIMAL = re.compile(r"0|[1-9][0-9]*")


class TimestampJob(_Job, frozen=True):
    """An RFC 3161 time-stamp token (see `workers.tsa`) over the client's ``digest``.

    ``time`` is the token's genTime (Unix seconds); ``accuracy`` in seconds; ``nonce`` the
    client's nonce as a decimal string (it may exceed what a JSON number holds exactly);
    ``cert_req``: embed the TSA's certificates (always on the wire, so not defaulted). The
    worker answers with the token (a DER CMS ``ContentInfo``) in base64. A job that breaks
    these rules is `MalformedMessage`.
    """

    kind: ClassVar[str] = "timestamp"  # what a worker builds
    hash_algorithm: str
    digest: str  # lowercase hex
    serial: int
    time: int
    policy: str  # dotted OID
    cert_req: bool
    accuracy: int | None = None
    nonce: str | None = None  # decimal

    def __post_init__(self) -> None:
        # (imported here: only the TSA key's worker and the HTTP processes need asn1crypto)
        from formats.tsp.algorithms import HASH_ALGORITHMS, MAX_NONCE_BITS

        size = HASH_ALGORITHMS.get(self.hash_algorithm, (None, None))[1]
        if size is None:
            raise MalformedMessage(f"unknown hash algorithm {self.hash_algorithm!r}")
        if not _HEX.fullmatch(self.digest) or len(self.digest) != 2 * size:
            raise MalformedMessage(f"a {self.hash_algorithm} digest is {2 * size} lowercase "
                                   "hex digits")
        if not 0 <= self.serial < 1 << MAX_NONCE_BITS:
            raise MalformedMessage("the serial must be non-negative and at most 160 bits")
        if not _OID.fullmatch(self.policy):
            raise MalformedMessage("the policy must be a dotted object identifier")
        if self.accuracy is not None and self.accuracy < 0:
            raise MalformedMessage("the accuracy must not be negative")
        if self.nonce is not None and (not _DECIMAL.fullmatch(self.nonce)
                                       or int(self.nonce) >= 1 << MAX_NONCE_BITS):
            raise MalformedMessage("the nonce must be a decimal number of at most 160 bits")

    @property
    def nonce_value(self) -> int | None:
        return None if self.nonce is None else int(self.nonce)


class NoteJob(_Job, frozen=True):
    """The Ed25519 signature of a signed note's ``text`` (C2SP signed-note, `formats.note`: a
    transparency log's checkpoint), made with the log key only. The worker signs the UTF-8
    bytes of ``text`` as they are (plain Ed25519, no SSHSIG around them) and answers with the
    64-byte signature in base64; the caller makes the note's signature line of it
    (`formats.note`). A text that is empty or does not end in a newline is `MalformedMessage`."""

    kind: ClassVar[str] = "note"  # what a worker builds: a note signature (the log key only)
    text: str

    def __post_init__(self) -> None:
        if not self.text.endswith("\n"):
            raise MalformedMessage("a note's text ends in a newline")


class CosignJob(_Job, frozen=True):
    """A witness's cosignature (c2sp.org/tlog-cosignature) of a checkpoint ``body`` (the note's
    text, verified and stored by the witness before) at ``timestamp`` (seconds since the epoch,
    above 0), made with the witness key only. The worker signs
    `formats.tlog.checkpoint.cosignature_message` of the two (plain Ed25519) and answers with
    the 64-byte signature in base64; the caller makes the signature line of it."""

    kind: ClassVar[str] = "cosign"  # what a worker builds: a cosignature (the witness key only)
    body: str
    timestamp: int

    def __post_init__(self) -> None:
        if not self.body.endswith("\n"):
            raise MalformedMessage("a checkpoint body ends in a newline")
        if not 0 < self.timestamp < 2**63:
            raise MalformedMessage(f"cosignature timestamp {self.timestamp} out of range")


GitJob = TagJob | CommitJob
Job = TagJob | CommitJob | ReceiptJob | TimestampJob | ManifestJob | NoteJob | CosignJob
# What a job's JSON decodes to: a manifest job as `_ManifestText` (then `ManifestJob`).
_Wire = TagJob | CommitJob | ReceiptJob | TimestampJob | _ManifestText | NoteJob | CosignJob
_WIRE_TYPES: dict[str, type[_Wire]] = {str(cls.__struct_config__.tag): cls for cls in (
    TagJob, CommitJob, ReceiptJob, TimestampJob, _ManifestText, NoteJob, CosignJob)}
# Each job's class by its ``op`` (what the workers' signers are checked against).
_JOB_TYPES: dict[str, type[_Wire] | type[ManifestJob]] = {**_WIRE_TYPES,
                                                          ManifestJob.op: ManifestJob}
_ENCODER = msgspec.json.Encoder()
_JOB_DECODER = msgspec.json.Decoder(_Wire)
_M = TypeVar("_M")


def _job(wire: _Wire) -> Job:
    return wire.job() if isinstance(wire, _ManifestText) else wire


def _convert(d: object, cls: type[_M]) -> _M:
    """``d`` (a frame's object) as a ``cls``; `MalformedMessage` saying what is wrong."""
    try:
        return msgspec.convert(d, cls)
    except msgspec.ValidationError as e:
        raise MalformedMessage(str(e)) from None


def job_from_dict(d: dict[str, Any]) -> Job:
    """The job of a frame's object. (msgspec converts to one struct type in well under a
    microsecond, to the union of them in over ten: the ``op`` picks the type here.)"""
    cls = _WIRE_TYPES.get(d.get("op"))  # type: ignore[arg-type]
    if cls is None:
        raise MalformedMessage(f"unknown job type {d.get('op')!r}")
    return _job(_convert(d, cls))


def encode_job(job: Job) -> str:
    """A job as the JSON text stored in ``jobs.payload``."""
    return _ENCODER.encode(job._text() if isinstance(job, ManifestJob) else job).decode()


def decode_job(text: str | bytes) -> Job:
    try:
        return _job(_JOB_DECODER.decode(text))
    except msgspec.ValidationError as e:
        raise MalformedMessage(str(e)) from None
    except msgspec.DecodeError as e:
        raise MalformedMessage(f"not JSON: {e}") from None


class Hello(_Message, frozen=True):
    """A worker's first message: who it is and which key it holds."""

    worker: str
    pid: int
    fingerprint: str
    key: str

    def frame(self) -> bytes:
        return frame({"hello": self})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hello:
        if not isinstance(d.get("hello"), dict):
            raise MalformedMessage("expected a hello")
        return _convert(d["hello"], cls)


class Result(_Message, frozen=True):
    """A worker's answer to job ``id``: the signed ``object``, or the ``error`` that made the
    worker refuse the job as malformed (a worker that cannot sign exits instead)."""

    id: int
    object: str | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if (self.object is None) == (self.error is None):
            raise MalformedMessage("a result has either an object or an error")

    def frame(self) -> bytes:
        return frame(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        return _convert(d, cls)


def job_frame_parts(job_id: int, job: Job | RelayedJob
                    ) -> tuple[bytes, Iterator[bytes | memoryview]]:
    """What hands ``job`` to a worker over the dispatcher socket: its frame, then the raw bytes
    that follow it, a piece at a time (a manifest's lines, announced as ``lines_bytes``;
    nothing for any other job)."""
    if isinstance(job, RelayedJob):
        body = b'{"id":%d,' % job_id + bytes(job.message[1:])
        return HEADER.pack(len(body)) + body, job.pieces()
    if isinstance(job, ManifestJob):
        return _job_frame(job_id, job._head()), job.pieces()
    return _job_frame(job_id, job), iter(())


class RelayedJob:
    """A job on its way through the host's coordinator (several HTTP processes): encoded once
    by the HTTP process that made it (`job_message`), its JSON (``message``, starting
    ``{"op":``) and a manifest's ``lines`` (UTF-8; none for another job) handed on to a worker
    as they came, neither decoded nor copied; the worker checks the job as it checks any
    other. ``is_manifest``: whether it is a manifest's job. None of it changes once made.

    (A plain class: the coordinator makes one for every stamp, and as a frozen dataclass with
    a cached ``is_manifest`` it took 4.4 us, 1.7 now.)"""

    __slots__ = ("is_manifest", "lines", "message")

    def __init__(self, message: bytes | memoryview, lines: bytes | memoryview = b"") -> None:
        head = bytes(message[:17])
        if head[:6] != b'{"op":':
            raise MalformedMessage("a relayed job's message is not a job")
        self.message, self.lines = message, lines
        self.is_manifest = head == b'{"op":"manifest",'
        if self.is_manifest != bool(len(lines)):
            raise MalformedMessage("a manifest job, and only one, has lines")

    def __repr__(self) -> str:
        return f"RelayedJob({bytes(self.message[:60])!r}..., {len(self.lines)} bytes of lines)"

    def lines_size(self) -> int:
        return len(self.lines)

    def pieces(self) -> Iterator[bytes | memoryview]:
        view = memoryview(self.lines)
        for at in range(0, len(view), manifests.PIECE):
            yield view[at:at + manifests.PIECE]


def job_message(job: Job) -> bytes:
    """``job``'s JSON as a worker gets it, without its id (a manifest's without its lines,
    which follow it: `RelayedJob`)."""
    return _ENCODER.encode(job._head() if isinstance(job, ManifestJob) else job)


def is_manifest(job: Job | RelayedJob) -> bool:
    """Whether ``job`` is a manifest's (it keeps its worker busy for seconds)."""
    return job.is_manifest if isinstance(job, RelayedJob) else isinstance(job, ManifestJob)


def _job_frame(job_id: int, message: _Job) -> bytes:
    """The frame ``{"id": N, ...}`` of a job: its id spliced before the job's own JSON (which
    starts ``{"op":``), so that the job is encoded once and no dict is built for it."""
    body = b'{"id":%d,' % job_id + _ENCODER.encode(message)[1:]
    return HEADER.pack(len(body)) + body


def job_frame(job_id: int, job: Job) -> bytes:
    """`job_frame_parts` in one piece (what a worker's `FrameBuffer` reads back)."""
    head, pieces = job_frame_parts(job_id, job)
    return head + b"".join(pieces)


def decode_job_frame(d: dict[str, Any]) -> tuple[int, Job]:
    """(id, job) of a job frame's object; `MalformedMessage` if the job is malformed (its id
    is then `d.get("id")`, so the refusal can still be addressed)."""
    return int_field(d, "id"), job_from_dict(d)
