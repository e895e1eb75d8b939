"""A hold's decision reason (why it was rejected) and the cause of a failed run, for the people who read it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-14
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable columns: both backends add them in place, existing holds keep NULL (no reason, no cause).
    op.add_column("holds", sa.Column("decision_reason", sa.Text))
    op.add_column("holds", sa.Column("cause", sa.Text))


def downgrade() -> None:
    # SQLite drops a column by copying the table: batch mode does that.
    with op.batch_alter_table("holds") as batch:
        batch.drop_column("cause")
        batch.drop_column("decision_reason")
