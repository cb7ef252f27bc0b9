"""manifests: the digests of each manifest stamp, in buckets

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 12:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "manifest_digests",
        sa.Column("stamp_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  sa.ForeignKey("stamps.id"), primary_key=True, autoincrement=False),
        sa.Column("bucket", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("digests", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_manifest_digests_bucket", "manifest_digests", ["algorithm", "bucket"])


def downgrade() -> None:
    op.drop_index("ix_manifest_digests_bucket", table_name="manifest_digests")
    op.drop_table("manifest_digests")
