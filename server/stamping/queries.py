"""What the ``/v1`` API reads back from the journal: signed stamps, by serial or by digest.

Each function answers one question, blocking: the routes run them in a thread (a digest
stamped thousands of times must not hold up the event loop). They only read, through
`server.db.reading` (on SQLite a reader must not take the journal's write lock).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from formats.manifests import lookup_prefixes, packed_contains
from server.db import reading
from server.models import ManifestText, Stamp, StampState


def manifest_size(engine: Engine, serial: int) -> int | None:
    """Whether there is a signed manifest of serial ``serial`` (None: not), and its length in
    bytes, without reading it (the lengths of its pieces)."""
    with reading(engine).connect() as conn:
        found = conn.execute(select(Stamp.id).where(
            Stamp.id == serial, Stamp.kind == "manifest", Stamp.state == StampState.SIGNED)
        ).scalar_one_or_none()
        if found is None:
            return None
        size = conn.execute(select(func.sum(func.length(ManifestText.piece)))
                            .where(ManifestText.stamp_id == serial)).scalar_one()
        return None if size is None else int(size)


def manifest_piece(engine: Engine, serial: int, seq: int) -> bytes:
    """Piece ``seq`` of the signed manifest of serial ``serial`` (whose `manifest_size` was
    found), as stored (`server.models.ManifestText`); empty after the last."""
    with reading(engine).connect() as conn:
        return ManifestText.read(conn, serial, seq) or b""


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
    prefixes = lookup_prefixes(digest)
    # (SQL written out, run by the driver: SQLAlchemy built and looked up the two statements
    # at each call, three quarters of a page's time; the bench.poison clients queue on it)
    with reading(engine).connect() as conn:
        p = "?" if conn.dialect.paramstyle == "qmark" else "%s"
        rows = conn.exec_driver_sql(
            f"SELECT id, receipt FROM stamps WHERE algorithm = {p} AND digest = {p} "
            f"AND state = '{StampState.SIGNED}' AND receipt IS NOT NULL AND id > {p} "
            f"ORDER BY id LIMIT {p}", (algorithm, digest, after, limit + 1)).fetchall()
        # Manifests that list the digest: the rows of its prefixes (each manifest has at most
        # one, of at most BUCKET_DIGESTS digests), searched.
        covering = [
            CoveringManifest(sid, t, key_id) for sid, t, key_id, packed in conn.exec_driver_sql(
                "SELECT s.id, s.stamped_at, s.key_id, m.digests FROM manifest_digests m "
                f"JOIN stamps s ON s.id = m.stamp_id WHERE m.algorithm = {p} "
                f"AND m.prefix IN ({', '.join([p] * len(prefixes))}) "
                f"AND s.state = '{StampState.SIGNED}' AND s.id > {p} ORDER BY s.id",
                (algorithm, *prefixes, after))
            if packed_contains(bytes(packed), digest)][:limit + 1]
    # One page holds receipts and manifests in serial order.
    serials = sorted([r[0] for r in rows] + [m.serial for m in covering])[:limit + 1]
    shown = set(serials[:limit])
    return DigestPage(serials=serials,
                      receipts=[r[1] for r in rows if r[0] in shown and r[1] is not None],
                      manifests=[m for m in covering if m.serial in shown])
