"""transparency log: entries, the newest checkpoint, each stamp's index

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 10:00:00

Every stamp becomes an entry of the transparency log (`formats.tlog.entry`,
docs/transparency.md): ``stamps.tlog_index`` (unique where set; a partial index lists the
stamps not yet sequenced, in id order, and is the one the sequencer's query can use),
``tlog_entries`` (index, entry bytes; its stamp is the one whose ``tlog_index`` it is) and
``tlog_checkpoint`` (the newest signed checkpoint, one row). ``stamps.object_id`` gets an
index: a git stamp's proof is found by the id of the signed object. Stamps journalled before
this revision have no index yet: the sequencer gives them one, in id order, when it starts.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("stamps") as batch:
        batch.add_column(sa.Column("tlog_index", sa.BigInteger(), nullable=True))
    op.create_index("ix_stamps_object_id", "stamps", ["object_id"])
    op.create_index("ix_stamps_tlog_index", "stamps", ["tlog_index"], unique=True,
                    sqlite_where=sa.text("tlog_index IS NOT NULL"),
                    postgresql_where=sa.text("tlog_index IS NOT NULL"))
    op.create_index("ix_stamps_untlogged", "stamps", ["id"],
                    sqlite_where=sa.text("tlog_index IS NULL"),
                    postgresql_where=sa.text("tlog_index IS NULL"))
    op.create_table(
        "tlog_entries",
        sa.Column("idx", BIG_ID, primary_key=True, autoincrement=False),
        sa.Column("entry", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "tlog_checkpoint",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("signed_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tlog_checkpoint")
    op.drop_table("tlog_entries")
    op.drop_index("ix_stamps_untlogged", "stamps")
    op.drop_index("ix_stamps_tlog_index", "stamps")
    op.drop_index("ix_stamps_object_id", "stamps")
    with op.batch_alter_table("stamps") as batch:
        batch.drop_column("tlog_index")
