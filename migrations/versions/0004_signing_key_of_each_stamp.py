"""signing key of each stamp

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 02:22:25.799889
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("key_id", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.drop_column("key_id")
