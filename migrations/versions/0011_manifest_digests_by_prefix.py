"""manifest digests by prefix: no index row holds more than 256 digests

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27 10:00:00

Revision 0008 stored a manifest's digests in one row per 16-bit bucket: three manifests of a
million digests that all start with the same 16 bits made every look-up of such a digest
read 96 MB. Now a row is keyed by a prefix of 2 bytes or more (``prefix`` replaces
``bucket``): a bucket of more than 256 digests is split by one more byte, again and again
(`formats.manifests.buckets`), and a look-up reads at most one row per manifest.

Up: every bucket row is expanded into the rows of its prefixes; down: a manifest's rows of
one 16-bit bucket are merged back into one row (the digests stay sorted: a manifest's
prefixes are disjoint, and in prefix order their digests are in order). The rule is written
out here as it was when this revision was written; the rows are streamed, a few at a time.
The table is copied into a new one, the old one dropped and the new one renamed (on
PostgreSQL its constraints too, to the names a freshly created table has).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

BUCKET_DIGESTS = 256
WIDTH = {"sha256": 32, "sha512": 64}
BATCH = 500  # rows inserted at a time


def _split(prefix: bytes, group: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
    """The rows of the sorted distinct digests ``group`` that start with ``prefix``."""
    if len(group) <= BUCKET_DIGESTS or len(prefix) >= len(group[0]):
        yield prefix, b"".join(group)
        return
    n = len(prefix) + 1
    sub: dict[bytes, list[bytes]] = {}
    for d in group:
        sub.setdefault(d[:n], []).append(d)
    for p, g in sub.items():
        yield from _split(p, g)


def _create(name: str, key: sa.Column[object]) -> None:
    op.create_table(
        name,
        sa.Column("stamp_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("stamps.id"), primary_key=True, autoincrement=False),
        key,
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("digests", sa.LargeBinary(), nullable=False),
    )


def _rename(old: str, new: str) -> None:
    op.rename_table(old, new)
    if op.get_bind().dialect.name == "postgresql":  # the names a table created as ``new`` has
        op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT {old}_pkey TO {new}_pkey")
        op.execute(f"ALTER TABLE {new} RENAME CONSTRAINT {old}_stamp_id_fkey "
                   f"TO {new}_stamp_id_fkey")


def _copy(target: str, target_key: str, rows: Iterator[tuple[object, ...]]) -> None:
    table = sa.table(target, sa.column("stamp_id"), sa.column(target_key),
                     sa.column("algorithm"), sa.column("digests"))
    conn = op.get_bind()
    batch: list[dict[str, object]] = []
    for stamp_id, k, algorithm, digests in rows:
        batch.append({"stamp_id": stamp_id, target_key: k, "algorithm": algorithm,
                      "digests": digests})
        if len(batch) >= BATCH:
            conn.execute(sa.insert(table), batch)
            batch = []
    if batch:
        conn.execute(sa.insert(table), batch)


def _read(table: str, key: str) -> Iterator[tuple[Any, ...]]:
    """The rows of ``table`` in (stamp_id, ``key``) order, streamed (PostgreSQL: a
    server-side cursor)."""
    t = sa.table(table, sa.column("stamp_id"), sa.column(key), sa.column("algorithm"),
                 sa.column("digests"))
    # (the statement's option: the connection's would stream the DDL that follows too)
    for row in op.get_bind().execute(
            sa.select(t.c.stamp_id, t.c[key], t.c.algorithm, t.c.digests)
            .order_by(t.c.stamp_id, t.c[key]).execution_options(yield_per=BATCH)):
        yield tuple(row)


def _expanded() -> Iterator[tuple[object, ...]]:
    for stamp_id, bucket, algorithm, packed in _read("manifest_digests", "bucket"):
        w = WIDTH[str(algorithm)]
        raw = bytes(packed)
        group = [raw[i:i + w] for i in range(0, len(raw), w)]
        for prefix, digests in _split(int(bucket).to_bytes(2, "big"),
                                      group):
            yield stamp_id, prefix, algorithm, digests


def _merged() -> Iterator[tuple[object, ...]]:
    at: tuple[object, bytes, object] | None = None
    parts: list[bytes] = []
    for stamp_id, prefix, algorithm, packed in _read("manifest_digests", "prefix"):
        here = (stamp_id, bytes(prefix)[:2], algorithm)
        if here != at:
            if at is not None:
                yield at[0], int.from_bytes(at[1], "big"), at[2], b"".join(parts)
            at, parts = here, []
        parts.append(bytes(packed))
    if at is not None:
        yield at[0], int.from_bytes(at[1], "big"), at[2], b"".join(parts)


def upgrade() -> None:
    _create("manifest_digests_0011",
            sa.Column("prefix", sa.LargeBinary(), primary_key=True, nullable=False))
    _copy("manifest_digests_0011", "prefix", _expanded())
    op.drop_index("ix_manifest_digests_bucket", table_name="manifest_digests")
    op.drop_table("manifest_digests")
    _rename("manifest_digests_0011", "manifest_digests")
    op.create_index("ix_manifest_digests_prefix", "manifest_digests", ["algorithm", "prefix"])


def downgrade() -> None:
    _create("manifest_digests_0010",
            sa.Column("bucket", sa.Integer(), primary_key=True, autoincrement=False))
    _copy("manifest_digests_0010", "bucket", _merged())
    op.drop_index("ix_manifest_digests_prefix", table_name="manifest_digests")
    op.drop_table("manifest_digests")
    _rename("manifest_digests_0010", "manifest_digests")
    op.create_index("ix_manifest_digests_bucket", "manifest_digests", ["algorithm", "bucket"])
