"""email timestampers' stamps of the log: the table mail_stamps

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-02 13:10:00

Issue 41: after each log commit, each email timestamper (STAMPD_MAIL_STAMPERS) is sent the new
head and its reply, once checked, is committed to ``<name>-mailstamps``. One row per
timestamper and head (`server.models.MailStamp`), as ``cross_stamps`` is for the peers.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mail_stamps",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  autoincrement=True, nullable=False),
        sa.Column("stamper", sa.String(length=64), nullable=False),
        sa.Column("log_commit", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("refused", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_attempt_at", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.BigInteger(), nullable=False),
        sa.Column("sent_at", sa.BigInteger(), nullable=True),
        sa.Column("message_id", sa.String(length=255), nullable=True),
        sa.Column("sent_text", sa.Text(), nullable=True),
        sa.Column("replied_at", sa.BigInteger(), nullable=True),
        sa.Column("reply_text", sa.Text(), nullable=True),
        sa.Column("stamp_commit", sa.String(length=64), nullable=True),
        sa.Column("stamp_text", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("stamper", "log_commit", name="uq_mail_stamps_head"),
        sa.CheckConstraint("state IN ('pending', 'sent', 'done', 'superseded')",
                           name="ck_mail_stamps_state"),
    )
    with op.batch_alter_table("mail_stamps", schema=None) as batch_op:
        batch_op.create_index("ix_mail_stamps_state", ["state", "next_attempt_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("mail_stamps", schema=None) as batch_op:
        batch_op.drop_index("ix_mail_stamps_state")
    op.drop_table("mail_stamps")
