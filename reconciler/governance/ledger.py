"""The spend ledger: reserve a call's estimated cost against every cap and the balance, settle it after.

A reservation is one transaction: lock the spend rows of the org, profile and instance for this
calendar month (UTC) and the prepaid balance, in a fixed order; check them with the decision's own
guardrail rule (`decide.guardrail_block`); add the estimate. Settling moves the rows by the
difference to the actual cost (a refused or failed call is released: it costs nothing). Amounts are
integer micro-USD, so fifty calls at $0.005 make a $0.25 cap exactly. Called by the governor (inside
its admission transaction) and by `handler balance` / `handler spend`.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.governance.auditing import record
from reconciler.governance.decide import SpendState
from reconciler.governance.rulebook import CapSet
from reconciler.governance.store import Store, balances, now, reservations, spend

__all__ = [
    "Reservation",
    "add_balance",
    "budget_remaining",
    "current_month",
    "read_balance",
    "read_state",
    "reserve",
    "scopes_for",
    "settle",
    "spend_report",
]


def current_month(at: float | None = None) -> str:
    moment = datetime.now(UTC) if at is None else datetime.fromtimestamp(at, UTC)
    return moment.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class Reservation:
    id: str
    month: str
    scopes: tuple[str, ...]
    account: str | None
    reserved: int
    caps: CapSet
    profile: str
    instance: str


def scopes_for(caps: CapSet, profile: str, instance: str) -> tuple[str, str, str]:
    """The spend rows one call counts against: org, profile, instance (sorted = lock order)."""
    return (f"instance:{profile}/{instance}", f"org:{caps.org_name}", f"profile:{profile}")


def _lock_rows(store: Store, conn: Connection, scopes: tuple[str, ...], month: str, *, lock: bool) -> dict[str, int]:
    conn.execute(store.insert_ignore(spend), [{"scope": s, "month": month, "micros": 0} for s in scopes])
    query = sa.select(spend.c.scope, spend.c.micros).where(spend.c.month == month, spend.c.scope.in_(scopes))
    query = query.order_by(spend.c.scope)
    rows = conn.execute(store.for_update(query) if lock else query)
    return {scope: int(micros) for scope, micros in rows}


def _balance(store: Store, conn: Connection, account: str, *, lock: bool) -> int | None:
    query = sa.select(balances.c.micros).where(balances.c.account == account)
    value = conn.execute(store.for_update(query) if lock else query).scalar_one_or_none()
    return None if value is None else int(value)


def read_state(
    store: Store, conn: Connection, caps: CapSet, profile: str, instance: str, *, lock: bool, month: str | None = None
) -> SpendState:
    """The spend state a decision reads; with `lock`, the rows stay locked until the transaction ends."""
    month = month or current_month()
    scopes = scopes_for(caps, profile, instance)
    rows = _lock_rows(store, conn, scopes, month, lock=lock)
    balance = _balance(store, conn, caps.org_name, lock=lock) if caps.prepaid else None
    return SpendState(org=rows.get(scopes[1], 0), profile=rows.get(scopes[2], 0), instance=rows.get(scopes[0], 0),
                      balance=balance)


def reserve(
    store: Store, conn: Connection, caps: CapSet, profile: str, instance: str, cost: int, request_id: str | None,
    month: str | None = None,
) -> Reservation:
    """Add `cost` to every scope's row (already locked and checked by the caller) and record it."""
    month = month or current_month()
    scopes = scopes_for(caps, profile, instance)
    if cost:
        conn.execute(sa.update(spend).where(spend.c.month == month, spend.c.scope.in_(scopes))
                     .values(micros=spend.c.micros + cost))
    account = caps.org_name if caps.prepaid else None
    if account is not None and cost:
        conn.execute(sa.update(balances).where(balances.c.account == account).values(micros=balances.c.micros - cost))
    rid = "res_" + secrets.token_hex(8)
    conn.execute(sa.insert(reservations).values(id=rid, at=now(), request_id=request_id, month=month,
                                                scopes=list(scopes), account=account, reserved=cost, charged=None,
                                                state="reserved"))
    return Reservation(rid, month, scopes, account, cost, caps, profile, instance)


def settle(
    store: Store, reservation: Reservation, actual: int | None, ok: bool, request_id: str | None = None
) -> tuple[int, int | None]:
    """Settle to the actual cost (None: the estimate); a failed call is released. Returns (charged, remaining)."""
    charged = (reservation.reserved if actual is None else actual) if ok else 0
    delta = charged - reservation.reserved
    with store.begin() as conn:
        if delta:
            conn.execute(sa.update(spend).where(spend.c.month == reservation.month,
                                                spend.c.scope.in_(reservation.scopes))
                         .values(micros=spend.c.micros + delta))
            if reservation.account is not None:
                conn.execute(sa.update(balances).where(balances.c.account == reservation.account)
                             .values(micros=balances.c.micros - delta))
        conn.execute(sa.update(reservations).where(reservations.c.id == reservation.id)
                     .values(charged=charged, state="settled" if ok else "released"))
        record(conn, "settled" if ok else "released", request_id=request_id, profile=reservation.profile,
               instance=reservation.instance, status="executed" if ok else "failed",
               detail={"reserved": reservation.reserved, "charged": charged})
        state = read_state(store, conn, reservation.caps, reservation.profile, reservation.instance, lock=False,
                           month=reservation.month)
    return charged, budget_remaining(reservation.caps, state)


def budget_remaining(caps: CapSet, state: SpendState) -> int | None:
    """The least headroom over every cap and the balance; None when nothing limits spend."""
    room = [cap - spent for cap, spent in ((caps.org, state.org), (caps.profile, state.profile),
                                           (caps.instance, state.instance)) if cap is not None]
    if caps.prepaid:
        room.append(state.balance or 0)
    return max(0, min(room)) if room else None


def read_balance(store: Store, account: str) -> int | None:
    with store.engine.connect() as conn:
        value = conn.execute(sa.select(balances.c.micros).where(balances.c.account == account)).scalar_one_or_none()
    return None if value is None else int(value)


def add_balance(store: Store, account: str, micros: int, actor: str) -> int:
    """Top up (or, negative, correct) the prepaid balance; recorded in the audit trail. Returns the new balance."""
    with store.begin() as conn:
        conn.execute(store.insert_ignore(balances), [{"account": account, "micros": 0}])
        conn.execute(sa.update(balances).where(balances.c.account == account)
                     .values(micros=balances.c.micros + micros))
        value = int(conn.execute(sa.select(balances.c.micros).where(balances.c.account == account)).scalar_one())
        record(conn, "balance", actor=actor, detail={"account": account, "added": micros, "balance": value})
    return value


def spend_report(store: Store, month: str | None = None) -> list[dict[str, Any]]:
    """Spend per scope for one month (default: this one), largest first."""
    month = month or current_month()
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(spend.c.scope, spend.c.micros).where(spend.c.month == month)
                            .order_by(spend.c.micros.desc(), spend.c.scope))
        return [{"scope": scope, "month": month, "micros": int(micros)} for scope, micros in rows]
