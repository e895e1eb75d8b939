"""On SQLite, a spend sum or a balance past 64 bits is refused, as PostgreSQL's BIGINT refuses it.

SQLite turns an integer sum that overflows into a REAL and stores it without a word: a month's spend past
9.2e18 micro-dollars became an approximate float, where PostgreSQL refuses the write and the backlog sets the row
aside in the audit trail. A trigger before each write of `spend` and `balances` aborts one whose amount is not an
integer, so SQLite refuses it too (an integrity error, which the backlog sets aside the same way). PostgreSQL needs
nothing: its columns refuse the value themselves.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_TABLES = ("spend", "balances")
_WRITES = ("insert", "update")


def upgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    for table in _TABLES:
        for write in _WRITES:
            op.execute(f"CREATE TRIGGER {table}_{write}_integer BEFORE {write.upper()} ON {table} "
                       "WHEN typeof(NEW.micros) != 'integer' BEGIN "
                       f"SELECT RAISE(ABORT, '{table}.micros out of range: the sum is past a 64-bit integer'); END")


def downgrade() -> None:
    if op.get_context().dialect.name != "sqlite":
        return
    for table in _TABLES:
        for write in _WRITES:
            op.execute(f"DROP TRIGGER IF EXISTS {table}_{write}_integer")
