"""The rows of held calls: insert, read, and each state change as one conditional UPDATE.

Every change is `UPDATE … WHERE id = … AND state = <expected>`, so when two routers, or a router and
the CLI, race on the same hold exactly one wins; the caller learns which from the returned bool.
Rows come back as dicts; `governance.holds` makes them `Hold`s and writes the audit rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.engine import Store, Transaction, now, storable
from reconciler.governance.store.tables import holds

__all__ = [
    "approved_ids",
    "count_holds",
    "fetch_hold",
    "fetch_holds",
    "fetch_recent_decisions",
    "insert_hold",
    "set_claimed",
    "set_decided",
    "set_finished",
]


def insert_hold(tx: Transaction, values: Mapping[str, Any]) -> None:
    """Store a new pending hold inside the caller's transaction (the one that decided it)."""
    tx.execute(sa.insert(holds).values(created_at=now(), state="pending", message="", **values))


def fetch_hold(store: Store, hold_id: str) -> dict[str, Any] | None:
    with store.read() as conn:
        row = conn.execute(sa.select(holds).where(holds.c.id == hold_id)).first()
    return None if row is None else dict(row._mapping)


def fetch_holds(store: Store, states: Sequence[str], limit: int | None) -> list[dict[str, Any]]:
    """Holds in these states (all when empty), oldest first; `limit` None: all of them."""
    query = sa.select(holds).order_by(holds.c.created_at).limit(limit)
    if states:
        query = query.where(holds.c.state.in_(states))
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def fetch_recent_decisions(store: Store, limit: int) -> list[dict[str, Any]]:
    """The holds decided most recently, newest first."""
    query = sa.select(holds).where(holds.c.state != "pending").order_by(holds.c.decided_at.desc()).limit(limit)
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def count_holds(store: Store, states: Sequence[str]) -> int:
    """How many holds are in these states (all when empty)."""
    query = sa.select(sa.func.count()).select_from(holds)
    if states:
        query = query.where(holds.c.state.in_(states))
    with store.read() as conn:
        found = conn.execute(query).scalar()
    return int(found or 0)


def approved_ids(store: Store, limit: int) -> list[str]:
    """Approved holds not yet claimed, in the order they were approved."""
    with store.read() as conn:
        rows = conn.execute(sa.select(holds.c.id).where(holds.c.state == "approved")
                            .order_by(holds.c.decided_at).limit(limit))
        return [r[0] for r in rows]


def set_decided(tx: Transaction, hold_id: str, state: str, actor: str, message: str,
                reason: str | None = None) -> bool:
    """pending → approved | rejected, with the decider's reason if they gave one; False when the hold
    was no longer pending."""
    done = tx.execute(sa.update(holds).where(holds.c.id == hold_id, holds.c.state == "pending")
                      .values(state=state, decided_by=actor, decided_at=now(), message=storable(message),
                              decision_reason=storable(reason)))
    return done.rowcount == 1


def set_claimed(tx: Transaction, hold_id: str, runner: str) -> bool:
    """approved → running, taken by `runner`; False when another runner (or an earlier run) had it."""
    done = tx.execute(sa.update(holds).where(holds.c.id == hold_id, holds.c.state == "approved")
                      .values(state="running", claimed_by=runner, claimed_at=now()))
    return done.rowcount == 1


def set_finished(tx: Transaction, hold_id: str, state: str, result: Mapping[str, Any] | None, message: str,
                 charged: int | None, cause: str | None = None) -> bool:
    """running → executed | failed, with the result or the reason (and, failed, its cause) and what it cost; False
    when it was no longer running (finished already)."""
    done = tx.execute(sa.update(holds).where(holds.c.id == hold_id, holds.c.state == "running")
                      .values(state=state, finished_at=now(), result=dict(result) if result is not None else None,
                              message=storable(message), charged=charged, cause=storable(cause)))
    return done.rowcount == 1
