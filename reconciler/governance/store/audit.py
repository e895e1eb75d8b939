"""The audit trail's rows: every decision, every change of a hold and of the balance, in order.

Writers call `record` inside their own transaction, so an event is in the trail exactly when the
change it describes is in the store. `handler audit` reads it with `read_audit`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.engine import Store, Transaction, now
from reconciler.governance.store.tables import audit

__all__ = ["audit_row", "insert_audit", "read_audit", "record"]

_INSERT = sa.insert(audit)


def audit_row(event: str, *, request_id: str | None = None, profile: str | None = None, instance: str | None = None,
              tool: str | None = None, actor: str | None = None, status: str | None = None,
              detail: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One audit row as the table holds it, stamped now (the backlog gathers these to insert later)."""
    return {"at": now(), "event": event, "request_id": request_id, "profile": profile, "instance": instance,
            "tool": tool, "actor": actor, "status": status, "detail": dict(detail or {})}


def insert_audit(tx: Transaction, row: Mapping[str, Any]) -> None:
    """Append a row built by `audit_row`, inside the caller's transaction."""
    tx.execute(_INSERT, row)


def record(tx: Transaction, event: str, *, request_id: str | None = None, profile: str | None = None,
           instance: str | None = None, tool: str | None = None, actor: str | None = None,
           status: str | None = None, detail: Mapping[str, Any] | None = None) -> None:
    """Append one row to the audit trail, inside the caller's transaction."""
    insert_audit(tx, audit_row(event, request_id=request_id, profile=profile, instance=instance, tool=tool,
                                  actor=actor, status=status, detail=detail))


def read_audit(store: Store, *, request_id: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """The newest `limit` audit rows (oldest first), optionally of one request."""
    query = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
    if request_id:
        query = query.where(audit.c.request_id == request_id)
    with store.read() as conn:
        rows = [dict(r._mapping) for r in conn.execute(query)]
    return rows[::-1]


def count_audit(store: Store, event: str, since: float) -> int:
    """How many audit rows of `event` were written at or after `since` (a Unix time)."""
    query = sa.select(sa.func.count()).select_from(audit).where(audit.c.event == event, audit.c.at >= since)
    with store.read() as conn:
        return int(conn.execute(query).scalar_one())
