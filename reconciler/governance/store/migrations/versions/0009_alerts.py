"""A binding that cannot start until a person sets it up is recorded once per cause, so its owners are told once.

The table `alerts` holds one row per binding and cause (a secret its reference does not find, a program that is not
installed); the notices telling the owners are rows of `notices` under the alert's id, sent by the notifier as a
hold's are. New routers write it; routers of the previous release never read it, so this runs with them up.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("binding", sa.String(200), nullable=False),
        sa.Column("cause", sa.String(40), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("first_at", sa.Float, nullable=False),
        sa.Column("last_at", sa.Float, nullable=False),
        sa.Column("calls", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alerts")
