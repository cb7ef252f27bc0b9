"""receipts stored uncompressed on PostgreSQL (a manifest's signed text is up to 256 MiB)

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 13:00:00

PostgreSQL compresses a value over ~2 kB with pglz before it stores it out of line: for a
million-line manifest (72 MB) that took 2.2 s of the request, uncompressed 0.6 s. Receipts
and git objects are far below that size and never compressed anyway. SQLite: nothing to do.
"""

from __future__ import annotations

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE stamps ALTER COLUMN receipt SET STORAGE EXTERNAL")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE stamps ALTER COLUMN receipt SET STORAGE EXTENDED")
