"""journal and log commits

Revision ID: 0001
Revises:
Create Date: 2026-11-23 01:32:38.017061
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_commits",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("hash_count", sa.Integer(), nullable=False),
        sa.Column("git_commit", sa.String(length=64), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "stamps",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("commit", sa.String(length=64), nullable=False),
        sa.Column("tree", sa.String(length=64), nullable=True),
        sa.Column("parent", sa.String(length=64), nullable=True),
        sa.Column("tagname", sa.String(length=100), nullable=True),
        sa.Column("stamped_at", sa.BigInteger(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=64), nullable=True),
        sa.Column("object_id", sa.String(length=64), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column(
            "log_commit_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True
        ),
        sa.ForeignKeyConstraint(
            ["log_commit_id"],
            ["log_commits.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.create_index("ix_stamps_commit", ["commit"], unique=False)
        batch_op.create_index(
            batch_op.f("ix_stamps_log_commit_id"), ["log_commit_id"], unique=False
        )


def downgrade() -> None:
    with op.batch_alter_table("stamps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_stamps_log_commit_id"))
        batch_op.drop_index("ix_stamps_commit")

    op.drop_table("stamps")
    op.drop_table("log_commits")
