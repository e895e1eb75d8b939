"""Writes that no decision waits for, gathered and committed together a moment later.

A call that nothing limits — no cap on its org, profile or instance, no prepaid balance — is
decided from config alone, so the router need not wait for the store: its audit rows and its spend
(for `handler spend`) go into this backlog, which the governor commits every `delay` seconds in one
transaction. Everything a decision depends on (capped spend, balances, holds) is still written
synchronously. On a crash, at most the last `delay` seconds of such rows are lost; the call log has
those calls too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store import Store, audit, now, spend

__all__ = ["Backlog"]


class Backlog:
    """Audit rows and spend additions waiting to be committed; safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._audit: list[dict[str, Any]] = []
        self._spend: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        return len(self._audit) + len(self._spend)

    def add_event(self, event: str, *, request_id: str | None, profile: str, instance: str, tool: str | None,
                  status: str, detail: Mapping[str, Any]) -> None:
        row = {"at": now(), "event": event, "request_id": request_id, "profile": profile, "instance": instance,
               "tool": tool, "actor": None, "status": status, "detail": dict(detail)}
        with self._lock:
            self._audit.append(row)

    def add_spend(self, scopes: tuple[str, ...], month: str, micros: int) -> None:
        if not micros:
            return
        with self._lock:
            for scope in scopes:
                key = (scope, month)
                self._spend[key] = self._spend.get(key, 0) + micros

    def flush(self, store: Store) -> int:
        """Commit what is waiting in one transaction; returns how many rows and sums it wrote."""
        with self._lock:
            rows, sums = self._audit, self._spend
            self._audit, self._spend = [], {}
        if not rows and not sums:
            return 0
        with store.begin() as conn:
            if rows:
                conn.execute(sa.insert(audit), rows)
            if sums:
                conn.execute(store.insert_ignore(spend),
                             [{"scope": s, "month": m, "micros": 0} for (s, m) in sorted(sums)])
                conn.execute(sa.update(spend)
                             .where(spend.c.scope == sa.bindparam("p_scope"), spend.c.month == sa.bindparam("p_month"))
                             .values(micros=spend.c.micros + sa.bindparam("p_add")),
                             [{"p_scope": s, "p_month": m, "p_add": v} for (s, m), v in sorted(sums.items())])
        return len(rows) + len(sums)
