"""Budget leases: a router's slice of a cap's headroom or of a prepaid balance.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table: routers of the previous release never read it, so it can be added with them running.
    op.create_table(
        "leases",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("router", sa.String(80), nullable=False),
        sa.Column("scope", sa.String(420)),
        sa.Column("month", sa.String(7)),
        sa.Column("account", sa.String(200)),
        sa.Column("granted", sa.BigInteger, nullable=False),
        sa.Column("issued", sa.BigInteger, nullable=False),
        sa.Column("charged", sa.BigInteger, nullable=False),
        sa.Column("taken_at", sa.Float, nullable=False),
        sa.Column("renewed_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
    )
    op.create_index("ix_leases_router", "leases", ["router"])
    op.create_index("ix_leases_state", "leases", ["state"])


def downgrade() -> None:
    op.drop_table("leases")
