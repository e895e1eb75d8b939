"""The spend ledger: reserve the most a call may cost against every cap and the balance, settle it after.

A reservation is one transaction: lock the spend rows of the org, profile and instance for this
calendar month (UTC) and the prepaid balance, in a fixed order; check them with the decision's own
guardrail rule (`decide.guardrail_block`); add the binding's price, the most the call may cost.
Settling moves the rows down by the difference to the reported cost, never up: a report above the
reservation is charged the reservation (`charging`); a refused or failed call is released. Amounts are
integer micro-USD, so fifty calls at $0.005 make a $0.25 cap exactly. Called for calls reserved one
by one — the gate's `admit_now` (inside its admission transaction) and the hold runner — and by
`handler balance` / `handler spend`; the gate admits the calls of the event loop against budget
leases instead (`leases`), which this module's report shows. The rows themselves are the store's
(`store.spend`, `store.leases`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from reconciler.governance.charging import PricedCall, charge_call
from reconciler.governance.decide import SpendState
from reconciler.governance.gate import Admission, Settlement
from reconciler.governance.holds import STRANDED_AFTER_SECONDS, new_request_id
from reconciler.governance.rulebook import CapSet, from_micros, to_micros
from reconciler.governance.store import Store, Transaction, now
from reconciler.governance.store import leases as lease_rows
from reconciler.governance.store import spend as rows
from reconciler.governance.store.audit import AuditRow, audit_row, insert_audit

__all__ = [
    "Reservation",
    "add_balance",
    "budget_remaining",
    "current_month",
    "ensure_rows",
    "leased_balance",
    "month_span",
    "read_balance",
    "read_state",
    "reconcile_reservations",
    "reserve",
    "scopes_for",
    "settle",
    "settlement_row",
    "spend_report",
]


# A reservation older than this at start is taken for one its router never settled: the router's
# default call timeout (docs/architecture.md §6), after which a running hold is said to be stranded too.
RECONCILE_AFTER_SECONDS = STRANDED_AFTER_SECONDS


def current_month(at: float | None = None) -> str:
    """The calendar month (UTC) of `at`, default now, as "YYYY-MM"; now's is kept until the month ends."""
    return month_span(at)[0]


