"""Budget leases: a router spends a slice of each cap's headroom in memory (docs/governance.md, "Leases").

A capped call counts against the spend rows of its org, profile and instance for the month and, when
the org is prepaid, against its balance. Rather than lock those rows for every call, a router leases
a slice of each capped row's headroom (and of the balance) in one transaction: the slice is added to
the spend row (taken from the balance) at once, so the caps hold for every other router, and the
router admits calls against it in memory. What its calls were charged stays counted; what they did
not use is given back when the lease is returned (idle, at shutdown, or reconciled after its router
died). Every lease is sized from the recent rate of its calls, at least one call's price, at most a
fair share of what the store has left; where less is left than a lease, the rest is taken, so a cap
near its end admits exactly the calls that fit.

A lease has two amounts in the store: `granted` (counted in the row) and `issued` (the most its calls
may have cost). The router writes `issued` before it admits past it, a little ahead of its calls, so a
lease that is never returned (`kill -9`) is reconciled by giving back `granted - issued` alone: spend
never under-counts.

This module holds one router's book of leases — its arithmetic under one lock, since admissions run on
the event loop and store work on worker threads — and the transaction that brings the book and the
store in line (`sync`). `leasekeeper.LeaseKeeper` drives both. The rows are the store's (`store.leases`).

A lane's capped calls (`lanes`) do not take the lock per call: the book carves a credit for them out of a
lease's issued room (`carve`: reserved at once, so the store and every sync count it as used), which the event
loop's thread alone then spends, a subtraction a call, and counts what its calls settled at their price
(`spent`); `fold` gives both back to the lease under the lock, on that thread, before every sync (so a sync sizes,
gives back and returns a lease on what its calls use). The budget left a call is told counts the credit as
unspent, so it is what the call-by-call arithmetic would say.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from reconciler.governance.decide import SpendState
from reconciler.governance.rulebook import CapSet
from reconciler.governance.store import Store, Transaction, now
from reconciler.governance.store import leases as rows
from reconciler.governance.store.leases import Cut

__all__ = [
    "Cut",
    "Lease",
    "LeaseBook",
    "LeaseTerms",
    "Need",
    "Needs",
    "Waiter",
    "new_router_id",
    "reconcile_leases",
    "sync",
]


_CARVE_MOST = 64  # calls' prices a lease's credit is carved at most at once (`LeaseBook.carve`)


def new_router_id() -> str:
    return "router-" + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class LeaseTerms:
    """How leases are sized and kept."""

    lease_seconds: float = 1.0  # a lease holds about this long of calls at the recent rate
    # `issued` runs this far ahead of the calls: what a `kill -9` may leave counted that no call cost, and, at half
    # of it, how often a busy lease writes its row (one transaction each: at 0.25 s, the PostgreSQL capped line of
    # `benchmarks/router.py` spent about a fifth of the router's CPU on them). Less than `lease_seconds`, or a
    # lease is issued whole.
    issue_seconds: float = 0.5
    tick_seconds: float = 0.1  # how often the router looks at its leases (and writes what changed)
    idle_seconds: float = 1.0  # a lease no call used this long is returned
    ttl_seconds: float = 30.0  # a lease its router has not renewed this long may be reconciled by anyone
    charged_seconds: float = 1.0  # how fresh the `charged` of a busy lease is in the store (reports)


class Need(NamedTuple):
    """One capped row (or the prepaid balance) a call counts against, with its cap and its decision field."""

    cut: Cut
    cap: int | None  # micros; None for the balance, whose row is its own headroom
    field: str  # the SpendState field it is decided on: org, profile, instance, balance


class Needs(NamedTuple):
    """What a call of one profile and instance counts against this month."""

    leased: tuple[Need, ...]  # the capped rows and the balance: spent from leases
    counted: tuple[str, ...]  # the spend scopes no cap limits: counted through the backlog
    month: str


class Lease:
    """One router's lease on one cut, as the router keeps it (the store has `granted`, `issued`, `charged`)."""

    __slots__ = ("admitted", "cap", "carve", "carved", "charged", "credit", "cut", "granted", "headroom", "id", "idle",
                 "issued", "limit", "max_price", "no_balance", "rate", "renewed", "reserved", "seen", "spent", "stored",
                 "written")

    def __init__(self, cut: Cut, cap: int | None) -> None:
        self.id = "lease_" + secrets.token_hex(10)
        self.cut = cut
        self.cap = cap  # the cap it was sized under: another cap (a reload) makes the router size it again
        self.granted = 0  # counted in the row (taken from the balance)
        self.issued = 0  # the most its calls may cost, as the store has it (admissions stay within)
        self.charged = 0  # what its settled calls cost
        self.reserved = 0  # the most its running calls may cost
        self.written = 0  # `charged` as last written
        self.headroom: int | None = None  # what the store had left beyond it, when last seen
        self.no_balance = False  # the prepaid account has no balance row at all
        self.seen = 0  # the sync that last read its row
        self.stored = False  # its row exists
        self.renewed = 0.0
        self.admitted = 0  # micros admitted since the last tick
        self.rate = 0.0  # micros per second, recent
        self.idle = 0.0  # seconds without an admission
        self.max_price = 0
        self.limit = 0  # `granted` plus the store's headroom beyond it, set at once wherever either moves
        # The lanes' credit (written on the event loop's thread only): of `reserved`, what was carved for their calls
        # and no call has taken yet; what their calls settled at their price, owed to `charged` until the next
        # `fold`; how many calls the next carve takes (doubling until the fold); what was carved since the fold (what
        # of it the calls took is counted as `admitted` at the fold, so a carve is not taken for a burst).
        self.credit = 0
        self.spent = 0
        self.carve = 1
        self.carved = 0

    @property
    def used(self) -> int:
        return self.charged + self.reserved

    @property
    def left(self) -> int:
        """The budget left on it as this router last saw the store: the lanes' unspent credit is not spent."""
        return self.limit - self.charged - self.reserved + self.credit

    def bound(self) -> None:
        """`limit` again, after `granted` or `headroom` moved (under the book's lock): one store of it, so a call
        reading it without the lock never sees one moved without the other."""
        self.limit = self.granted + max(self.headroom or 0, 0)


