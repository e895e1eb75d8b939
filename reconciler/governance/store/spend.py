"""The rows of spend: per scope and month, the prepaid balances, and a reservation per call reserved on its own.

The statements the admission path runs are built once per store (`_Statements`), so SQLAlchemy
reuses their compiled form. A call always counts against three scopes (instance, org, profile:
`ledger.scopes_for`), sorted, which is also the order their rows are locked in on PostgreSQL.
`governance.ledger` decides what to add; this module only reads and writes the rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.governance.store.audit import record
from reconciler.governance.store.engine import Store, Transaction
from reconciler.governance.store.tables import balances, reservations, spend

__all__ = [
    "KNOWN_ROWS",
    "add_balance",
    "add_spend",
    "charge_stale_reservations",
    "close_reservation",
    "ensure_spend_rows",
    "insert_reservation",
    "read_balance",
    "read_balance_in",
    "read_spend",
    "spend_report",
    "take_balance",
]

KNOWN_ROWS = 100_000  # spend rows a process remembers it made (`ensure_spend_rows`), about 15 MB at most


class _Statements:
    """The statements of the admission path, built once per store."""

    def __init__(self, store: Store) -> None:
        bp = sa.bindparam
        # Always three scopes: three plain parameters compile once, an expanding IN per call.
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


def _statements(store: Store) -> _Statements:
    return store.statements(_Statements)


def _params(month: str, scopes: Sequence[str]) -> dict[str, str]:
    return {"p_month": month, "p_s0": scopes[0], "p_s1": scopes[1], "p_s2": scopes[2]}


def _zero_rows(scopes: Sequence[str], month: str) -> list[dict[str, Any]]:
    return [{"scope": s, "month": month, "micros": 0} for s in scopes]


def ensure_spend_rows(store: Store, scopes: Sequence[str], month: str) -> None:
    """Create the scopes' rows for `month` in a transaction of their own, before any lock is taken.

    Creating them inside the locking transaction could deadlock on PostgreSQL (one transaction holds
    the org row and waits for another's new instance row, which waits for the org row). Once
    committed they exist for good, so each process remembers the rows it has seen: the latest
    `KNOWN_ROWS` of them (an agent names its run, and a client may name a new one on every call; a row
    forgotten is only made again, which changes nothing).
    """
    st = _statements(store)
    if all((s, month) in st.known for s in scopes):
        return
    with store.begin() as tx:
        tx.execute(st.ensure_rows, _zero_rows(scopes, month))
    if len(st.known) >= KNOWN_ROWS:
        st.known.clear()
    st.known.update((s, month) for s in scopes)


def read_spend(store: Store, tx: Transaction, scopes: Sequence[str], month: str, *, lock: bool) -> dict[str, int]:
    """Each scope's spend this month; with `lock`, the rows stay locked until the transaction ends."""
    st = _statements(store)
    query, params = st.rows_locked if lock else st.rows, _params(month, scopes)
    found = {scope: int(micros) for scope, micros in tx.execute(query, params)}
    if len(found) < len(scopes):  # the first call of a scope this month: make its rows, then read them
        tx.execute(st.ensure_rows, _zero_rows(scopes, month))
        found = {scope: int(micros) for scope, micros in tx.execute(query, params)}
    return found


def read_balance_in(store: Store, tx: Transaction, account: str, *, lock: bool) -> int | None:
    """The prepaid balance, read in the caller's transaction; with `lock`, its row stays locked."""
    st = _statements(store)
    value = tx.execute(st.balance_locked if lock else st.balance, {"p_account": account}).scalar()
    return None if value is None else int(value)


def add_spend(store: Store, tx: Transaction, scopes: Sequence[str], month: str, micros: int) -> None:
    tx.execute(_statements(store).add_spend, {**_params(month, scopes), "p_cost": micros})


def take_balance(store: Store, tx: Transaction, account: str, micros: int) -> None:
    tx.execute(_statements(store).take_balance, {"p_account": account, "p_cost": micros})


def insert_reservation(store: Store, tx: Transaction, row: Mapping[str, Any]) -> None:
    tx.execute(_statements(store).insert_reservation, dict(row))


def close_reservation(store: Store, tx: Transaction, reservation_id: str, charged: int, state: str) -> None:
    """A reservation settled (`settled`) or released (`released`) at `charged` micros."""
    tx.execute(_statements(store).close_reservation, {"p_id": reservation_id, "p_charged": charged, "p_state": state})


def charge_stale_reservations(store: Store, before: float) -> list[dict[str, Any]]:
    """Close the reservations still open that were made before `before`, charged what they reserved.

    Their spend rows already count the reservation, so nothing else moves; each is recorded in the
    audit trail (`reconciled`). Returns what was closed (id, request id, reserved).
    """
    stale = sa.select(reservations.c.id, reservations.c.request_id, reservations.c.reserved).where(
        reservations.c.state == "reserved", reservations.c.at < before)
    with store.begin() as tx:
        found = [{"id": i, "request_id": r, "reserved": int(m)} for i, r, m in tx.execute(stale)]
        if found:
            tx.execute(sa.update(reservations).where(reservations.c.id.in_([f["id"] for f in found]),
                                                     reservations.c.state == "reserved")
                       .values(charged=reservations.c.reserved, state="settled"))
        for row in found:
            record(tx, "reconciled", request_id=row["request_id"], status="executed",
                   detail={"reservation": row["id"], "reserved": row["reserved"], "charged": row["reserved"],
                           "reason": "never settled (the router stopped): charged what it reserved"})
    return found


def read_balance(store: Store, account: str) -> int | None:
    with store.read() as conn:
        value = conn.execute(sa.select(balances.c.micros).where(balances.c.account == account)).scalar_one_or_none()
    return None if value is None else int(value)


def add_balance(store: Store, account: str, micros: int, actor: str) -> int:
    """Top up (or, negative, correct) the balance, recorded in the audit trail; returns the new balance."""
    with store.begin() as tx:
        tx.execute(store.insert_ignore(balances), [{"account": account, "micros": 0}])
        tx.execute(sa.update(balances).where(balances.c.account == account).values(micros=balances.c.micros + micros))
        value = int(tx.execute(sa.select(balances.c.micros).where(balances.c.account == account)).scalar_one())
        record(tx, "balance", actor=actor, detail={"account": account, "added": micros, "balance": value})
    return value


def spend_report(store: Store, month: str) -> list[dict[str, Any]]:
    """Spend per scope for one month, largest first."""
    with store.read() as conn:
        rows = conn.execute(sa.select(spend.c.scope, spend.c.micros).where(spend.c.month == month)
                            .order_by(spend.c.micros.desc(), spend.c.scope))
        return [{"scope": scope, "month": month, "micros": int(micros)} for scope, micros in rows]
