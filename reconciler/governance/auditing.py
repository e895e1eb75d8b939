"""The audit trail as `handler audit`, `handler status` and the dashboard read it; its rows are written by
the store (`store.audit.record`), inside the transaction of the change each one describes."""

from __future__ import annotations

import datetime as dt

from reconciler.governance.store import Store
from reconciler.governance.store.audit import AuditFilter, count_audit, read_audit, search_audit
from reconciler.governance.store.backlog import SET_ASIDE

__all__ = ["SET_ASIDE", "AuditFilter", "pricing_violations_this_month", "read_audit", "search_audit",
           "set_aside_this_month"]


def pricing_violations_this_month(store: Store) -> int:
    """How many calls this calendar month (UTC) reported a cost above what was reserved for them."""
    return count_audit(store, "pricing_violation", _month_start())


def set_aside_this_month(store: Store) -> int:
    """How many rows the store refused this calendar month (UTC), each kept in the trail as a `set_aside` event."""
    return count_audit(store, SET_ASIDE, _month_start())


def _month_start() -> float:
    return dt.datetime.now(dt.UTC).replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()
