"""the RFC 3161 certificate chain of a registered key

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25 11:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.add_column(sa.Column("certificates", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("signing_keys") as batch:
        batch.drop_column("certificates")
