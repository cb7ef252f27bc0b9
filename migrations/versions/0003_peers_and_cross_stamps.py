"""peers and cross stamps

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 01:52:53.166010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "peers",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("url", sa.String(length=500), nullable=False),
        sa.Column("fingerprint", sa.String(length=40), nullable=True),
        sa.Column("uid", sa.String(length=500), nullable=True),
        sa.Column("pubkey", sa.Text(), nullable=True),
        sa.Column("pinned_at", sa.BigInteger(), nullable=True),
        sa.Column("pinned_by", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("name"),
    )
    op.create_table(
        "cross_stamps",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("peer", sa.String(length=64), nullable=False),
        sa.Column("log_commit", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("stamp_commit", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(
            ["peer"],
            ["peers.name"],
        ),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("peer", "log_commit", name="uq_cross_stamps_peer_head"),
    )
    with op.batch_alter_table("cross_stamps", schema=None) as batch_op:
        batch_op.create_index("ix_cross_stamps_state", ["state", "next_attempt_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("cross_stamps", schema=None) as batch_op:
        batch_op.drop_index("ix_cross_stamps_state")

    op.drop_table("cross_stamps")
    op.drop_table("peers")
