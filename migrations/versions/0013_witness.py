"""witness: what this server, as a witness of other logs, last cosigned for each

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-29 10:00:00

``witness_logs`` (docs/witness.md): one row per log witnessed, by origin: the size and root
hash of the newest checkpoint cosigned (compare-and-set by ``server.witness``), that
checkpoint as cosigned (empty until the cosignature is made) and when it was stored.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "witness_logs",
        sa.Column("origin", sa.Text(), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("root_hash", sa.LargeBinary(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("witness_logs")
