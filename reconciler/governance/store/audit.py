"""The audit trail's rows: every decision, every change of a hold and of the balance, in order.

Writers call `record` inside their own transaction, so an event is in the trail exactly when the
change it describes is in the store; the gate's backlog gathers rows built by `audit_row` and writes
them together with `insert_audit` (docs/architecture.md §10). A row is a plain tuple whose detail is
already JSON text, handed to the driver as it is. On PostgreSQL the rows go in by COPY. On SQLite they
go in as multi-row statements of up to 256 rows each, because the driver releases the interpreter's
lock for each statement it runs: `executemany` released and retook it on every row, and the threads
switching at each retake cost the store's writer nearly as much as the inserts themselves.
`handler audit` reads the trail with `read_audit`, the dashboard's audit page with `search_audit`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import sqlalchemy as sa

from reconciler.governance.store.engine import Store, Transaction, marker, now
from reconciler.governance.store.tables import audit

__all__ = ["AUDIT_COLUMNS", "COPY_AUDIT", "AuditFilter", "AuditRow", "audit_row", "audit_statements", "insert_audit",
           "read_audit", "record", "search_audit"]

# The names of an `AuditRow`'s fields, in its order: the table's columns (a reader names a row's fields with
# `dict(zip(AUDIT_COLUMNS, row))`).
AUDIT_COLUMNS = ("at", "event", "request_id", "profile", "instance", "tool", "actor", "status", "detail")
COPY_AUDIT = f"COPY audit ({', '.join(AUDIT_COLUMNS)}) FROM STDIN"
_INSERT = f"INSERT INTO audit ({', '.join(AUDIT_COLUMNS)}) VALUES "  # noqa: S608 - the table's own names, no input

_ROWS_A_STATEMENT = 256  # SQLite's: 2,304 parameters, well under its limit of 32,766

# One row of the trail as the table holds it, `detail` already JSON text: (at, event, request_id, profile,
# instance, tool, actor, status, detail). A plain tuple: the gate builds one or two on every call.
AuditRow = tuple[float, str, str | None, str | None, str | None, str | None, str | None, str | None, str]


def audit_row(event: str, *, request_id: str | None = None, profile: str | None = None, instance: str | None = None,
              tool: str | None = None, actor: str | None = None, status: str | None = None,
              detail: Mapping[str, Any] | str | None = None) -> AuditRow:
    """One audit row, stamped now (the backlog gathers these to insert later); a `detail` already JSON text is
    kept as it is (the gate encodes a recurring one once)."""
    if not isinstance(detail, str):
        detail = orjson.dumps(detail or {}, option=orjson.OPT_NON_STR_KEYS).decode()
    return (now(), event, request_id, profile, instance, tool, actor, status, detail)


def insert_audit(tx: Transaction, *rows: AuditRow) -> None:
    """Append rows built by `audit_row`, inside the caller's transaction, in their order: PostgreSQL's COPY (three
    times the rows per second of its `executemany`), SQLite's multi-row INSERT."""
    if not rows:
        return
    if tx.dialect.name == "postgresql" and len(rows) > 1:
        driver = tx.connection.driver_connection
        assert driver is not None  # noqa: S101 - a connection in a transaction has one
        with driver.cursor() as cursor, cursor.copy(COPY_AUDIT) as copy:
            for row in rows:
                copy.write_row(row)
        return
    for statement, parameters in audit_statements(marker(tx), rows):
        tx.exec_driver_sql(statement, parameters)


def audit_statements(mark: str, rows: Sequence[AuditRow]) -> list[tuple[str, tuple[Any, ...]]]:
    """The INSERTs (with their parameters) of `rows`, up to 256 a statement; `mark` is the driver's placeholder."""
    return [(_values(mark, len(chunk)), tuple(itertools.chain.from_iterable(chunk)))
            for chunk in (rows[start:start + _ROWS_A_STATEMENT] for start in range(0, len(rows), _ROWS_A_STATEMENT))]


def _values(mark: str, rows: int) -> str:
    """The INSERT of `rows` audit rows, with the driver's placeholder `mark`."""
    row = "(" + ", ".join([mark] * len(AUDIT_COLUMNS)) + ")"
    return _INSERT + ", ".join([row] * rows)


def record(tx: Transaction, event: str, *, request_id: str | None = None, profile: str | None = None,
           instance: str | None = None, tool: str | None = None, actor: str | None = None,
           status: str | None = None, detail: Mapping[str, Any] | None = None) -> None:
    """Append one row to the audit trail, inside the caller's transaction."""
    insert_audit(tx, audit_row(event, request_id=request_id, profile=profile, instance=instance, tool=tool,
                                  actor=actor, status=status, detail=detail))


def read_audit(store: Store, *, request_id: str | None = None, event: str | None = None,
               limit: int | None = 100) -> list[dict[str, Any]]:
    """The newest `limit` audit rows (None: all; oldest first), optionally of one request, of one event or both.

    Of one event, the newest are the latest by time: the events read by time (pricing violations, rows set aside)
    then come from their own index instead of a scan of the whole trail."""
    query = sa.select(audit).limit(limit)
    if request_id:
        query = query.where(audit.c.request_id == request_id)
    if event:
        query = query.where(audit.c.event == event).order_by(audit.c.at.desc(), audit.c.id.desc())
    else:
        query = query.order_by(audit.c.id.desc())
    with store.read() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    return rows[::-1]


@dataclass(frozen=True, slots=True)
class AuditFilter:
    """Which rows of the trail to read: each field set narrows it (the dashboard's audit page)."""

    profile: str | None = None
    tool: str | None = None
    event: str | None = None
    actor: str | None = None  # the member (or router) who made the change
    since: float | None = None  # Unix times, inclusive
    until: float | None = None


def search_audit(store: Store, where: AuditFilter, limit: int = 200) -> list[dict[str, Any]]:
    """The newest `limit` audit rows matching `where`, newest first."""
    query = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
    for column, value in ((audit.c.profile, where.profile), (audit.c.tool, where.tool),
                          (audit.c.event, where.event), (audit.c.actor, where.actor)):
        if value:
            query = query.where(column == value)
    if where.since is not None:
        query = query.where(audit.c.at >= where.since)
    if where.until is not None:
        query = query.where(audit.c.at <= where.until)
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def count_audit(store: Store, event: str, since: float) -> int:
    """How many audit rows of `event` were written at or after `since` (a Unix time)."""
    query = sa.select(sa.func.count()).select_from(audit).where(audit.c.event == event, audit.c.at >= since)
    with store.read() as conn:
        return int(conn.execute(query).scalar_one())