def month_span(at: float | None = None) -> tuple[str, float]:
    """The calendar month (UTC) of `at`, default now, and when it ends (a timestamp); now's is kept until then."""
    moment = time.time() if at is None else at
    month, start, end = _month[0]
    if start <= moment < end:
        return month, end
    day = datetime.fromtimestamp(moment, UTC)
    first = datetime(day.year, day.month, 1, tzinfo=UTC)
    following = datetime(day.year + day.month // 12, day.month % 12 + 1, 1, tzinfo=UTC)
    month = day.strftime("%Y-%m")
    if at is None:
        _month[0] = (month, first.timestamp(), following.timestamp())
    return month, following.timestamp()


_month: list[tuple[str, float, float]] = [("", 0.0, 0.0)]  # the month of the last `current_month()`, its bounds


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


def ensure_rows(store: Store, caps: CapSet, profile: str, instance: str, month: str) -> None:
    """Create the call's spend rows for `month` before any lock is taken (see `store.spend.ensure_spend_rows`)."""
    rows.ensure_spend_rows(store, scopes_for(caps, profile, instance), month)


def read_state(
    store: Store, tx: Transaction, caps: CapSet, profile: str, instance: str, *, lock: bool, month: str | None = None
) -> SpendState:
    """The spend state a decision reads; with `lock`, the rows stay locked until the transaction ends."""
    scopes = scopes_for(caps, profile, instance)
    found = rows.read_spend(store, tx, scopes, month or current_month(), lock=lock)
    balance = rows.read_balance_in(store, tx, caps.org_name, lock=lock) if caps.prepaid else None
    return SpendState(org=found.get(scopes[1], 0), profile=found.get(scopes[2], 0), instance=found.get(scopes[0], 0),
                      balance=balance)


def reserve(
    store: Store, tx: Transaction, caps: CapSet, profile: str, instance: str, cost: int, request_id: str | None,
    state: SpendState, month: str | None = None, defer: Callable[[dict[str, Any]], None] | None = None,
) -> Reservation:
    """Add `cost` to every scope's row (read, locked and checked as `state` by the caller) and record it.

    The spend rows are what caps are checked against; the reservation row only records the call, so
    a caller may `defer` writing it (the gate's backlog) to keep the locks short.
    """
    month = month or current_month()
    scopes = scopes_for(caps, profile, instance)
    if cost:
        rows.add_spend(store, tx, scopes, month, cost)
    account = caps.org_name if caps.prepaid else None
    if account is not None and cost:
        rows.take_balance(store, tx, account, cost)
    rid = "res_" + new_request_id()[4:]
    row = {"id": rid, "at": now(), "request_id": request_id, "month": month, "scopes": list(scopes),
           "account": account, "reserved": cost, "charged": None, "state": "reserved"}
    if defer is not None:
        defer(row)
    else:
        rows.insert_reservation(store, tx, row)
    after = SpendState(state.org + cost, state.profile + cost, state.instance + cost,
                       None if state.balance is None else state.balance - cost)
    return Reservation(rid, month, scopes, account, cost, caps, profile, instance, budget_remaining(caps, after))


@dataclass(frozen=True, slots=True)
class HeldTicket:
    """The ticket of an approved hold, reserved again when it runs (`holdrunner`): it settles in one store
    transaction (`settle`), so it is settled off the event loop (`gate.Ticket`, whose admission it does not need)."""

    store: Store
    reservation: Reservation
    request_id: str
    binding: str
    tool: str

    def settle(self, admission: Admission | None, actual_cost: float | None, ok: bool) -> Settlement:
        reported = None if actual_cost is None else to_micros(actual_cost)
        charged, remaining = settle(self.store, self.reservation, reported, ok, self.request_id, binding=self.binding,
                                    tool=self.tool)
        return Settlement(from_micros(charged), None if remaining is None else from_micros(remaining))


def settle(
    store: Store, reservation: Reservation, reported: int | None, ok: bool, request_id: str | None = None, *,
    binding: str = "", tool: str = "",
) -> tuple[int, int | None]:
    """Settle at the reported cost, never above the reservation (`charging.charge_call`); a failed call is
    released. Returns (charged, remaining).

    The remaining budget is the one seen when the call was reserved, moved by the difference: calls
    settling at the same time on other routers are not counted in it. A report above the reservation
    is recorded as a pricing violation in the same transaction.
    """
    who = PricedCall(request_id, reservation.profile, reservation.instance, binding, tool)
    charge = charge_call(who, reservation.reserved, reported, ok)
    delta = charge.charged - reservation.reserved
    with store.begin() as tx:
        if delta:
            rows.add_spend(store, tx, reservation.scopes, reservation.month, delta)
            if reservation.account is not None:
                rows.take_balance(store, tx, reservation.account, delta)
        rows.close_reservation(store, tx, reservation.id, charge.charged, "settled" if ok else "released")
        insert_audit(tx, settlement_row(request_id, reservation.profile, reservation.instance, ok,
                                        reservation.reserved, charge.charged))
        if charge.violation is not None:
            insert_audit(tx, charge.violation)
    remaining = None if reservation.remaining is None else max(0, reservation.remaining - delta)
    return charge.charged, remaining


def reconcile_reservations(store: Store, older_than: float = RECONCILE_AFTER_SECONDS) -> int:
    """Charge what they reserved the reservations a stopped router never settled (a `kill -9`); how many.

    Until then they count as spent at their reservation, the most the call could cost, so spend never
    under-counts. One still running on another router is settled later all the same: its settlement
    moves spend by the difference to its charge, whatever this wrote.
    """
    return len(rows.charge_stale_reservations(store, now() - older_than))


def settlement_row(request_id: str | None, profile: str, instance: str, ok: bool, reserved: int,
                   charged: int) -> AuditRow:
    """The audit row of a settled call (`settled`) or a released one (`released`: it failed)."""
    detail = f'{{"reserved":{int(reserved)},"charged":{int(charged)}}}'  # two integers: no encoder needed
    return audit_row("settled" if ok else "released", request_id=request_id, profile=profile, instance=instance,
                     status="executed" if ok else "failed", detail=detail)


def budget_remaining(caps: CapSet, state: SpendState) -> int | None:
    """The least headroom over every cap and the balance; None when nothing limits spend."""
    room = [cap - spent for cap, spent in ((caps.org, state.org), (caps.profile, state.profile),
                                           (caps.instance, state.instance)) if cap is not None]
    if caps.prepaid:
        room.append(state.balance or 0)
    return max(0, min(room)) if room else None


def read_balance(store: Store, account: str) -> int | None:
    return rows.read_balance(store, account)


def add_balance(store: Store, account: str, micros: int, actor: str) -> int:
    """Top up (or, negative, correct) the prepaid balance; recorded in the audit trail. Returns the new balance."""
    return rows.add_balance(store, account, micros, actor)


def spend_report(store: Store, month: str | None = None) -> list[dict[str, Any]]:
    """Spend per scope for one month (default: this one), largest first.

    A scope's `micros` is what is counted against its cap: what settled, what running calls may cost,
    and the budget leases routers hold on it. Of that, `leased` is what live routers' leases hold and
    their calls have not settled yet (it may still come back), and `stale` what leases of routers that
    stopped without returning them hold: counted as spent until they are reconciled.
    """
    month = month or current_month()
    held: dict[str, dict[str, int]] = {}
    for lease in lease_rows.outstanding(store, now()):
        if lease["scope"] is not None and lease["month"] == month:
            sums = held.setdefault(lease["scope"], {"leased": 0, "stale": 0})
            sums["stale" if lease["expired"] else "leased"] += lease["unsettled"]
    return [{**row, **held.get(row["scope"], {"leased": 0, "stale": 0})}
            for row in rows.spend_report(store, month)]


def leased_balance(store: Store, account: str) -> dict[str, int]:
    """What budget leases hold of the prepaid balance and have not settled: live routers' (`leased`, it may
    come back) and stopped routers' (`stale`, spent until reconciled)."""
    sums = {"leased": 0, "stale": 0}
    for lease in lease_rows.outstanding(store, now()):
        if lease["account"] == account:
            sums["stale" if lease["expired"] else "leased"] += lease["unsettled"]
    return sums
