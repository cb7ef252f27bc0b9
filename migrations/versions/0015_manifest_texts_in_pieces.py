"""signed manifests stored in pieces: the table manifest_texts

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-27 04:00:00

A signed manifest (up to 256 MiB) was stored in ``stamps.receipt``, written in one
transaction: on the journal's one writer that held up every stamp committed behind it (a
stamp's p99 of 673 ms while manifests were stored). Now its UTF-8 text is stored in pieces of
at most 1 MiB (`server.models.ManifestText`), a few per transaction, and ``receipt`` holds
receipts only.

Up: each signed manifest's text is moved from ``stamps.receipt`` into pieces (read 1 Mi
characters at a time) and its ``receipt`` set to NULL. Down: each signed manifest's pieces are
joined back into its ``receipt`` (a whole text at a time) and the table dropped. On PostgreSQL the
pieces are stored uncompressed, as ``receipt`` was (revision 0009).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

PIECE = 1 << 20  # characters read, and stored as one piece, at a time

stamps = sa.table("stamps", sa.column("id"), sa.column("kind"), sa.column("state"),
                  sa.column("receipt"))
texts = sa.table("manifest_texts", sa.column("stamp_id"), sa.column("seq"),
                 sa.column("piece"))


def upgrade() -> None:
    op.create_table(
        "manifest_texts",
        sa.Column("stamp_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("stamps.id"), primary_key=True, autoincrement=False),
        sa.Column("seq", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("piece", sa.LargeBinary(), nullable=False),
    )
    conn = op.get_bind()
    if conn.dialect.name == "postgresql":
        op.execute("ALTER TABLE manifest_texts ALTER COLUMN piece SET STORAGE EXTERNAL")
    moved = conn.execute(sa.select(stamps.c.id, sa.func.length(stamps.c.receipt)).where(
        stamps.c.kind == "manifest", stamps.c.receipt.is_not(None))).all()
    for stamp_id, length in moved:
        for seq, at in enumerate(range(0, length, PIECE)):
            piece = conn.execute(sa.select(sa.func.substr(stamps.c.receipt, at + 1, PIECE))
                                 .where(stamps.c.id == stamp_id)).scalar_one()
            conn.execute(sa.insert(texts).values(stamp_id=stamp_id, seq=seq,
                                                 piece=piece.encode("utf-8")))
        conn.execute(sa.update(stamps).where(stamps.c.id == stamp_id).values(receipt=None))


def downgrade() -> None:
    conn = op.get_bind()
    for (stamp_id,) in conn.execute(sa.select(texts.c.stamp_id).distinct().join(
            stamps, stamps.c.id == texts.c.stamp_id).where(stamps.c.state == "signed")).all():
        pieces = conn.execute(sa.select(texts.c.piece).where(texts.c.stamp_id == stamp_id)
                              .order_by(texts.c.seq)).scalars()
        text = b"".join(bytes(p) for p in pieces).decode("utf-8")
        conn.execute(sa.update(stamps).where(stamps.c.id == stamp_id).values(receipt=text))
    op.drop_table("manifest_texts")
