"""The rows of the notices outbox: queued with their hold, claimed once, then sent, retried or closed.

Claiming is one conditional UPDATE per notice (`WHERE state = <seen>`), so of several notifiers
exactly one takes a notice. Rows come back as dicts; `governance.notices` makes them `Notice`s and
decides the states and delays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.engine import Store, Transaction, now
from reconciler.governance.store.tables import holds, notices

__all__ = ["claim_decided", "claim_due", "fetch_notices", "fetch_troubled", "insert_notices", "mark_unsent",
           "update_notice"]


def insert_notices(tx: Transaction, values: Sequence[Mapping[str, Any]]) -> None:
    """Queue notices (pending, due now, unless a value says `unsent`) inside the caller's transaction (the one
    that inserts the hold)."""
    at = now()
    tx.execute(sa.insert(notices), [{"state": "pending", "error": None, "attempts": 0, "next_at": at, **v}
                                    for v in values])


def _claim(store: Store, candidates: Sequence[tuple[int, str]], state: str,
           **values: Any) -> list[dict[str, Any]]:
    """Move each (id, seen state) candidate to `state`; the rows this caller won."""
    claimed = []
    for notice_id, seen in candidates:
        with store.begin() as tx:
            done = tx.execute(sa.update(notices).where(notices.c.id == notice_id, notices.c.state == seen)
                              .values(state=state, **values))
            if done.rowcount == 1:
                row = tx.execute(sa.select(notices).where(notices.c.id == notice_id)).one()
                claimed.append(dict(row._mapping))
    return claimed


def claim_due(store: Store, channels: Sequence[str], stale_seconds: float, limit: int) -> list[dict[str, Any]]:
    """Take up to `limit` notices due now on these channels: pending, sending for over `stale_seconds`, or
    unsent (by a service without the channel) while their hold still waits."""
    at = now()
    waiting = sa.select(holds.c.id).where(holds.c.state == "pending")
    due = sa.or_(sa.and_(notices.c.state == "pending", notices.c.next_at <= at),
                 sa.and_(notices.c.state == "sending", notices.c.claimed_at < at - stale_seconds),
                 sa.and_(notices.c.state == "unsent", notices.c.hold_id.in_(waiting)))
    with store.read() as conn:
        candidates = [(r.id, r.state) for r in conn.execute(
            sa.select(notices.c.id, notices.c.state).where(due, notices.c.channel.in_(channels))
            .order_by(notices.c.next_at).limit(limit))]
    return _claim(store, candidates, "sending", claimed_at=at)


def claim_decided(store: Store, channel: str, limit: int) -> list[dict[str, Any]]:
    """Take sent notices of holds decided since; each is `closed` as it is taken, so it is taken once."""
    decided = sa.select(holds.c.id).where(holds.c.state != "pending")
    with store.read() as conn:
        ids = [r.id for r in conn.execute(
            sa.select(notices.c.id).where(notices.c.channel == channel, notices.c.state == "sent",
                                          notices.c.hold_id.in_(decided)).limit(limit))]
    return _claim(store, [(i, "sent") for i in ids], "closed")


def mark_unsent(store: Store, channel: str, why: str) -> int:
    """Notices on `channel` queued and never tried: `unsent`, with `why`; how many."""
    with store.begin() as tx:
        done = tx.execute(sa.update(notices).where(notices.c.channel == channel, notices.c.state == "pending",
                                                   notices.c.attempts == 0, notices.c.error.is_(None))
                          .values(state="unsent", error=why))
    return int(done.rowcount)


def update_notice(store: Store, notice_id: int, **values: Any) -> None:
    """Set these columns of one notice (its state after an attempt)."""
    with store.begin() as tx:
        tx.execute(sa.update(notices).where(notices.c.id == notice_id).values(**values))


def fetch_troubled(store: Store, limit: int) -> list[dict[str, Any]]:
    """Notices not sent, failed for good, or whose last attempt failed, newest first."""
    query = (sa.select(notices).where(sa.or_(notices.c.state.in_(("failed", "unsent")),
                                             sa.and_(notices.c.state == "pending", notices.c.error.is_not(None))))
             .order_by(notices.c.id.desc()).limit(limit))
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]


def fetch_notices(store: Store, hold_id: str | None, states: Sequence[str]) -> list[dict[str, Any]]:
    query = sa.select(notices).order_by(notices.c.id)
    if hold_id is not None:
        query = query.where(notices.c.hold_id == hold_id)
    if states:
        query = query.where(notices.c.state.in_(states))
    with store.read() as conn:
        return [dict(r._mapping) for r in conn.execute(query)]
