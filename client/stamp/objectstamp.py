"""``stampd stamp --object REV``: a digest receipt of a git object's own bytes, kept as a note.

A branch or tag stamp is of a commit, and with it of the commit's history; a **signed tag** is
covered by none of them (no commit holds it). So its signature is stamped as a digest: the
SHA-256 of the object as git hashes it, ``<type> <size>\\0<body>`` (in a SHA-256 repository
that is the tag's id), sent to ``POST /v1/stamps``. The receipt is checked (one signature by the
trusted key over the statement, the digest asked for, a time within 30 s of this computer's
clock) and only then appended to the object's note under ``refs/notes/stampd-receipts``, where
``stampd verify TAG --signers FILE`` finds it (or, with ``--fetch-proof``, asks the server for
the receipts of that digest). Any object can be stamped so; commits are stamped by the hook.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from client.fetch import FetchError, http_request
from client.stamp.errors import AnswerRefused, StampFailed, UsageError
from client.stamp.git import git
from client.stamp.remote import HTTP_TIMEOUT, server_url
from client.verify.errors import VerifyError
from client.verify.receipt import MAX_RECEIPT, receipt_text, verify_receipt
from client.verify.signed import RECEIPTS_REF
from client.verify.signed import object_digest as digest_of

CLOCK_SKEW = 30  # seconds


@dataclass(frozen=True)
class ObjectStamped:
    kind: str
    oid: str
    name: str
    digest: str
    time: int
    serial: int
    server: str
    signer: str
    origin: str


def object_digest(repo: Path, rev: str) -> tuple[str, str, str]:
    """(object id, type, SHA-256 of ``<type> <size>\\0<body>``) of ``rev``: a tag or commit."""
    try:
        oid = git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{object}}")
        kind = git(repo, "cat-file", "-t", oid)
    except StampFailed:
        raise UsageError(f"{rev!r} is not an object in {repo}") from None
    if kind not in ("tag", "commit"):
        raise UsageError(f"{rev!r} is a {kind}; --object stamps a tag or commit")
    return oid, kind, digest_of(kind, _raw(repo, kind, oid))


def _raw(repo: Path, kind: str, oid: str) -> bytes:
    r = subprocess.run(["git", "-C", str(repo), "cat-file", kind, oid], capture_output=True,
                       timeout=60, check=False)
    if r.returncode != 0:
        raise StampFailed(f"git cat-file {kind} {oid}: {r.stderr.decode().strip()}")
    return r.stdout


def stamp_object(repo: Path, rev: str, *, server: str | None, key: Path | None,
                 clock: Callable[[], float] = time.time) -> ObjectStamped:
    """Obtain, check and keep a receipt of ``rev``'s bytes (see the module docstring)."""
    oid, kind, digest = object_digest(repo, rev)
    url = server_url(repo, server)
    endpoint = url.rstrip("/") + "/v1/stamps"
    try:
        answer = http_request(endpoint, form={"sha256": digest}, timeout=HTTP_TIMEOUT,
                              limit=MAX_RECEIPT)
    except FetchError as e:
        if e.status is not None:
            raise StampFailed(f"{endpoint} answered HTTP {e.status}: {e.reason}") from None
        raise StampFailed(f"cannot reach {url}: {e.reason}") from None
    try:
        res = verify_receipt(receipt_text(answer), key_file=key, digest=digest, repo=repo)
    except VerifyError as e:
        raise AnswerRefused(f"the receipt of {digest}: {e}") from None
    now = int(clock())
    if abs(res.statement.time - now) >= CLOCK_SKEW:
        raise AnswerRefused(f"the receipt's time is {res.statement.time - now} s off this "
                            "computer's clock")
    with tempfile.TemporaryDirectory(prefix="stampd-note") as tmp:
        note = Path(tmp) / "receipt"
        note.write_bytes(answer)
        git(repo, "notes", f"--ref={RECEIPTS_REF}", "append", "-F", str(note), oid)
    st = res.statement
    return ObjectStamped(kind, oid, rev, digest, st.time, st.serial, st.server,
                         res.signature.primary, res.key_origin)


def report_object(res: ObjectStamped) -> list[str]:
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(res.time))
    return [f"receipt:       sha256 {res.digest} of {res.kind} {res.name} ({res.oid})",
            f"time:          {when} ({res.time})",
            f"key:           {res.signer} ({res.origin})",
            f"server:        {res.server} (serial {res.serial})",
            f"kept:          as a note on {res.oid[:12]} in {RECEIPTS_REF} (publish it: git "
            f"push origin {RECEIPTS_REF})"]
