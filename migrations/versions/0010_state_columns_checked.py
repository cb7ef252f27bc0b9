"""state columns checked: each holds one of its state machine's states; jobs' defaults in SQL

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26 10:00:00

A CHECK constraint on every ``state`` column (stamps, log commits, cross stamps, jobs): the
database refuses a state its code does not know (a typo, a release that added a state
running against one that did not). The states are spelled out here, as they were when this
revision was written (`server.models.StampState`, `LogCommitState`, `CrossStampState`,
`workers.jobtable.JobState`); a state added later needs a revision of its own.

The ``jobs`` table gets its defaults in SQL (``state`` queued, ``attempts`` 0), so that
`workers.jobtable.enqueue` inserts only what a new job carries.

SQLite cannot add a constraint to a table: batch mode copies each table into a new one (the
stamps with their log commits referencing them, and referenced by the manifest digests:
migrations/env.py runs migrations with foreign key enforcement off and checks the keys before
committing).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

STATES: dict[str, tuple[str, ...]] = {
    "stamps": ("pending", "signed", "failed", "failed-unlogged"),
    "log_commits": ("pending", "committed"),
    "cross_stamps": ("pending", "done", "superseded"),
    "jobs": ("queued", "claimed", "done", "failed"),
}


def _condition(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def upgrade() -> None:
    for table, states in STATES.items():
        with op.batch_alter_table(table) as batch_op:
            batch_op.create_check_constraint(f"ck_{table}_state", _condition(states))
            if table == "jobs":
                batch_op.alter_column("state", existing_type=sa.String(length=16),
                                      existing_nullable=False, server_default="queued")
                batch_op.alter_column("attempts", existing_type=sa.Integer(),
                                      existing_nullable=False, server_default=sa.text("0"))


def downgrade() -> None:
    for table in reversed(STATES):
        with op.batch_alter_table(table) as batch_op:
            if table == "jobs":
                batch_op.alter_column("attempts", existing_type=sa.Integer(),
                                      existing_nullable=False, server_default=None)
                batch_op.alter_column("state", existing_type=sa.String(length=16),
                                      existing_nullable=False, server_default=None)
            batch_op.drop_constraint(f"ck_{table}_state", type_="check")
