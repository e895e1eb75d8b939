"""The outbox of approver notifications.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "notices",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("hold_id", sa.String(40), nullable=False),
        sa.Column("channel", sa.String(16), nullable=False),
        sa.Column("target", sa.String(320), nullable=False),
        sa.Column("member", sa.String(200)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_at", sa.Float, nullable=False),
        sa.Column("claimed_at", sa.Float),
        sa.Column("sent_at", sa.Float),
        sa.Column("ref", sa.String(200)),
        sa.Column("error", sa.Text),
        sa.UniqueConstraint("hold_id", "channel", "target", name="uq_notices_target"),
    )
    op.create_index("ix_notices_hold_id", "notices", ["hold_id"])
    op.create_index("ix_notices_state", "notices", ["state"])


def downgrade() -> None:
    op.drop_table("notices")
