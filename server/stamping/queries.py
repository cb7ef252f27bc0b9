"""What the ``/v1`` API reads back from the journal: signed stamps, by serial or by digest.

Each function answers one question, blocking: the routes run them in a thread (a digest
stamped thousands of times must not hold up the event loop). They only read, through
`server.db.reading` (on SQLite a reader must not take the journal's write lock).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from formats.manifests import lookup_prefixes, packed_contains
from server.db import reading
from server.models import ManifestDigests, Stamp, StampState

MANIFEST_CHUNK = 1 << 20  # bytes (SQLite) or characters (PostgreSQL) read at a time


def manifest_size(engine: Engine, serial: int) -> int | None:
    """Whether there is a signed manifest of serial ``serial`` (None: not), and its length in
    bytes where it costs nothing to know (SQLite; -1 on PostgreSQL), without reading it."""
    with reading(engine).connect() as conn:
        found = conn.execute(select(Stamp.id).where(
            Stamp.id == serial, Stamp.kind == "manifest", Stamp.state == StampState.SIGNED,
            Stamp.receipt.is_not(None))).scalar_one_or_none()
        if found is None:
            return None
        if conn.dialect.name != "sqlite":
            return -1
        raw = conn.connection.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        with raw.blobopen("stamps", "receipt", serial, readonly=True) as blob:
            return len(blob)


def manifest_chunk(engine: Engine, serial: int, offset: int) -> bytes:
    """A piece of the signed manifest of serial ``serial`` (whose `manifest_size` was
    found), from ``offset`` on: on SQLite `MANIFEST_CHUNK` bytes from byte ``offset``, read
    through incremental blob I/O (SQLite reads only those pages); on PostgreSQL
    `MANIFEST_CHUNK` characters from character ``offset``, UTF-8 encoded (the receipt is
    stored uncompressed: PostgreSQL reads the value up to the piece's end, in the server).
    An empty piece: the end."""
    with reading(engine).connect() as conn:
        if conn.dialect.name == "sqlite":
            raw = conn.connection.driver_connection
            assert isinstance(raw, sqlite3.Connection)
            with raw.blobopen("stamps", "receipt", serial, readonly=True) as blob:
                blob.seek(offset)
                return blob.read(MANIFEST_CHUNK)
        text = conn.execute(select(func.substr(Stamp.receipt, offset + 1, MANIFEST_CHUNK))
                            .where(Stamp.id == serial)).scalar_one_or_none()
        return (text or "").encode("utf-8")


@dataclass(frozen=True)
class CoveringManifest:
    """A signed manifest that lists a digest."""

    serial: int
    time: int
    key_id: str | None  # None: the primary key


@dataclass(frozen=True)
class DigestPage:
    """One page of what was signed for a digest, in serial order: its receipts, and the
    manifests that list it. ``serials`` holds up to one more serial than the page shows: while
    there is one more, there is a next page."""

    serials: list[int]
    receipts: list[str]  # of the serials shown
    manifests: list[CoveringManifest]  # of the serials shown


def digest_page(engine: Engine, algorithm: str, digest: str, after: int,
                limit: int) -> DigestPage:
    """The receipts of ``digest`` and the manifests that list it, with a serial after
    ``after``: the first ``limit`` of them (and whether there are more)."""
    with reading(engine).connect() as conn:
        rows = conn.execute(
            select(Stamp.id, Stamp.receipt).where(
                Stamp.algorithm == algorithm, Stamp.digest == digest,
                Stamp.state == StampState.SIGNED, Stamp.receipt.is_not(None),
                Stamp.id > after,
            ).order_by(Stamp.id).limit(limit + 1)
        ).all()
        # Manifests that list the digest: the rows of its prefixes (each manifest has at most
        # one, of at most BUCKET_DIGESTS digests), searched.
        covering = [
            CoveringManifest(sid, t, key_id) for sid, t, key_id, packed in conn.execute(
                select(Stamp.id, Stamp.stamped_at, Stamp.key_id, ManifestDigests.digests)
                .join(ManifestDigests, ManifestDigests.stamp_id == Stamp.id)
                .where(ManifestDigests.algorithm == algorithm,
                       ManifestDigests.prefix.in_(lookup_prefixes(digest)),
                       Stamp.state == StampState.SIGNED, Stamp.id > after)
                .order_by(Stamp.id))
            if packed_contains(packed, digest)][:limit + 1]
    # One page holds receipts and manifests in serial order.
    serials = sorted([r[0] for r in rows] + [m.serial for m in covering])[:limit + 1]
    shown = set(serials[:limit])
    return DigestPage(serials=serials,
                      receipts=[r[1] for r in rows if r[0] in shown and r[1] is not None],
                      manifests=[m for m in covering if m.serial in shown])