@dataclass(slots=True)
class Waiter:
    """A call whose leases lacked room: it waits for the next sync, which takes for it or finds no room."""

    needs: Needs
    cost: int
    held: tuple[Lease, ...] | None = None  # taken for it by the sync
    refused: SpendState | None = None  # the store cannot cover it: the state its guardrails decide on


@dataclass(slots=True)
class _Step:
    """What one sync does to one lease; decided under the book's lock, done in the transaction."""

    lease: Lease
    asked: bool = False  # calls wait on it: its row is read (and the store's headroom seen) whatever it takes
    need: int = 0  # at least this much more, for the first call waiting on it
    want: int = 0  # as much more as this, if the store's fair share allows
    unit: int = 1  # the price of a call on it: what it takes comes in whole calls, so no router keeps a crumb
    give: int = 0  # given back (already out of the book)
    close: bool = False
    ahead: int = 0  # `issued` runs this far beyond what its calls use
    used: int = 0
    charged: int = 0
    prior: tuple[int, int, int | None] = (0, 0, None)  # granted, issued, cap before the plan (to restore)
    # filled by the transaction
    added: int = 0
    issued: int = 0
    headroom: int | None = None
    no_balance: bool = False
    lost: bool = False

    @property
    def moves(self) -> bool:
        """Whether the sync locks the lease's spend row (or balance): to read it, take from it or give back."""
        return bool(self.asked or self.need or self.want or self.give)


@dataclass(slots=True)
class _Plan:
    number: int
    steps: list[_Step] = field(default_factory=list)

    def touches_rows(self) -> bool:
        return any(s.moves for s in self.steps)


