"""The audit trail's time index covers pricing violations only: the one read by time.

Every call writes audit rows, and an index on `at` over all of them cost a quarter of each row's
insert; only `auditing.pricing_violations_this_month` reads rows by time, and only pricing violations.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_VIOLATIONS = sa.text("event = 'pricing_violation'")


def upgrade() -> None:
    # Routers of the previous release read nothing through either index, so this runs with them up; on
    # PostgreSQL, building the new index holds writes to the audit table (they wait, none is lost).
    op.create_index("ix_audit_violations", "audit", ["at"], sqlite_where=_VIOLATIONS, postgresql_where=_VIOLATIONS)
    op.drop_index("ix_audit_at", table_name="audit")


def downgrade() -> None:
    op.create_index("ix_audit_at", "audit", ["at"])
    op.drop_index("ix_audit_violations", table_name="audit")
