"""Bearer tokens of the MCP endpoints over HTTP: a name, the SHA-256 of the token, its profile, instance and expiry.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A new table: routers of the previous release never read it, so it can be added with them running.
    op.create_table(
        "tokens",
        sa.Column("name", sa.String(100), primary_key=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("profile", sa.String(200), nullable=False),
        sa.Column("instance", sa.String(200)),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("created_by", sa.String(200), nullable=False),
        sa.Column("expires_at", sa.Float),
    )


def downgrade() -> None:
    op.drop_table("tokens")