class LeaseBook:
    """One router's leases, keyed by what each is cut from."""

    def __init__(self, router: str, terms: LeaseTerms) -> None:
        self.router = router
        self.terms = terms
        self._lock = threading.Lock()
        self._leases: dict[Cut, Lease] = {}
        self._needs: dict[tuple[CapSet, str, str, str], Needs] = {}
        self._syncs = 0
        self._ticked = time.monotonic()
        # Moves whenever a lease joins or leaves the book or is sized under another cap: what the lanes found of
        # the book (the leases a call takes from) holds while it stays.
        self.version = 0
        self.syncing = threading.Lock()  # one sync at a time: only syncs change `granted`

    def __len__(self) -> int:
        return len(self._leases)

    def needs(self, caps: CapSet, profile: str, instance: str, month: str) -> Needs:
        """What a call counts against: the capped rows and the balance (leased), the other scopes (counted)."""
        key = (caps, profile, instance, month)
        found = self._needs.get(key)
        if found is None:
            if len(self._needs) > 10_000:  # instances come and go
                self._needs.clear()
            leased: list[Need] = []
            counted: list[str] = []
            for scope, cap, name in ((f"instance:{profile}/{instance}", caps.instance, "instance"),
                                     (f"org:{caps.org_name}", caps.org, "org"),
                                     (f"profile:{profile}", caps.profile, "profile")):
                if cap is None:
                    counted.append(scope)
                else:
                    leased.append(Need(Cut(scope, month, None), cap, name))
            if caps.prepaid:
                leased.append(Need(Cut(None, None, caps.org_name), None, "balance"))
            found = self._needs[key] = Needs(tuple(leased), tuple(counted), month)
        return found

    # --- on the call path ------------------------------------------------------------------------

    def take(self, needs: Needs, cost: int) -> tuple[Lease, ...] | None:
        """Reserve `cost` on every lease the call needs; None when one lacks issued room (or was sized under
        another cap): the call then waits for a sync."""
        with self._lock:
            return self._take(needs, cost)

    def _take(self, needs: Needs, cost: int) -> tuple[Lease, ...] | None:
        held = []
        for need in needs.leased:
            lease = self._leases.get(need.cut)
            if lease is None or lease.cap != need.cap or lease.issued - lease.charged - lease.reserved < cost:
                return None
            held.append(lease)
        for lease in held:
            lease.reserved += cost
            lease.admitted += cost
            lease.max_price = max(lease.max_price, cost)
        return tuple(held)

    def carve(self, leases: Sequence[Lease], cost: int) -> bool:
        """A credit of at least `cost` on each lease for the lanes' calls, reserved out of its issued room: the
        first since the last `fold` one call's price, each one after twice as many calls, at most 64 and half the
        room (so a cap near its end is carved a call at a time); False when one lacks room for this call (the
        lanes `fold`, then take the call's price alone)."""
        with self._lock:
            for lease in leases:
                short = cost - lease.credit
                if short <= 0:
                    continue
                free = lease.issued - lease.charged - lease.reserved
                if free < short:
                    return False
                amount = max(short, min(lease.carve * cost, free // 2 // cost * cost))
                lease.reserved += amount
                lease.credit += amount
                lease.carved += amount
                lease.max_price = max(lease.max_price, cost)
                lease.carve = min(lease.carve * 2, _CARVE_MOST)
            return True

    def fold(self) -> None:
        """Give each lease the lanes' unspent credit back, count what their calls took of it as admitted and what
        they spent as `charged` (on the event loop's thread: `LeaseKeeper.fold`)."""
        with self._lock:
            for lease in self._leases.values():
                if lease.carved or lease.spent:
                    lease.reserved -= lease.credit + lease.spent
                    lease.charged += lease.spent
                    lease.admitted += lease.carved - lease.credit
                    lease.credit = lease.spent = lease.carved = 0
                lease.carve = 1

    def give_back(self, held: Sequence[Lease], cost: int) -> None:
        """Undo `take` for a call that was not run (held for a person, or blocked by a rule)."""
        with self._lock:
            for lease in held:
                lease.reserved -= cost

    def settle(self, held: Sequence[Lease], cost: int, charged: int) -> int:
        """A call admitted at `cost` ended, charged `charged` (never more than `cost`); returns the least budget
        left over its caps and balance, as this router last saw the store (under the one lock: a capped call's
        settlement takes it once, `benchmarks/gate.py`)."""
        with self._lock:
            left = None
            for lease in held:
                lease.reserved -= cost
                lease.charged += charged
                room = lease.left
                left = room if left is None or room < left else left
            return max(0, left or 0)

    def found(self, needs: Needs) -> tuple[Lease, ...] | None:
        """The leases a call of these needs takes its price from, as the book has them now (its `version`); None when
        one is missing or was sized under another cap: the call then waits for a sync."""
        with self._lock:
            held = []
            for need in needs.leased:
                lease = self._leases.get(need.cut)
                if lease is None or lease.cap != need.cap:
                    return None
                held.append(lease)
            return tuple(held)

    def has_room(self, cuts: Sequence[Cut]) -> bool:
        """Whether any of these leases holds room its calls have not used."""
        with self._lock:
            return any(lease.granted > lease.used - lease.credit for cut in cuts
                       if (lease := self._leases.get(cut)) is not None)

    # --- the keeper's side -----------------------------------------------------------------------

    def tick(self, seconds: float) -> None:
        """Another tick: each lease's recent rate, and how long it has been idle."""
        with self._lock:
            for lease in self._leases.values():
                now_rate = lease.admitted / seconds if seconds > 0 else 0.0
                lease.rate = now_rate if now_rate > lease.rate else (lease.rate + now_rate) / 2
                lease.idle = 0.0 if lease.admitted else lease.idle + seconds
                lease.admitted = 0
            self._ticked = time.monotonic()

    def plan(self, waiters: Sequence[Waiter], at: float, *, closing: bool, only: Sequence[Cut] | None) -> _Plan:
        """What the next sync does. What it gives back leaves the book now (the store still
        counts it until the transaction commits); what it takes joins the book once it has committed."""
        with self._lock:
            return self._plan(waiters, at, closing=closing, only=only)

    def _plan(self, waiters: Sequence[Waiter], at: float, *, closing: bool, only: Sequence[Cut] | None) -> _Plan:
        terms = self.terms
        self._syncs += 1
        plan = _Plan(self._syncs)
        # Calls that keep asking between ticks (one after the other) show their rate before the next tick does.
        since_tick = max(time.monotonic() - self._ticked, terms.tick_seconds / 10)
        demand: dict[Cut, list[int]] = {}
        caps: dict[Cut, int | None] = {}
        for waiter in waiters:
            for need in waiter.needs.leased:
                demand.setdefault(need.cut, []).append(waiter.cost)
                caps[need.cut] = need.cap
        for cut in demand:
            if cut not in self._leases:
                self._leases[cut] = Lease(cut, caps[cut])
                self.version += 1
        for cut, lease in list(self._leases.items()):
            step = _Step(lease, prior=(lease.granted, lease.issued, lease.cap))
            asked = demand.get(cut, [])
            returning = closing or (only is not None and cut in only) or (
                not asked and lease.idle >= terms.idle_seconds)
            if asked and lease.cap != caps[cut]:  # sized under another cap: give it all back, size it again
                step.give = lease.granted - lease.used
                lease.cap = caps[cut]
                self.version += 1
            elif returning:
                step.give = lease.granted - lease.used
            if step.give:
                lease.granted -= step.give
                lease.issued = min(lease.issued, lease.granted)
                lease.bound()
            used = lease.used
            free = lease.granted - used
            rate = max(lease.rate, lease.admitted / since_tick)
            step.used, step.charged = used, lease.charged
            step.ahead = max(lease.max_price, sum(asked), round(rate * terms.issue_seconds))
            step.unit = max(max(asked, default=0), lease.max_price, 1)
            if asked:
                step.asked = True
                target = max(sum(asked), lease.max_price, round(rate * terms.lease_seconds))
                step.want = _whole(max(0, target - free), step.unit)
                step.need = max(0, min(asked) - free)
            elif not returning and lease.idle == 0 and (lease.headroom is None or lease.headroom > 0):
                target = round(lease.rate * terms.lease_seconds)
                if free < target // 2:  # busy: take more before its calls run out
                    step.want = _whole(target - free, step.unit)
            step.close = returning and not asked and lease.reserved == 0
            short = not returning and used + step.ahead // 2 > lease.issued and lease.issued < lease.granted
            due = at - lease.renewed >= terms.ttl_seconds / 3 or (
                lease.charged != lease.written and at - lease.renewed >= terms.charged_seconds)
            if asked or step.need or step.want or step.give or step.close or short or (lease.stored and due):
                plan.steps.append(step)
        return plan

    def apply(self, plan: _Plan, waiters: Sequence[Waiter], at: float) -> None:
        """After the transaction committed: what it took joins the book; then the waiting calls are served in
        the order they came, before any new call can take what was meant for them."""
        with self._lock:
            for step in plan.steps:
                lease = step.lease
                if step.lost or step.close:
                    if self._leases.get(lease.cut) is lease:
                        del self._leases[lease.cut]
                        self.version += 1
                    continue
                lease.granted += step.added
                lease.issued = max(lease.issued, step.issued)
                lease.stored = lease.stored or lease.granted > 0 or step.issued > 0
                lease.written = step.charged
                lease.renewed = at
                if step.headroom is not None:
                    lease.headroom, lease.no_balance, lease.seen = step.headroom, step.no_balance, plan.number
                lease.bound()
            for waiter in waiters:
                waiter.held = self._take(waiter.needs, waiter.cost)
                if waiter.held is None:
                    waiter.refused = self._refused(waiter, plan.number)

    def _refused(self, waiter: Waiter, number: int) -> SpendState | None:
        """The spend state a waiting call is decided on when the store, read by this sync, cannot cover it on
        some lease: spent as this router sees it, the other routers' leases counted. None: it waits on."""
        fields: dict[str, Any] = {}
        short = False
        for need in waiter.needs.leased:
            lease = self._leases.get(need.cut)
            if lease is None or lease.seen != number or lease.cap != need.cap:
                return None  # not read by this sync: ask again
            # The lanes' credit is room too: given back at the fold before the next sync, it is there for this call.
            room = lease.granted - lease.used + lease.credit + (lease.headroom or 0)
            short = short or room < waiter.cost
            if need.cap is None:
                fields["balance"] = None if lease.no_balance and room <= 0 else room
            else:
                fields[need.field] = need.cap - room
        return SpendState(**fields, leased=True) if short else None

    def restore(self, plan: _Plan) -> None:
        """The transaction failed: the store still counts what the plan meant to give back."""
        with self._lock:
            for step in plan.steps:
                lease = step.lease
                lease.granted, lease.issued, lease.cap = step.prior[0], max(lease.issued, step.prior[1]), step.prior[2]
                lease.bound()
                self.version += 1  # its cap may be the one before
                if not lease.stored and lease.granted == 0 and self._leases.get(lease.cut) is lease:
                    del self._leases[lease.cut]


def sync(store: Store, book: LeaseBook, waiters: Sequence[Waiter] = (), *, closing: bool = False,
         only: Sequence[Cut] | None = None) -> bool:
    """Bring the book and the store in line in one transaction: take more for waiting and busy leases, give
    back what idle ones (all, when `closing`; those on `only`) do not use, move `issued` ahead of the
    calls, renew. Then serve the waiting calls (each gets `held` or `refused`, or neither: ask again).
    Returns whether it wrote anything. A `StoreError` leaves the book as it was."""
    with book.syncing:
        at = now()
        plan = book.plan(waiters, at, closing=closing, only=only)
        if plan.steps:
            if plan.touches_rows():
                rows.ensure_rows(store, (s.lease.cut for s in plan.steps))
            try:
                with store.begin() as tx:
                    _execute(store, tx, book, plan, at)
            except BaseException:
                book.restore(plan)
                raise
        book.apply(plan, waiters, at)
        return bool(plan.steps)


def _execute(store: Store, tx: Transaction, book: LeaseBook, plan: _Plan, at: float) -> None:
    """The plan's one transaction: lock the rows it moves (spend, balances, its leases: that order), take
    and give back, and write each lease's row. A lease reconciled by another router while this one could not renew
    it is lost: one whose spend moves is found so under its lock, before anything moves; one that only writes its
    row (`issued` ahead, renewed), by that write finding it no longer open, which saves such a sync a statement."""
    moving = [s.lease.cut for s in plan.steps if s.moves]
    books = _Rows(rows.lock_spend(store, tx, [(c.scope, c.month) for c in moving if c.scope and c.month]),
                  rows.lock_balances(store, tx, [c.account for c in moving if c.account is not None]))
    states = rows.lock_leases(store, tx, [s.lease.id for s in plan.steps if s.lease.stored and s.moves])
    sharing = rows.open_elsewhere(store, tx, book.router, at) if any(s.asked or s.want for s in plan.steps) else {}
    for step in plan.steps:
        if step.lease.stored and step.moves and states.get(step.lease.id) != "open":
            step.lost = True
            continue
        granted = step.prior[0] - step.give + books.move(step, sharing.get(step.lease.cut, 0))
        step.lost = not _write(store, tx, book, step, granted, at)
    rows.move_spend(store, tx, books.spend_moves)
    rows.move_balances(store, tx, books.balance_moves)


@dataclass(slots=True)
class _Rows:
    """The spend rows and balances a sync locked, as it moves them."""

    spend: dict[tuple[str, str], int]
    balances: dict[str, int | None]
    spend_moves: dict[tuple[str, str], int] = field(default_factory=dict)
    balance_moves: dict[str, int] = field(default_factory=dict)

    def move(self, step: _Step, sharing: int) -> int:
        """Give back what the step gives; take what it asks, within the store's headroom and this router's
        fair share of it (`sharing` other routers hold leases on it); returns what was taken."""
        cut = step.lease.cut
        asks = bool(step.asked or step.need or step.want)
        if cut.account is not None:
            if cut.account not in self.balances:
                return 0
            found = self.balances[cut.account]
            step.no_balance = found is None
            left = (found or 0) + step.give
        else:
            key = (cut.scope or "", cut.month or "")
            if key not in self.spend:
                return 0
            self.spend[key] -= step.give
            left = (step.lease.cap or 0) - self.spend[key]
        taken = 0
        if asks:
            room = max(left, 0)
            share = room // step.unit // (1 + sharing) * step.unit  # whole calls
            taken = min(room, max(step.need, min(step.want, share)))
            step.headroom = left - taken
        if cut.account is not None:
            self.balances[cut.account] = left - taken
            self.balance_moves[cut.account] = self.balance_moves.get(cut.account, 0) + step.give - taken
        else:
            self.spend[key] += taken
            self.spend_moves[key] = self.spend_moves.get(key, 0) - step.give + taken
        step.added = taken
        return taken


def _whole(micros: int, unit: int) -> int:
    """`micros` rounded up to whole calls of `unit`."""
    return -(-micros // unit) * unit


def _write(store: Store, tx: Transaction, book: LeaseBook, step: _Step, granted: int, at: float) -> bool:
    """The lease's row: `issued` moved ahead of its calls (never below what they may already cost), renewed. False:
    its row is no longer open (reconciled by another router)."""
    lease, cut = step.lease, step.lease.cut
    step.issued = max(min(lease.issued, granted), min(granted, step.used + step.ahead))
    values: dict[str, Any] = {"granted": granted, "issued": step.issued, "charged": step.charged,
                              "renewed_at": at, "expires_at": at + book.terms.ttl_seconds, "state": "open"}
    if step.close:
        values.update(state="returned", granted=step.charged, issued=step.charged)
    if lease.stored:
        return rows.update_lease(store, tx, lease.id, values)
    if granted > 0 or step.issued > 0:
        rows.insert_lease(store, tx, {"id": lease.id, "router": book.router, "scope": cut.scope, "month": cut.month,
                                      "account": cut.account, "taken_at": at, **values})
    return True


def reconcile_leases(store: Store, router: str | None = None, *, by: str | None = None) -> list[dict[str, Any]]:
    """Give back what leases their routers never returned did not issue (`granted - issued`): every expired
    one, and with `router` every open one of that router (a router starting again under its own id knows
    its previous process is gone). What was issued stays counted as spent. Returns what was closed; the audit
    trail says that router `by` reconciled them."""
    return rows.close_expired(store, now(), router, by=by)
