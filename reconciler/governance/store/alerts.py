"""The rows of `alerts`: a binding that cannot start until a person sets it up, one row per cause.

`insert_alert` adds the row inside the caller's transaction only when no router added it first (a
conditional insert, so of several routers exactly one does, and only that one queues the notices);
`count_calls` adds to the calls that failed on it; `fetch_alerts` reads the newest for the dashboard and
`handler status`. Rows come back as dicts; `governance.alerts` decides what they mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite

from reconciler.governance.store.engine import Store, Transaction
from reconciler.governance.store.tables import alerts

__all__ = ["count_calls", "fetch_alert", "fetch_alerts", "insert_alert"]


def insert_alert(tx: Transaction, values: Mapping[str, Any]) -> bool:
    """Add the alert unless one with its id exists; True when this transaction added it. Routers racing to add
    the same one meet in the primary key: the losers' inserts do nothing (ON CONFLICT), never fail."""
    insert = postgresql.insert if tx.dialect.name == "postgresql" else sqlite.insert
    done = tx.execute(insert(alerts).values(**values).on_conflict_do_nothing(index_elements=["id"])
                      .returning(alerts.c.id))
    return done.first() is not None


def count_calls(tx: Transaction, alert_id: str, calls: int, at: float) -> None:
    """Add `calls` failed calls to the alert, seen last at `at`."""
    tx.execute(sa.update(alerts).where(alerts.c.id == alert_id).values(calls=alerts.c.calls + calls, last_at=at))


def fetch_alert(store: Store, alert_id: str) -> dict[str, Any] | None:
    with store.read() as conn:
        row = conn.execute(sa.select(alerts).where(alerts.c.id == alert_id)).first()
    return dict(row._mapping) if row is not None else None


def fetch_alerts(store: Store, limit: int) -> list[dict[str, Any]]:
    """The alerts last seen most recently first."""
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(sa.select(alerts).order_by(alerts.c.last_at.desc())
                                                       .limit(limit))]
