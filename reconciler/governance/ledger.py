"""The spend ledger: reserve a call's estimated cost against every cap and the balance, settle it after.

A reservation is one transaction: lock the spend rows of the org, profile and instance for this
calendar month (UTC) and the prepaid balance, in a fixed order; check them with the decision's own
guardrail rule (`decide.guardrail_block`); add the estimate. Settling moves the rows by the
difference to the actual cost (a refused or failed call is released: it costs nothing). Amounts are
integer micro-USD, so fifty calls at $0.005 make a $0.25 cap exactly. Called by the governor (inside
its admission transaction) and by `handler balance` / `handler spend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.governance.auditing import record
from reconciler.governance.decide import SpendState
from reconciler.governance.holds import new_request_id
from reconciler.governance.rulebook import CapSet
from reconciler.governance.store import Store, balances, now, reservations, spend

__all__ = [
    "Reservation",
    "add_balance",
    "budget_remaining",
    "current_month",
    "ensure_rows",
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
    remaining: int | None  # the budget left once this reservation was made


def scopes_for(caps: CapSet, profile: str, instance: str) -> tuple[str, str, str]:
    """The spend rows one call counts against: instance, org, profile (sorted = the lock order)."""
    return (f"instance:{profile}/{instance}", f"org:{caps.org_name}", f"profile:{profile}")


class _Statements:
    """The ledger's statements, built once per store: SQLAlchemy then reuses their compiled form."""

    def __init__(self, store: Store) -> None:
        bp = sa.bindparam
        # Always three scopes (see `scopes_for`): three plain parameters compile once, an expanding IN per call.
        three: list[sa.BindParameter[str]] = [bp("p_s0"), bp("p_s1"), bp("p_s2")]
        rows = (sa.select(spend.c.scope, spend.c.micros)
                .where(spend.c.month == bp("p_month"), spend.c.scope.in_(three))
                .order_by(spend.c.scope))
        self.ensure_rows = store.insert_ignore(spend)
        self.rows, self.rows_locked = rows, store.for_update(rows)
        balance = sa.select(balances.c.micros).where(balances.c.account == bp("p_account"))
        self.balance, self.balance_locked = balance, store.for_update(balance)
        self.add_spend = (sa.update(spend)
                          .where(spend.c.month == bp("p_month"), spend.c.scope.in_(three))
                          .values(micros=spend.c.micros + bp("p_cost")))
        self.take_balance = (sa.update(balances).where(balances.c.account == bp("p_account"))
                             .values(micros=balances.c.micros - bp("p_cost")))
        self.insert_reservation = sa.insert(reservations)
        self.close_reservation = (sa.update(reservations).where(reservations.c.id == bp("p_id"))
                                  .values(charged=bp("p_charged"), state=bp("p_state")))
        self.known: set[tuple[str, str]] = set()  # spend rows committed: (scope, month)


def _params(month: str, scopes: tuple[str, ...]) -> dict[str, str]:
    return {"p_month": month, "p_s0": scopes[0], "p_s1": scopes[1], "p_s2": scopes[2]}


def _statements(store: Store) -> _Statements:
    found = store.extras.get("ledger")
    if not isinstance(found, _Statements):
        found = store.extras["ledger"] = _Statements(store)
    return found


def ensure_rows(store: Store, caps: CapSet, profile: str, instance: str, month: str) -> None:
    """Create the call's spend rows for `month`, in a transaction of their own, before any lock is taken.

    Creating them inside the locking transaction could deadlock on PostgreSQL (one transaction holds
    the org row and waits for another's new instance row, which waits for the org row). Once
    committed they exist for good, so each process remembers the rows it has seen.
    """
    scopes = scopes_for(caps, profile, instance)
    st = _statements(store)
    if all((s, month) in st.known for s in scopes):
        return
    with store.begin() as conn:
        conn.execute(st.ensure_rows, [{"scope": s, "month": month, "micros": 0} for s in scopes])
    st.known.update((s, month) for s in scopes)


