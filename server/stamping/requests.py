"""The requests the service accepts, validated: each knows its kind, its journal row and the
job that signs it, so that nothing else branches on what kind of request it is."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from formats.gitobjects import object_format_of
from formats.jobs import CommitJob, ManifestJob, ReceiptJob, TagJob, TimestampJob
from formats.manifests import Manifest, buckets
from server.errors import BadRequest
from workers.keys.keyset import ServedKey


def _message(commit: str, url: str, t: int) -> str:
    """The message of a tag or branch stamp (the same text for both)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))
    return f"Timestamp of commit {commit}\nby {url} at {when}\n"


@dataclass(frozen=True)
class TagRequest:
    """Zeitgitter ``stamp-tag-v1``: a signed tag of ``commit`` (40 hex digits: a SHA-1
    repository; 64: a SHA-256 one)."""

    kind: ClassVar[str] = "tag"
    commit: str
    tagname: str

    @property
    def object_format(self) -> str:
        return object_format_of(self.commit)

    def journal_fields(self) -> dict[str, Any]:
        return {"commit": self.commit, "tagname": self.tagname}

    def digest_buckets(self) -> None:
        return None

    def job(self, t: int, url: str, uid: str | None) -> TagJob:
        return TagJob(self.commit, self.tagname, t, _message(self.commit, url, t), uid,
                      self.object_format)


@dataclass(frozen=True)
class BranchRequest:
    """Zeitgitter ``stamp-branch-v1``: a signed merge of ``parent`` (if any) and ``commit``
    with the tree of ``commit``. Its ids are all 40 hex digits (a SHA-1 repository) or all 64
    (a SHA-256 one)."""

    kind: ClassVar[str] = "branch"
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

    def job(self, t: int, url: str, uid: str | None) -> CommitJob:
        parents = (self.parent, self.commit) if self.parent else (self.commit,)
        return CommitJob(self.tree, parents, t, _message(self.commit, url, t), uid,
                         self.object_format)


@dataclass(frozen=True)
class DigestRequest:
    """``POST /v1/stamps``: a receipt for a sha256 or sha512 digest."""

    kind: ClassVar[str] = "digest"
    algorithm: str
    digest: str

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "digest": self.digest}

    def digest_buckets(self) -> None:
        return None

    def job(self, t: int, statement: str) -> ReceiptJob:
        return ReceiptJob(statement, t)


@dataclass(frozen=True)
class TimestampRequest:
    """An RFC 3161 ``TimeStampReq``, checked (`formats.tsp.parse_request`): a token for
    a message imprint. Its imprint is journalled and logged like a digest stamp's."""

    kind: ClassVar[str] = "tsa"
    algorithm: str
    digest: str  # lowercase hex
    nonce: int | None
    cert_req: bool

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.algorithm, "digest": self.digest}

    def digest_buckets(self) -> None:
        return None

    def job(self, t: int, serial: int, policy: str, accuracy: int | None) -> TimestampJob:
        return TimestampJob(hash_algorithm=self.algorithm, digest=self.digest, serial=serial,
                            time=t, policy=policy, accuracy=accuracy,
                            nonce=None if self.nonce is None else str(self.nonce),
                            cert_req=self.cert_req)


@dataclass(frozen=True)
class ManifestRequest:
    """``POST /v1/manifests``: checksum lines of one algorithm, signed once. Its journal row
    is one stamp; its digests go, in buckets, into ``manifest_digests`` in the same
    transaction (built here, before the journal's thread sees them)."""

    kind: ClassVar[str] = "manifest"
    manifest: Manifest
    _buckets: list[tuple[int, bytes]] = field(init=False, repr=False, compare=False)

    @property
    def algorithm(self) -> str:
        return self.manifest.algorithm

    def journal_fields(self) -> dict[str, Any]:
        return {"algorithm": self.manifest.algorithm}

    def digest_buckets(self) -> list[tuple[int, bytes]]:
        return self._buckets

    def __post_init__(self) -> None:
        object.__setattr__(self, "_buckets", buckets(self.manifest.digests))

    def job(self, t: int, url: str, serial: int, key: str) -> ManifestJob:
        return ManifestJob(self.manifest.algorithm, t, url, serial, key, self.manifest.text)


GitRequest = TagRequest | BranchRequest
Request = TagRequest | BranchRequest | DigestRequest | TimestampRequest | ManifestRequest


def choose_key(keys: Sequence[ServedKey], fmt: str | None, fingerprint: str | None) -> ServedKey:
    """The key a request asked for (``format=openpgp|ssh``, ``key=<fingerprint>``); the
    primary key when it asked for none."""
    if fmt is not None and fmt not in ("openpgp", "ssh"):
        raise BadRequest("field 'format' must be 'openpgp' or 'ssh'")
    if fingerprint is not None:
        want = fingerprint if fingerprint.startswith("SHA256:") else fingerprint.upper()
        for key in keys:
            if key.fingerprint == want:
                if fmt is not None and key.format != fmt:
                    raise BadRequest(f"key {fingerprint} is not an {fmt} key")
                return key
        raise BadRequest(f"this server has no key {fingerprint}")
    if fmt is not None:
        for key in keys:
            if key.format == fmt:
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
