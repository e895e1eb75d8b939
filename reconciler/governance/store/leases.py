"""The rows of budget leases: a router's slice of a spend row's headroom or of a prepaid balance.

A lease names what it was cut from: a spend row (`scope`, `month`) or a prepaid `account`. While it is
open, its `granted` amount is counted in that spend row (or taken out of that balance), so the caps
checked against the rows hold whatever the routers do in memory. `governance.leases` decides what to
take, give back and write; this module only reads, locks and writes the rows. Every transaction that
moves leases locks the spend rows first (sorted by scope and month, the order the admission path and
the backlog use), then the balances (sorted), then the lease rows, so two routers never wait on each
other in a circle.

A busy router's keeper runs a few of these transactions a second, so their statements are built once
per store (`_Statements`), as the admission path's are (`store.spend`): built anew each time, with their cache
keys worked out again, they cost SQLAlchemy more than the database's work, and a busy lease's sync two and a half
times its CPU (`benchmarks/leases.py`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import sqlalchemy as sa

from reconciler.governance.store.audit import record
from reconciler.governance.store.engine import Store, Transaction
from reconciler.governance.store.spend import ensure_spend_rows
from reconciler.governance.store.tables import balances, leases, spend

__all__ = [
    "Cut",
    "close_expired",
    "ensure_rows",
    "insert_lease",
    "lock_balances",
    "lock_leases",
    "lock_spend",
    "move_balances",
    "move_spend",
    "open_elsewhere",
    "outstanding",
    "update_lease",
]

# What a sync writes of a lease's row, every time (`update_lease`).
_LEASE_VALUES = ("granted", "issued", "charged", "renewed_at", "expires_at", "state")


class _Statements:
    """The statements of a lease sync, built once per store."""

    def __init__(self, store: Store) -> None:
        bp = sa.bindparam
        self.spend = store.for_update(sa.select(spend.c.micros)
                                      .where(spend.c.scope == bp("p_scope"), spend.c.month == bp("p_month")))
        self.balance = store.for_update(sa.select(balances.c.micros).where(balances.c.account == bp("p_account")))
        self.lease = store.for_update(sa.select(leases.c.state).where(leases.c.id == bp("p_id")))
        self.move_spend = (sa.update(spend).where(spend.c.scope == bp("p_scope"), spend.c.month == bp("p_month"))
                           .values(micros=spend.c.micros + bp("p_micros")))
        self.ensure_balance = store.insert_ignore(balances)
        self.move_balance = (sa.update(balances).where(balances.c.account == bp("p_account"))
                             .values(micros=balances.c.micros + bp("p_micros")))
        self.elsewhere = (sa.select(leases.c.scope, leases.c.month, leases.c.account,
                                    sa.func.count(sa.distinct(leases.c.router)))
                          .where(leases.c.state == "open", leases.c.router != bp("p_router"),
                                 leases.c.expires_at > bp("p_at"))
                          .group_by(leases.c.scope, leases.c.month, leases.c.account))
        self.insert = sa.insert(leases)
        self.update = (sa.update(leases).where(leases.c.id == bp("p_id"), leases.c.state == "open")
                       .values({name: bp(f"p_{name}") for name in _LEASE_VALUES}))


def _statements(store: Store) -> _Statements:
    return store.statements(_Statements)


class Cut(NamedTuple):
    """What a lease is cut from: a spend row (scope, month) or a prepaid account."""

    scope: str | None
    month: str | None
    account: str | None


def ensure_rows(store: Store, cuts: Iterable[Cut]) -> None:
    """The spend rows of `cuts`, created before any lock is taken (see `spend.ensure_spend_rows`)."""
    by_month: dict[str, list[str]] = {}
    for cut in cuts:
        if cut.scope is not None and cut.month is not None:
            by_month.setdefault(cut.month, []).append(cut.scope)
    for month, scopes in sorted(by_month.items()):
        ensure_spend_rows(store, sorted(set(scopes)), month)


def lock_spend(store: Store, tx: Transaction, rows: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """Lock the spend rows (scope, month) in their sorted order and read them."""
    query = _statements(store).spend
    return {(scope, month): int(tx.execute(query, {"p_scope": scope, "p_month": month}).scalar_one())
            for scope, month in sorted(set(rows))}


def lock_balances(store: Store, tx: Transaction, accounts: Iterable[str]) -> dict[str, int | None]:
    """Lock the prepaid balances in sorted order and read them (None: never topped up)."""
    query = _statements(store).balance
    found: dict[str, int | None] = {}
    for account in sorted(set(accounts)):
        value = tx.execute(query, {"p_account": account}).scalar_one_or_none()
        found[account] = None if value is None else int(value)
    return found


def lock_leases(store: Store, tx: Transaction, ids: Sequence[str]) -> dict[str, str]:
    """Lock these lease rows and read their state (open, returned, reconciled); a missing id is left out."""
    query = _statements(store).lease  # one at a time, in sorted order: an expanding IN costs more than a sync's few
    found = {}
    for lease_id in sorted(set(ids)):
        state = tx.execute(query, {"p_id": lease_id}).scalar_one_or_none()
        if state is not None:
            found[lease_id] = str(state)
    return found


def move_spend(store: Store, tx: Transaction, changes: Mapping[tuple[str, str], int]) -> None:
    """Add each amount (negative: take away) to its spend row, in sorted order."""
    query = _statements(store).move_spend
    for (scope, month), micros in sorted(changes.items()):
        if micros:
            tx.execute(query, {"p_scope": scope, "p_month": month, "p_micros": micros})


def move_balances(store: Store, tx: Transaction, changes: Mapping[str, int]) -> None:
    """Add each amount (negative: take away) to its prepaid balance, in sorted order."""
    st = _statements(store)
    for account, micros in sorted(changes.items()):
        if micros:
            tx.execute(st.ensure_balance, [{"account": account, "micros": 0}])
            tx.execute(st.move_balance, {"p_account": account, "p_micros": micros})


def open_elsewhere(store: Store, tx: Transaction, router: str, at: float) -> dict[Cut, int]:
    """How many other routers hold an open, unexpired lease on each cut: they share what is left."""
    found = tx.execute(_statements(store).elsewhere, {"p_router": router, "p_at": at})
    return {Cut(s, m, a): int(n) for s, m, a, n in found}


def insert_lease(store: Store, tx: Transaction, row: Mapping[str, Any]) -> None:
    tx.execute(_statements(store).insert, [dict(row)])


def update_lease(store: Store, tx: Transaction, lease_id: str, values: Mapping[str, Any]) -> bool:
    """Write an open lease's row: every column a sync writes (granted, issued, charged, renewed_at, expires_at,
    state), which `values` holds. False: it is no longer open (returned, or reconciled by another router), and
    nothing was written."""
    params = {"p_id": lease_id, **{f"p_{name}": values[name] for name in _LEASE_VALUES}}
    return tx.execute(_statements(store).update, params).rowcount == 1


def close_expired(store: Store, at: float, router: str | None = None, *, by: str | None = None) -> list[dict[str, Any]]:
    """Reconcile the open leases that expired before `at` (and, with `router`, every open one of that router,
    whose process is known to be gone): give back `granted - issued`, keep `issued` counted as spent. The audit
    row's actor is the router reconciling (`by`), its detail names the lease's own (`router`).

    `issued` is the most the lease's calls may have cost (written before they were admitted), so spend
    never under-counts. Each is recorded in the audit trail (`reconciled`). Returns what was closed.
    """
    stale = sa.and_(leases.c.state == "open", leases.c.expires_at < at)
    if router is not None:
        stale = sa.or_(stale, sa.and_(leases.c.state == "open", leases.c.router == router))
    cols = (leases.c.id, leases.c.router, leases.c.scope, leases.c.month, leases.c.account, leases.c.granted,
            leases.c.issued, leases.c.charged)
    names = ("id", "router", "scope", "month", "account", "granted", "issued", "charged")
    with store.read() as conn:  # found without locks, then checked again under them
        found = [dict(zip(names, row, strict=True)) for row in conn.execute(sa.select(*cols).where(stale))]
    if not found:
        return []
    ensure_rows(store, (Cut(f["scope"], f["month"], f["account"]) for f in found))
    closed: list[dict[str, Any]] = []
    with store.begin() as tx:
        lock_spend(store, tx, [(f["scope"], f["month"]) for f in found if f["scope"] is not None])
        lock_balances(store, tx, [f["account"] for f in found if f["account"] is not None])
        locked = (sa.select(*cols).where(leases.c.id.in_([f["id"] for f in found]), stale).order_by(leases.c.id))
        # Still open and still stale: a lease returned, or renewed by a router alive after all, is left alone.
        found = [dict(zip(names, row, strict=True)) for row in tx.execute(store.for_update(locked))]
        spend_back: dict[tuple[str, str], int] = {}
        balance_back: dict[str, int] = {}
        for lease in found:
            granted, issued = int(lease["granted"]), int(lease["issued"])
            back = granted - issued
            if lease["scope"] is not None:
                key = (lease["scope"], lease["month"])
                spend_back[key] = spend_back.get(key, 0) - back
            else:
                balance_back[lease["account"]] = balance_back.get(lease["account"], 0) + back
            tx.execute(sa.update(leases).where(leases.c.id == lease["id"]).values(state="reconciled", granted=issued))
            what = lease["scope"] or f"balance:{lease['account']}"
            record(tx, "reconciled", actor=by or lease["router"], status="executed",
                   detail={"lease": lease["id"], "router": lease["router"], "of": what, "month": lease["month"],
                           "granted": granted,
                           "issued": issued, "charged": int(lease["charged"]), "returned": back,
                           "reason": "a lease its router never returned: what it may have spent stays counted, "
                                     "the rest is given back"})
            closed.append({**lease, "returned": back})
        move_spend(store, tx, spend_back)
        move_balances(store, tx, balance_back)
    return closed


def outstanding(store: Store, at: float) -> list[dict[str, Any]]:
    """The open leases, each with what it holds and has not settled (`granted - charged`) and whether its
    router let it expire (it then counts as spent until it is reconciled)."""
    query = sa.select(leases.c.id, leases.c.router, leases.c.scope, leases.c.month, leases.c.account,
                      leases.c.granted, leases.c.charged, leases.c.expires_at).where(leases.c.state == "open")
    with store.read() as conn:
        return [{"id": lid, "router": router, "scope": scope, "month": month, "account": account,
                 "unsettled": max(0, int(granted) - int(charged)), "expired": float(expires) < at}
                for lid, router, scope, month, account, granted, charged, expires in conn.execute(query)]
