"""jobs and heartbeats for several hosts

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 02:36:10.501098
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=True),
        sa.Column("claimed_at", sa.Float(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_claim", ["state", "key_id", "id"], unique=False)

    op.create_table(
        "worker_heartbeats",
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("key_id", sa.String(length=64), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_seen", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("cross_stamps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("stamp_text", sa.Text(), nullable=True))

    with op.batch_alter_table("log_commits", schema=None) as batch_op:
        batch_op.add_column(sa.Column("raw", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("files", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("log_commits", schema=None) as batch_op:
        batch_op.drop_column("files")
        batch_op.drop_column("raw")

    with op.batch_alter_table("cross_stamps", schema=None) as batch_op:
        batch_op.drop_column("stamp_text")

    op.drop_table("worker_heartbeats")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_claim")

    op.drop_table("jobs")
