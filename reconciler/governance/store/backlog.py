"""Writes that no decision waits for, gathered and committed together a moment later.

A call that nothing limits — no cap on its org, profile or instance, no prepaid balance — is
decided from config alone, so the router need not wait for the store: its audit rows and its spend
(for `handler spend`) go into this backlog, which the gate commits a moment later (every
`batch_seconds`) in one transaction. Settling a reserved call goes here too: the reservation already
counted the estimate, so a late settlement only keeps a refund (a failed call, a lower actual
cost) waiting a moment — it errs on the side of the cap. Reservations, holds and everything else a
decision reads are written synchronously. On a crash, at most the last moment of such rows is lost;
a reservation left unsettled stays counted at its estimate.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.engine import Store
from reconciler.governance.store.tables import audit, balances, reservations, spend

__all__ = ["Backlog"]

_CLOSE = (sa.update(reservations).where(reservations.c.id == sa.bindparam("p_id"))
          .values(charged=sa.bindparam("p_charged"), state=sa.bindparam("p_state")))
_ADD_SPEND = (sa.update(spend).where(spend.c.scope == sa.bindparam("p_scope"), spend.c.month == sa.bindparam("p_month"))
              .values(micros=spend.c.micros + sa.bindparam("p_add")))


class Backlog:
    """Audit rows and spend additions waiting to be committed; safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One commit at a time: a flush returns once everything added before it is committed, even
        # when another thread took those rows a moment earlier and is committing them still.
        self._committing = threading.Lock()
        self._audit: list[dict[str, Any]] = []
        self._spend: dict[tuple[str, str], int] = {}
        self._balances: dict[str, int] = {}
        self._settled: list[dict[str, Any]] = []
        self._reserved: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self._audit) + len(self._spend) + len(self._settled) + len(self._reserved)

    def add_audit(self, row: dict[str, Any]) -> None:
        """An audit row built by `audit.audit_row` (kept as it is: the caller hands it over)."""
        with self._lock:
            self._audit.append(row)

    def add_spend(self, scopes: tuple[str, ...], month: str, micros: int) -> None:
        if not micros:
            return
        with self._lock:
            for scope in scopes:
                key = (scope, month)
                self._spend[key] = self._spend.get(key, 0) + micros

    def add_reservation(self, row: Mapping[str, Any]) -> None:
        """The record of a reservation whose spend rows are already updated (see `ledger.reserve`)."""
        with self._lock:
            self._reserved.append(dict(row))

    def add_settlement(self, reservation_id: str, charged: int, ok: bool, delta: int, scopes: tuple[str, ...],
                       month: str, account: str | None) -> None:
        """A reserved call settled: its reservation closed and the difference moved, a moment later."""
        with self._lock:
            self._settled.append({"p_id": reservation_id, "p_charged": charged,
                                  "p_state": "settled" if ok else "released"})
            if delta:
                for scope in scopes:
                    self._spend[(scope, month)] = self._spend.get((scope, month), 0) + delta
                if account is not None:
                    self._balances[account] = self._balances.get(account, 0) - delta

    def flush(self, store: Store) -> int:
        """Commit what is waiting in one transaction; returns how many rows and sums it wrote."""
        with self._committing:
            with self._lock:
                rows, sums, settled, moved = self._audit, self._spend, self._settled, self._balances
                reserved = self._reserved
                self._audit, self._spend, self._settled, self._balances, self._reserved = [], {}, [], {}, []
            if not rows and not sums and not settled and not reserved:
                return 0
            with store.begin() as tx:
                if reserved:  # before the settlements that close them
                    tx.execute(sa.insert(reservations), reserved)
                if settled:
                    tx.execute(_CLOSE, settled)
                for account, change in sorted(moved.items()):
                    tx.execute(sa.update(balances).where(balances.c.account == account)
                               .values(micros=balances.c.micros + change))
                if rows:
                    tx.execute(sa.insert(audit), rows)
                if sums:
                    tx.execute(store.insert_ignore(spend),
                               [{"scope": s, "month": m, "micros": 0} for (s, m) in sorted(sums)])
                    tx.execute(_ADD_SPEND,
                               [{"p_scope": s, "p_month": m, "p_add": v} for (s, m), v in sorted(sums.items())])
            return len(rows) + len(sums) + len(settled) + len(reserved)