def read_state(
    store: Store, conn: Connection, caps: CapSet, profile: str, instance: str, *, lock: bool, month: str | None = None
) -> SpendState:
    """The spend state a decision reads; with `lock`, the rows stay locked until the transaction ends."""
    month = month or current_month()
    scopes = scopes_for(caps, profile, instance)
    st = _statements(store)
    query, params = st.rows_locked if lock else st.rows, _params(month, scopes)
    found = {scope: int(micros) for scope, micros in conn.execute(query, params)}
    if len(found) < len(scopes):  # the first call of a scope this month: make its rows, then read them
        conn.execute(st.ensure_rows, [{"scope": s, "month": month, "micros": 0} for s in scopes])
        found = {scope: int(micros) for scope, micros in conn.execute(query, params)}
    balance = None
    if caps.prepaid:
        value = conn.execute(st.balance_locked if lock else st.balance, {"p_account": caps.org_name}).scalar()
        balance = None if value is None else int(value)
    return SpendState(org=found.get(scopes[1], 0), profile=found.get(scopes[2], 0), instance=found.get(scopes[0], 0),
                      balance=balance)


def reserve(
    store: Store, conn: Connection, caps: CapSet, profile: str, instance: str, cost: int, request_id: str | None,
    state: SpendState, month: str | None = None, defer: Callable[[dict[str, Any]], None] | None = None,
) -> Reservation:
    """Add `cost` to every scope's row (read, locked and checked as `state` by the caller) and record it.

    The spend rows are what caps are checked against; the reservation row only records the call, so
    a caller may `defer` writing it (the governor's backlog) to keep the locks short.
    """
    month = month or current_month()
    scopes = scopes_for(caps, profile, instance)
    st = _statements(store)
    if cost:
        conn.execute(st.add_spend, {**_params(month, scopes), "p_cost": cost})
    account = caps.org_name if caps.prepaid else None
    if account is not None and cost:
        conn.execute(st.take_balance, {"p_account": account, "p_cost": cost})
    rid = "res_" + new_request_id()[4:]
    row = {"id": rid, "at": now(), "request_id": request_id, "month": month, "scopes": list(scopes),
           "account": account, "reserved": cost, "charged": None, "state": "reserved"}
    if defer is not None:
        defer(row)
    else:
        conn.execute(st.insert_reservation, row)
    after = SpendState(state.org + cost, state.profile + cost, state.instance + cost,
                       None if state.balance is None else state.balance - cost)
    return Reservation(rid, month, scopes, account, cost, caps, profile, instance, budget_remaining(caps, after))


def settle(
    store: Store, reservation: Reservation, actual: int | None, ok: bool, request_id: str | None = None
) -> tuple[int, int | None]:
    """Settle to the actual cost (None: the estimate); a failed call is released. Returns (charged, remaining).

    The remaining budget is the one seen when the call was reserved, moved by the difference: calls
    settling at the same time on other routers are not counted in it.
    """
    charged = (reservation.reserved if actual is None else actual) if ok else 0
    delta = charged - reservation.reserved
    st = _statements(store)
    with store.begin() as conn:
        if delta:
            conn.execute(st.add_spend, {**_params(reservation.month, reservation.scopes), "p_cost": delta})
            if reservation.account is not None:
                conn.execute(st.take_balance, {"p_account": reservation.account, "p_cost": delta})
        conn.execute(st.close_reservation, {"p_id": reservation.id, "p_charged": charged,
                                            "p_state": "settled" if ok else "released"})
        record(conn, "settled" if ok else "released", request_id=request_id, profile=reservation.profile,
               instance=reservation.instance, status="executed" if ok else "failed",
               detail={"reserved": reservation.reserved, "charged": charged})
    remaining = None if reservation.remaining is None else max(0, reservation.remaining - delta)
    return charged, remaining


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
