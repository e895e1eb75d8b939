"""Writes that no decision waits for, gathered and committed together a moment later.

A call that nothing limits — no cap on its org, profile or instance, no prepaid balance — is
decided from config alone, so the router need not wait for the store: its audit rows and its spend
(for `handler spend`: its charge, when it is settled) go into
this backlog, which the gate commits a moment later (every `batch_seconds`) in one transaction,
again and again until it is empty. Settling a reserved call goes here too: the reservation already
counted the most the call may cost, so a late settlement only keeps a refund (a failed call, a lower
reported cost) waiting a moment — it errs on the side of the cap. The spend rows a decision reads
are written synchronously. A commit that fails puts its rows back for the next one. On a `kill -9`,
the rows of the last moment are lost: for a reserved call only its refund (spend over-counts, never
under); for a call nothing limits, its record and spend of that moment.

A commit the store refuses for its data (`StoreRefusedError`: a value too long, out of range) would
fail again at every retry, and hold up everything behind it for good. So the flush then writes its
rows one by one, each in a savepoint of one transaction, and sets aside each row the store refuses:
it goes into the audit trail as a `set_aside` event carrying the row and the store's reason, and
everything else is committed (docs/architecture.md §7).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import sqlalchemy as sa

from reconciler.governance.errors import StoreRefusedError
from reconciler.governance.store.audit import AuditRow, audit_row, insert_audit
from reconciler.governance.store.engine import Store, Transaction, failure_reason, marker, refused_by_store
from reconciler.governance.store.tables import balances, reservations

__all__ = ["SET_ASIDE", "Backlog", "spend_statements"]

log = logging.getLogger("handler.governance")

SET_ASIDE = "set_aside"  # the audit event of a row the store refused (`Backlog.flush`)
_AUDIT_COLUMNS = ("at", "event", "request_id", "profile", "instance", "tool", "actor", "status", "detail")

_CLOSE = (sa.update(reservations).where(reservations.c.id == sa.bindparam("p_id"))
          .values(charged=sa.bindparam("p_charged"), state=sa.bindparam("p_state")))


class Backlog:
    """Audit rows and spend additions waiting to be committed; safe to add to from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # One commit at a time: a flush returns once everything added before it is committed, even
        # when another thread took those rows a moment earlier and is committing them still.
        self._committing = threading.Lock()
        self._audit: list[AuditRow] = []
        self._spend: dict[tuple[str, str], int] = {}
        self._charges: list[tuple[tuple[str, ...], str, int]] = []  # `add_spend`'s, summed into `_spend` at flush
        self._balances: dict[str, int] = {}
        self._settled: list[dict[str, Any]] = []
        self._reserved: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self._audit) + len(self._spend) + len(self._charges) + len(self._settled) + len(self._reserved)

    def add_audit(self, row: AuditRow) -> None:
        """An audit row built by `audit.audit_row` (kept as it is: the caller hands it over)."""
        with self._lock:
            self._audit.append(row)

    def add_rows(self, rows: list[AuditRow], charges: list[tuple[tuple[str, ...], str, int]]) -> None:
        """Audit rows (built by `audit.audit_row`) and spend as `add_spend` takes it, many at once."""
        with self._lock:
            self._audit.extend(rows)
            self._charges.extend(charges)

    def add_spend(self, scopes: tuple[str, ...], month: str, micros: int) -> None:
        """`micros` more spent on each of `scopes` this month (summed per scope when flushed, off the call's path)."""
        if micros:
            with self._lock:
                self._charges.append((scopes, month, micros))

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
        """Commit what is waiting in one transaction; returns how many rows and sums it wrote.

        When the store fails, what was taken is put back for the next flush and the failure raised:
        a settlement is late then, never lost. When it refuses the data, the rows are written one by one and
        those it refuses set aside (see the module's docstring).
        """
        with self._committing:
            with self._lock:
                charges, self._charges = self._charges, []
                taken = _Taken(self._audit, self._spend, self._settled, self._balances, self._reserved)
                self._audit, self._spend, self._settled, self._balances, self._reserved = [], {}, [], {}, []
            _sum_charges(taken.spend, charges)
            if not taken.count():
                return 0
            try:
                try:
                    with store.begin() as tx:
                        _write(store, tx, taken)
                except StoreRefusedError as exc:
                    log.warning("%s; writing the %d rows of this commit one by one", str(exc), taken.count())
                    with store.begin() as tx:
                        refused = _write_apart(store, tx, taken)
                    _report_set_aside(refused)
            except BaseException:
                self.put_back(taken)
                raise
            return taken.count()

    def take_plain(self) -> _Taken | None:
        """Everything waiting, when it is only audit rows and spend (what `committing.LoopCommitter` writes); None,
        taking nothing, when reservations, settlements or balances wait too (`flush` commits those). The caller
        commits what it took or hands it back with `put_back`."""
        with self._lock:
            if self._settled or self._reserved or self._balances:
                return None
            taken = _Taken(self._audit, self._spend, [], {}, [])
            charges, self._charges = self._charges, []
            self._audit, self._spend = [], {}
        _sum_charges(taken.spend, charges)
        return taken

    def put_back(self, taken: _Taken) -> None:
        """Return rows a failed commit took, ahead of those added since."""
        with self._lock:
            self._audit[:0] = taken.audit
            self._settled[:0] = taken.settled
            self._reserved[:0] = taken.reserved
            for key, micros in taken.spend.items():
                self._spend[key] = self._spend.get(key, 0) + micros
            for account, change in taken.balances.items():
                self._balances[account] = self._balances.get(account, 0) + change


