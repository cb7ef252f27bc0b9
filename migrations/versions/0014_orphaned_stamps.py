"""orphaned stamps: a stamp published without a recorded outcome says so

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 00:10:00

A stamp whose process died between journaling it and recording its outcome stays ``pending``;
once no live request can be behind it (older than the request timeout plus a grace) the logs
publish it, since its signature may have gone out. The first log to publish it (the
transparency log's sequencer or the git log's committer) now marks it ``orphaned`` in the same
transaction (`server.models.StampState.ORPHANED`), so its row no longer says ``pending``
for ever. This revision adds the state to the CHECK constraint of ``stamps.state``
(migration 0010); stamps published before it stay ``pending``.

Downgrading makes orphaned stamps ``pending`` again, what the older release shows for them.
SQLite copies the table to change a constraint (batch mode, as in 0010).
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

BEFORE = ("pending", "signed", "failed", "failed-unlogged")
AFTER = (*BEFORE, "orphaned")


def _condition(states: tuple[str, ...]) -> str:
    return "state IN (" + ", ".join(f"'{s}'" for s in states) + ")"


def _checked(states: tuple[str, ...]) -> None:
    with op.batch_alter_table("stamps") as batch_op:
        batch_op.drop_constraint("ck_stamps_state", type_="check")
        batch_op.create_check_constraint("ck_stamps_state", _condition(states))


def upgrade() -> None:
    _checked(AFTER)


def downgrade() -> None:
    op.execute("UPDATE stamps SET state = 'pending' WHERE state = 'orphaned'")
    _checked(BEFORE)
