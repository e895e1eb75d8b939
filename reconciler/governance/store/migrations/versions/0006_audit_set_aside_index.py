"""Rows the store refused and set aside are read by time too: an index of their own, as pricing violations have.

The dashboard's overview and `handler status` count this month's `set_aside` events; a partial index holds only
those rows, so the audit rows every call writes pay nothing for it.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SET_ASIDE = sa.text("event = 'set_aside'")


def upgrade() -> None:
    # Routers of the previous release read nothing through it, so this runs with them up; on PostgreSQL, building
    # it holds writes to the audit table for as long (they wait, none is lost).
    op.create_index("ix_audit_set_aside", "audit", ["at"], sqlite_where=_SET_ASIDE, postgresql_where=_SET_ASIDE)


def downgrade() -> None:
    op.drop_index("ix_audit_set_aside", table_name="audit")
