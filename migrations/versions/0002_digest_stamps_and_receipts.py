"""digest stamps and receipts

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 01:49:28.362690
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from alembic.util.exc import CommandError

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
    # Before 0002 every stamp had a commit; digest stamps (and the kinds of later revisions:
    # manifests, RFC 3161 tokens) have none. Refuse, in alembic's error, which the CLI prints as
    # one line, rather than fail on the NOT NULL below (or drop the stamps).
    uncommitted = op.get_bind().execute(
        sa.text('SELECT count(*) FROM stamps WHERE "commit" IS NULL')).scalar()
    if uncommitted:
        raise CommandError(f"cannot downgrade below 0002: the journal holds {uncommitted} "
                           "stamps without a commit id (digest, manifest or RFC 3161 stamps)")
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.drop_index("ix_stamps_digest")
        batch_op.alter_column("commit", existing_type=sa.VARCHAR(length=64), nullable=False)
        batch_op.drop_column("receipt")
        batch_op.drop_column("digest")
        batch_op.drop_column("algorithm")