@dataclass(frozen=True, slots=True)
class _Taken:
    """What one flush took out of the backlog."""

    audit: list[AuditRow]
    spend: dict[tuple[str, str], int]
    settled: list[dict[str, Any]]
    balances: dict[str, int]
    reserved: list[dict[str, Any]]

    def count(self) -> int:
        return len(self.audit) + len(self.spend) + len(self.settled) + len(self.reserved)


def _write(store: Store, tx: Transaction, taken: _Taken) -> None:
    """The rows of one flush, in one transaction."""
    if taken.reserved:  # before the settlements that close them; a retried commit may find them written
        tx.execute(store.insert_ignore(reservations), taken.reserved)
    if taken.settled:
        tx.execute(_CLOSE, taken.settled)
    for account, change in sorted(taken.balances.items()):
        tx.execute(_change_balance(account, change))
    insert_audit(tx, *taken.audit)
    _add_to_spend(tx, taken.spend)


def _change_balance(account: str, change: int) -> sa.Update:
    return sa.update(balances).where(balances.c.account == account).values(micros=balances.c.micros + change)


def _write_apart(store: Store, tx: Transaction, taken: _Taken) -> list[tuple[str, str]]:
    """The rows of one flush one by one, in `_write`'s order, each in a savepoint; a row the store refuses is
    written as a `set_aside` audit row instead. Returns (what, the store's reason) of each row set aside."""
    refused: list[tuple[str, str]] = []
    for what, row, write in _one_by_one(store, tx, taken):
        try:
            with tx.begin_nested():
                write()
        except Exception as exc:
            if not refused_by_store(exc):
                raise
            reason = failure_reason(exc)
            refused.append((what, reason))
            set_aside = audit_row(SET_ASIDE, status="refused", detail={"what": what, "reason": reason, "row": row})
            try:
                with tx.begin_nested():
                    insert_audit(tx, set_aside)
            except Exception as again:
                if not refused_by_store(again):
                    raise
                log.error("the store refused a %s (%s) and its set-aside record too (%s); it is lost but for this "
                          "line: %r", what, reason, failure_reason(again), row)
    return refused


_Write = tuple[str, dict[str, Any], Callable[[], Any]]  # what a row is, its values, the write of it alone


def _one_by_one(store: Store, tx: Transaction, taken: _Taken) -> Iterator[_Write]:
    """Each row of `taken` as (what it is, its values, the write of it alone), in `_write`'s order."""
    for reserved in taken.reserved:
        yield "reservation", reserved, partial(tx.execute, store.insert_ignore(reservations), [reserved])
    for settled in taken.settled:
        yield "settlement", settled, partial(tx.execute, _CLOSE, [settled])
    for account, change in sorted(taken.balances.items()):
        yield "balance change", {"account": account, "micros": change}, partial(
            tx.execute, _change_balance(account, change))
    for audited in taken.audit:
        yield "audit row", dict(zip(_AUDIT_COLUMNS, audited, strict=True)), partial(insert_audit, tx, audited)
    for (scope, month), micros in sorted(taken.spend.items()):
        yield "spend sum", {"scope": scope, "month": month, "micros": micros}, partial(
            _add_to_spend, tx, {(scope, month): micros})


def _report_set_aside(refused: list[tuple[str, str]]) -> None:
    if refused:
        what = "; ".join(f"a {what}: {reason}" for what, reason in refused[:3])
        more = f" and {len(refused) - 3} more" if len(refused) > 3 else ""
        log.error("the store refused %d rows (%s%s): each is set aside in the audit trail as a %s event with the "
                  "store's reason (`handler audit --event %s` lists them), and every other row is recorded. A "
                  "refused row is a defect: report it with those events", len(refused), what, more, SET_ASIDE,
                  SET_ASIDE)


_SUMS_A_STATEMENT = 256  # SQLite's: 768 parameters, well under its limit of 32,766


def _sum_charges(spend: dict[tuple[str, str], int], charges: list[tuple[tuple[str, ...], str, int]]) -> None:
    for scopes, month, micros in charges:
        for scope in scopes:
            spend[(scope, month)] = spend.get((scope, month), 0) + micros


def spend_statements(mark: str, sums: Mapping[tuple[str, str], int]) -> list[tuple[str, tuple[Any, ...]]]:
    """The statements (with their parameters) adding each (scope, month)'s micros to its spend row, made when
    missing: one for up to 256 rows, in the order of their keys (so two routers' commits lock shared rows in one
    order on PostgreSQL); `mark` is the driver's placeholder."""
    ordered = sorted(sums.items())
    statements = []
    for start in range(0, len(ordered), _SUMS_A_STATEMENT):
        chunk = ordered[start:start + _SUMS_A_STATEMENT]
        values = ", ".join([f"({mark}, {mark}, {mark})"] * len(chunk))
        statements.append((f"INSERT INTO spend (scope, month, micros) VALUES {values} "  # noqa: S608 - only markers
                           "ON CONFLICT (scope, month) DO UPDATE SET micros = spend.micros + excluded.micros",
                           tuple(item for (scope, month), micros in chunk for item in (scope, month, micros))))
    return statements


def _add_to_spend(tx: Transaction, sums: Mapping[tuple[str, str], int]) -> None:
    """Add each (scope, month)'s micros to its spend row (`spend_statements`). An `executemany` of them made a
    statement a row, and SQLite's driver gives up the interpreter's lock for each."""
    for statement, parameters in spend_statements(marker(tx), sums):
        tx.exec_driver_sql(statement, parameters)
