"""Holds, the audit trail, spend per scope and month, prepaid balances and reservations.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
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
        "holds",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("revision", sa.String(80), nullable=False),
        sa.Column("profile", sa.String(200), nullable=False),
        sa.Column("instance", sa.String(200), nullable=False),
        sa.Column("parent_instance", sa.String(200)),
        sa.Column("interface", sa.String(200), nullable=False),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("binding", sa.String(200), nullable=False),
        sa.Column("arguments", sa.JSON, nullable=False),
        sa.Column("cost", sa.BigInteger, nullable=False),
        sa.Column("approver", sa.JSON),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("trace", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("decided_by", sa.String(200)),
        sa.Column("decided_at", sa.Float),
        sa.Column("claimed_by", sa.String(80)),
        sa.Column("claimed_at", sa.Float),
        sa.Column("finished_at", sa.Float),
        sa.Column("result", sa.JSON),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("charged", sa.BigInteger),
    )
    op.create_index("ix_holds_state", "holds", ["state"])
    op.create_table(
        "audit",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("request_id", sa.String(40)),
        sa.Column("profile", sa.String(200)),
        sa.Column("instance", sa.String(200)),
        sa.Column("tool", sa.String(200)),
        sa.Column("actor", sa.String(200)),
        sa.Column("status", sa.String(16)),
        sa.Column("detail", sa.JSON, nullable=False),
    )
    op.create_index("ix_audit_at", "audit", ["at"])
    op.create_index("ix_audit_request_id", "audit", ["request_id"])
    op.create_table(
        "spend",
        sa.Column("scope", sa.String(420), primary_key=True),
        sa.Column("month", sa.String(7), primary_key=True),
        sa.Column("micros", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "balances",
        sa.Column("account", sa.String(200), primary_key=True),
        sa.Column("micros", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "reservations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("request_id", sa.String(40)),
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("scopes", sa.JSON, nullable=False),
        sa.Column("account", sa.String(200)),
        sa.Column("reserved", sa.BigInteger, nullable=False),
        sa.Column("charged", sa.BigInteger),
        sa.Column("state", sa.String(16), nullable=False),
    )


def downgrade() -> None:
    for table in ("reservations", "balances", "spend", "audit", "holds"):
        op.drop_table(table)
