"""digest stamps and receipts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 01:49:28.362690
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("algorithm", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("digest", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("receipt", sa.Text(), nullable=True))
        batch_op.alter_column("commit", existing_type=sa.VARCHAR(length=64), nullable=True)
        batch_op.create_index("ix_stamps_digest", ["algorithm", "digest"], unique=False)


def downgrade() -> None:
    digests = op.get_bind().execute(sa.text("SELECT count(*) FROM stamps WHERE kind = 'digest'"))
    if digests.scalar():
        raise RuntimeError("cannot downgrade below 0002: the journal holds digest stamps")
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.drop_index("ix_stamps_digest")
        batch_op.alter_column("commit", existing_type=sa.VARCHAR(length=64), nullable=False)
        batch_op.drop_column("receipt")
        batch_op.drop_column("digest")
        batch_op.drop_column("algorithm")
