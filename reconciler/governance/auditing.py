"""The audit trail as `handler audit`, `handler status` and the dashboard read it; its rows are written by
the store (`store.audit.record`), inside the transaction of the change each one describes."""

from __future__ import annotations

import datetime as dt

from reconciler.governance.store import Store
from reconciler.governance.store.audit import count_audit, read_audit

__all__ = ["pricing_violations_this_month", "read_audit"]


def pricing_violations_this_month(store: Store) -> int:
    """How many calls this calendar month (UTC) reported a cost above what was reserved for them."""
    start = dt.datetime.now(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return count_audit(store, "pricing_violation", start.timestamp())
