"""Calls that nothing limits and nothing holds, admitted for the cost of a lookup; the audit rows of every call
admitted on the event loop (docs/architecture.md §10).

A call whose org, profile and instance have no cap, whose org is not prepaid and whose decision is
"runs now" is decided by config and its price alone. That decision — a `Lane` — is worked out once
per snapshot, profile, tool and price, with the audit rows such a call leaves already encoded, and
found from then on by the call's route (the router's plan of the tool); each call then costs the
gate that lookup, its admission kept as its handle while it runs, and a count (what the calls were
charged is summed only for those not charged their price). `Records` keeps them on the event loop's
thread, so no lock is taken per call; the gate's flush takes them there (`take`) and hands them to
the backlog, which the store's worker commits.

A call that a cap or the prepaid balance limits has a lane too, a leased one, while this router's budget
leases cover it (`leases.LeaseBook`): decided as a covered call (the guardrails read an untouched budget,
`covered`), it costs the lookup plus the subtraction of its price from the credit the book carved for the lanes
on its leases (`LeaseBook.carve`, when the credit runs short), and its settlement counts what it spent and tells
the budget left; the keeper gives the credit and the spend back to the leases before each sync (`LeaseBook.fold`,
on this thread too). When they lack room the call takes the admissions' leased path, which waits for the keeper
(`leasekeeper`); the caps' own spend is counted by the leases' syncs, the scopes no cap limits through the
backlog, as for any lane.

Such a call is decided by the revision alone, and no one can ask for it by its request id (neither
the agent nor the call log is told one), so its record is the tally: the calls of one agent run, tool
and outcome settled before the flush (every 50 ms) leave one audit row, `settled` or `released`, with
no request id, dated when the flush took it, which carries the decision's reason, cost and binding,
how many calls it counts (`calls`), what they reserved and were charged, and when the first of them
was decided (`first`). Each call is in the call log on its own (`router.calllog`). A call still
running at a flush is carried to the next (a busy router always has calls under way, most of them
about to end); one still running then has its `decided` row written, with a request id made for it,
and its own settlement row naming it when it ends. So a call's decision is in the store within two
flushes, and an explicit flush or the last one writes the decision of every call still running. A
call that reports more than its price is charged its price and recorded as a pricing violation, as
on every path (`charging`). A call admitted against budget leases (`leasekeeper`) is executed without a
request id anyone is told, too: settled within two flushes, it is counted with the calls of its run,
tool, decision (its `decided` detail) and outcome; else `decided`, then `settled`.

This is the governance room's one module written for speed: its tuples read by position (`AuditRow`), its
counters kept apart for the common case (`_Paid`) and its comparisons in place of `min()` each buy part of the
uncapped line of `benchmarks/gate.py`. A leased lane's ticket holding the leases its calls take from while the
book's version stands (the lane's own, found by the call's route, where its caps do not name the instance), the
credit spent without the book's lock, and the one-lease case written out in `admit` and `settle` buy the capped
line of it and of `benchmarks/router.py`. `tests/governance/test_lanes_reference.py` holds it against a plain,
call-by-call ledger of the same rules.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

import orjson

from reconciler.config.models import Outcome
from reconciler.config.snapshot import Snapshot
from reconciler.governance.charging import PricedCall, charge_call
from reconciler.governance.decide import SpendState, decide_call
from reconciler.governance.gate import Admission, CallRequest, Settlement
from reconciler.governance.holds import new_request_id
from reconciler.governance.leases import Lease, LeaseBook, LeaseTerms
from reconciler.governance.ledger import current_month, month_span, scopes_for, settlement_row
from reconciler.governance.rulebook import MICROS, CapSet, Rulebook, from_micros, to_micros
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store.audit import AuditRow

__all__ = ["Lane", "LaneTicket", "Records", "Tally", "covered", "limits_spend"]

_NO_SPEND = SpendState()
_SPENDING_KEPT = 10_000
_UNBOUNDED = 1 << 62  # micros: more than any budget
K = TypeVar("K")


@dataclass(frozen=True, slots=True, eq=False)  # each lane is its own: compared and hashed by identity
class Lane:
    """The decision of every call of one profile's tool at one price that nothing limits or holds."""

    profile: str
    tool: str
    price: float  # `cost` in USD: a call reporting exactly this is charged `cost` without converting it
    cost: int  # micros
    reason: str
    trace: tuple[Mapping[str, Any], ...]
    decided: str  # the `decided` row's detail, JSON
    settled: AuditRow  # the row of a call settled at `cost`, and of a failed one: event, status, detail read
    released: AuditRow
    caps: CapSet  # whose org the spend is counted for
    paid: Settlement  # what a call charged its price is told; one for all of them, read only
    leased: bool = False  # a cap or the prepaid balance limits it: each call takes its price from the budget leases


@dataclass(frozen=True, slots=True, eq=False)
class LaneTicket:
    """The ticket of the calls one `Records` admits on one lane (`gate.Ticket`): made once per snapshot, not per call;
    a leased lane's holds the leases its calls take from, while the book's `version` stands and until the month
    `ends` (made again then), and is the lane's own when its caps do not name the instance, else one per instance.
    Settling it records the call's settlement with that `Records`."""

    lane: Lane
    records: Records
    leases: tuple[Lease, ...] = ()
    version: int = -1  # no book's: a leased lane's calls find their leases first
    ends: float = 0.0
    lease: Lease | None = None  # its one lease, when its calls take from one (read without a loop: for speed)

    @property
    def leased(self) -> bool:
        """Whether its calls' prices are reserved on this router's budget leases."""
        return self.lane.leased

    def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        return self.records.settle(admission, self, actual_cost, ok)


@dataclass(slots=True)
class Tally:
    """Calls settled with one decision and outcome, written as one audit row at `take`."""

    calls: int
    reserved: int  # micros, summed
    charged: int  # micros, summed
    first: float  # when the first of them was decided

    def row(self, at: float, profile: str, instance: str, tool: str, decided: str, ok: bool) -> AuditRow:
        """The one row of these calls, dated `at`: `decided`'s detail with the count, the sums and when the first of
        them was decided."""
        event, status = ("settled", "executed") if ok else ("released", "failed")
        detail = {**orjson.loads(decided), "calls": self.calls, "reserved": self.reserved, "charged": self.charged,
                  "first": self.first}
        return (at, event, None, profile, instance, tool, None, status, orjson.dumps(detail).decode())


@dataclass(slots=True)
class _Paid:
    """A lane's calls of one instance that succeeded charged its price: the common case, with less to add."""

    calls: int
    first: float  # when the first of them was decided


Charges = list[tuple[tuple[str, ...], str, int]]  # (spend scopes, month, micros), as `Backlog.add_rows` takes them


class _Off(enum.Enum):
    """Cached in a lane's place: this profile's tool at this price takes the gate's other paths."""

    OFF = "off"


_OFF = _Off.OFF
_Compiled = Lane | Literal[_Off.OFF]  # what the rulebook's `lanes` holds, by (profile, tool, price)


def limits_spend(caps: CapSet) -> bool:
    """Whether a cap or the prepaid balance limits what this call may spend."""
    return caps.prepaid or caps.org is not None or caps.profile is not None or caps.instance is not None


def _ignore(snapshot: Snapshot) -> None:
    return None


class Records:
    """The lanes of the latest snapshot seen, and the audit rows and charges recorded on the event loop's thread
    since the last `take`. Used from that thread only."""

    def __init__(self, books: RulebookCache, seen: Callable[[Snapshot], None] | None = None,
                 leases: LeaseBook | None = None) -> None:
        """`seen` is told of each snapshot a call comes with that the last call did not; `leases`, this router's
        budget leases, lets a capped call take a lane while they cover it (none: capped calls take the gate's other
        paths)."""
        self._books = books
        self._leasing = leases is not None
        self._leases = leases if leases is not None else LeaseBook("", LeaseTerms())  # none: no lane is leased
        # The ticket of a leased lane whose caps name the instance, for its calls of one instance, with the leases they
        # take from (kept here by lane and instance for speed: the book's own key hashes the caps; `benchmarks/gate.py`,
        # the capped line).
        self._spending: dict[tuple[Lane, str], LaneTicket] = {}
        self._on_snapshot = seen or _ignore
        # The snapshot of the last call: held until a call comes with another (the router holds the live one anyway),
        # since comparing it costs the call path less than calling a weak reference.
        self._snapshot: Snapshot | None = None
        self._book: Rulebook | None = None
        self._lanes: dict[tuple[str, str, float], _Compiled] = {}
        self._routes: dict[object, LaneTicket] = {}  # a call's route → its lane's ticket, for the snapshot seen
        self._off: set[object] = set()  # the routes whose calls take the gate's other paths, for the snapshot seen
        self._tickets: dict[Lane, LaneTicket] = {}  # each lane's ticket, for the snapshot seen
        self.rows: list[AuditRow] = []  # in the order they happened
        # A lane's calls not yet settled, by admission: the call and when it was decided; those decided before the last
        # `take` are carried. One still running at the next has its `decided` row written then, and its admission → the
        # call and the request id that row names until it settles.
        self._running: dict[Admission, tuple[CallRequest, float]] = {}
        self._carried: dict[Admission, tuple[CallRequest, float]] = {}
        self._written: dict[Admission, tuple[CallRequest, str]] = {}
        # Request id → the `decided` row of a leased call not yet settled, and of those decided before the last `take`.
        self._deciding: dict[str, AuditRow] = {}
        self._deciding_carried: dict[str, AuditRow] = {}
        # The calls settled before their decision was taken, counted → [calls, micros reserved, micros charged, when
        # the first was decided]: a lane's by (lane, instance, ok), whose charges are summed here too; a leased call's
        # (whose charge the gate adds itself) by (profile, instance, tool, its `decided` detail, ok).
        self._tally: dict[tuple[Lane, str, bool], Tally] = {}
        # The common case counted apart, with less to add: a lane's calls that succeeded charged its price, by (lane,
        # instance); `take` counts them into `_tally`.
        self._paid: dict[tuple[Lane, str], _Paid] = {}
        self._leased: dict[tuple[str, str, str, str, bool], Tally] = {}
        self._charged: dict[tuple[str, Lane], int] = {}  # (instance, lane) → micros
        self.violations = 0  # lane calls that reported more than their price, since start
        # What the last leased lane's call settled at its price was told, and the budget left (micros) it names: the
        # calls the event loop settles one after another, with no admission between, are told the same (for speed:
        # one `Settlement` for them all, which the router's note reuses; `benchmarks/router.py`, the capped line).
        self._told = Settlement(0.0, None)
        self._told_left: int | None = None  # none told yet

    def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission | None:
        """Record the decision of a call admitted on its lane and return its admission, whose ticket is the lane's
        and which is the call's own handle until it is settled; None when the call must take the gate's other paths.
        Its request id is made only if its `decided` row is written (`take`, while it runs): the tally names none."""
        if snapshot is not self._snapshot:
            self._book = self._books.rulebook(snapshot)
            self._lanes, self._snapshot = self._book.lanes, snapshot
            self._routes, self._off, self._tickets, self._spending = {}, set(), {}, {}
            self._on_snapshot(snapshot)
        ticket = self._routes.get(call.route)
        if ticket is None:
            if call.route in self._off:
                return None
            ticket = self._ticket(call)
            if ticket is None:
                return None
        lane = ticket.lane
        now = time.time()
        if lane.leased:  # its price taken from the credit on its leases, written out for the one-lease case (speed)
            book = self._leases
            lease = ticket.lease
            if ticket.version != book.version or now >= ticket.ends:  # not `_current` (written out): leases found anew
                ticket = self._spend(lane, call, now)
                if ticket is None:  # the leases lack room: the gate's leased path waits for the keeper
                    return None
            elif lease is not None and lease.credit >= lane.cost:
                lease.credit -= lane.cost
            elif not self._take(book, ticket.leases, lane.cost):
                return None
        admission = Admission("executed", lane.reason, None, ticket, lane.trace)
        self._running[admission] = (call, now)
        return admission

    def _spend(self, lane: Lane, call: CallRequest, now: float) -> LaneTicket | None:
        """A leased lane's call's price taken from the credit on the leases of its caps this month, its ticket found
        (made when the book changed or a month began); None: the leases lack room for it, or one is missing."""
        book = self._leases
        shared = lane.caps.instance is None  # the same leases for every instance: the lane's own ticket holds them
        ticket = self._tickets.get(lane) if shared else self._spending.get((lane, call.instance))
        if ticket is None or not _current(ticket, book, now):
            ticket = self._spender(book, lane, call.instance, now)
            if ticket is None:
                return None
            if shared:
                self._tickets[lane] = ticket
            else:
                if len(self._spending) >= _SPENDING_KEPT:  # instances come and go
                    self._spending.clear()
                self._spending[(lane, call.instance)] = ticket
        if shared and call.route is not None:
            self._routes[call.route] = ticket
        return ticket if self._take(book, ticket.leases, lane.cost) else None

    def _spender(self, book: LeaseBook, lane: Lane, instance: str, now: float) -> LaneTicket | None:
        """A leased lane's ticket for the calls of `instance`: the leases of its caps this month as the book has them
        now. None: one is missing (or sized under another cap), and the call waits for a sync."""
        version = book.version  # read first: a change while the leases are found moves it again
        month, ends = month_span(now)
        found = book.found(book.needs(lane.caps, lane.profile, instance, month))
        if found is None:
            return None
        return LaneTicket(lane, self, found, version, ends, found[0] if len(found) == 1 else None)

    def _take(self, book: LeaseBook, leases: tuple[Lease, ...], cost: int) -> bool:
        """`cost` taken from the credit on every one of `leases`, carved first where it runs short. False: no room."""
        for lease in leases:
            if lease.credit < cost:
                return self._carve(book, leases, cost)
        for lease in leases:
            lease.credit -= cost
        return True

    @staticmethod
    def _carve(book: LeaseBook, leases: tuple[Lease, ...], cost: int) -> bool:
        """`cost` taken from the credit on `leases`, carved first (`LeaseBook.carve`); when they lack room, what the
        lanes hold on every lease is given back (`fold`) and this call's price alone carved. False: no room."""
        if not book.carve(leases, cost):
            book.fold()
            if not book.carve(leases, cost):
                return False
        for lease in leases:
            lease.credit -= cost
        return True

    def _settle_leases(self, ticket: LaneTicket, charged: int | None) -> Settlement:
        """What a leased lane's call is told: charged `charged`, and the budget left once its leases are settled
        (None: it was settled already, and is charged nothing more)."""
        if charged is None:
            return Settlement(0.0, None)
        lane = ticket.lane
        left = self._leases.settle(ticket.leases, lane.cost, charged)
        return Settlement(lane.price if charged == lane.cost else from_micros(charged), from_micros(left))

    def _ticket(self, call: CallRequest) -> LaneTicket | None:
        """The ticket of a call's lane (None: the call takes the gate's other paths), its lane worked out once per
        snapshot for its profile, tool and price, and the ticket found by the call's route from then on."""
        key = (call.profile, call.tool, call.estimated_cost)
        lane = self._lanes.get(key)
        if lane is None:
            assert self._book is not None  # noqa: S101 - set with `_snapshot`
            lane = self._lanes[key] = _compile(self._book, call, leased=self._leasing)
        if lane is _OFF:
            if call.route is not None:
                self._off.add(call.route)
            return None
        ticket = self._tickets.get(lane)
        if ticket is None:
            ticket = self._tickets[lane] = LaneTicket(lane, self)
        if call.route is not None:
            self._routes[call.route] = ticket
        return ticket

    def settle(self, admission: Admission, ticket: LaneTicket, actual_cost: float | None, ok: bool) -> Settlement:
        """Record the settlement of a call `admit` admitted with `ticket`; what it is told it was charged. One that
        reported more than its price is charged its price, and its pricing violation recorded (and counted:
        `violations`)."""
        lane = ticket.lane
        found = self._running.pop(admission, None)
        if found is not None and ok and (actual_cost is None or actual_cost == lane.price):  # the common case
            counted = (lane, found[0].instance)
            paid = self._paid.get(counted)
            if paid is None:
                self._paid[counted] = _Paid(1, found[1])
            else:
                paid.calls += 1
                if found[1] < paid.first:  # noqa: PLR1730 - a comparison costs the call path less than min()
                    paid.first = found[1]
            if not lane.leased:
                return lane.paid
            # Spent at its price: the leases count it at the next fold. The least budget left over them, the book's
            # lock untaken: `Lease.left` and `from_micros`, written out (each costs the call path a call), and the
            # one-lease case without a loop.
            cost, lease = lane.cost, ticket.lease
            if lease is not None:
                lease.spent += cost
                left = lease.limit - lease.charged - lease.reserved + lease.credit
            else:
                left = _UNBOUNDED
                for lease in ticket.leases:
                    lease.spent += cost
                    room = lease.limit - lease.charged - lease.reserved + lease.credit
                    if room < left:  # noqa: PLR1730 - a comparison costs the call path less than min()
                        left = room
            told = self._told
            if left != self._told_left or told.charged != lane.price:
                told = self._told = Settlement(lane.price, left / MICROS if left > 0 else 0.0)
                self._told_left = left
            return told
        charged = self._settle_other(admission, lane, found, actual_cost, ok)
        if lane.leased:
            return self._settle_leases(ticket, charged)
        return lane.paid if charged == lane.cost else Settlement(from_micros(charged or 0), None)

    def _settle_other(self, admission: Admission, lane: Lane, found: tuple[CallRequest, float] | None,
                      actual_cost: float | None, ok: bool) -> int | None:
        """`settle` of a call that failed, reported another cost than its price, or had its decision taken while it
        ran; what it is charged (micros). None: it was settled already (counted once, charged nothing more)."""
        if found is None:
            found = self._carried.pop(admission, None)
        running = found is not None
        if found is None:
            if admission not in self._written:
                return None
            call, rid = self._written.pop(admission)
        else:
            call, at = found
        violation = None
        if not ok:  # released; one that ended unanswered is charged what it may have cost
            charged = 0 if actual_cost is None else min(to_micros(actual_cost), lane.cost)
        elif actual_cost is None or actual_cost == lane.price:
            charged = lane.cost
        else:
            named = new_request_id() if running else rid
            charge = charge_call(PricedCall(named, call.profile, call.instance, call.binding, call.tool), lane.cost,
                                 to_micros(actual_cost), True)
            charged, violation = charge.charged, charge.violation
        if running:  # counted, and charged with the count (`take`)
            _count(self._tally, (lane, call.instance, ok), lane.cost, charged, at)
        else:  # its decision is written already: the settlement on its own, with that request id
            shape = (lane.settled if ok and charged == lane.cost else lane.released if not ok and not charged
                     else settlement_row(None, "", "", ok, lane.cost, charged))
            self.rows.append((time.time(), shape[1], rid, call.profile, call.instance, None, None, shape[7], shape[8]))
            if charged:
                charges = (call.instance, lane)
                self._charged[charges] = self._charged.get(charges, 0) + charged
        if violation is not None:
            self.violations += 1
            self.rows.append(violation)
        return charged

    @property
    def running(self) -> int:
        """How many calls admitted on their lanes are not yet settled."""
        return len(self._running) + len(self._carried) + len(self._written)

    def decided(self, request_id: str, row: AuditRow) -> None:
        """Keep the `decided` row of a call admitted on the event loop off its lane (against budget leases) until it
        is settled or taken, as a lane's call's is."""
        self._deciding[request_id] = row

    def settled(self, request_id: str, call: CallRequest, ok: bool, reserved: int, charged: int,
                violation: AuditRow | None) -> None:
        """Record the settlement of a call kept by `decided` (and its pricing violation): counted with the calls of
        its run, tool, decision and outcome when its decision is not yet taken, as a lane's call is; else its
        settlement row on its own, naming the request id its decision was written with."""
        decided = self._deciding.pop(request_id, None) or self._deciding_carried.pop(request_id, None)
        if decided is None:
            self.rows.append(settlement_row(request_id, call.profile, call.instance, ok, reserved, charged))
        else:
            _count(self._leased, (call.profile, call.instance, call.tool, decided[8], ok), reserved, charged,
                   decided[0])
        if violation is not None:
            self.rows.append(violation)

    def take(self, everything: bool = False) -> tuple[list[AuditRow], Charges]:
        """The rows and charges so far (the charges summed per spend row, counted this month), with the `decided`
        rows of the calls still running that were decided before the last take (of every call still running, with
        `everything`: no take may come after); all start afresh. A tally's row is dated now: its calls settled by
        then."""
        rows, charged = self.rows, self._charged
        self.rows, self._charged = [], {}
        now = time.time()
        for (lane, instance), paid in self._paid.items():
            micros = paid.calls * lane.cost
            _count(self._tally, (lane, instance, True), micros, micros, paid.first, paid.calls)
        for (lane, instance, ok), tally in self._tally.items():
            rows.append(tally.row(now, lane.profile, instance, lane.tool, lane.decided, ok))
            if tally.charged:
                charges = (instance, lane)
                charged[charges] = charged.get(charges, 0) + tally.charged
        for (profile, instance, tool, decided, ok), tally in self._leased.items():
            rows.append(tally.row(now, profile, instance, tool, decided, ok))
        # Still running since before the last take: its decision is written now. One decided since then is carried
        # to the next take, by which most have ended and are counted (a busy router always has calls under way).
        written = (self._carried, self._running) if everything else (self._carried,)
        for running in written:
            for admission, (call, at) in running.items():
                rid = new_request_id()
                self._written[admission] = (call, rid)
                rows.append((at, "decided", rid, call.profile, call.instance, call.tool, None, "executed",
                             cast(LaneTicket, admission.ticket).lane.decided))
        rows.extend(self._deciding_carried.values())
        if everything:
            rows.extend(self._deciding.values())
        if rows:  # in the order they happened
            rows.sort(key=_stamp)
        self._carried, self._running = ({}, {}) if everything else (self._running, {})
        self._deciding_carried, self._deciding = ({}, {}) if everything else (self._deciding, {})
        self._tally, self._paid, self._leased = {}, {}, {}
        month = current_month()
        return rows, [(scopes, month, micros) for (instance, lane), micros in charged.items()
                      if (scopes := self._counted(lane, instance, month))]

    def _counted(self, lane: Lane, instance: str, month: str) -> tuple[str, ...]:
        """The spend scopes a lane's charges are added to through the backlog: every scope of a lane nothing limits;
        of a leased lane, those no cap limits (what the leases' caps spend is counted by the leases' syncs)."""
        if lane.leased:
            return self._leases.needs(lane.caps, lane.profile, instance, month).counted
        return scopes_for(lane.caps, lane.profile, instance)

    def __len__(self) -> int:
        return (len(self.rows) + len(self._charged) + len(self._deciding) + len(self._deciding_carried)
                + len(self._tally) + len(self._paid) + len(self._leased) + len(self._running) + len(self._carried))


def _count(tallies: dict[K, Tally], counted: K, reserved: int, charged: int, first: float, calls: int = 1) -> None:
    """Count `calls` calls settled, the first of them decided at `first`."""
    tally = tallies.get(counted)
    if tally is None:
        tallies[counted] = Tally(calls, reserved, charged, first)
    else:
        tally.calls += calls
        tally.reserved += reserved
        tally.charged += charged
        tally.first = min(tally.first, first)


def _current(ticket: LaneTicket, book: LeaseBook, now: float) -> bool:
    """Whether a leased lane's ticket still names the leases its calls take from: made under the book's version, this
    month."""
    return ticket.version == book.version and now < ticket.ends


def _stamp(row: AuditRow) -> float:
    return row[0]


def _compile(book: Rulebook, call: CallRequest, *, leased: bool) -> _Compiled:
    """The lane of a call's profile, tool and price, or `_OFF` when a hold or block applies. Where a cap or the
    prepaid balance limits it, its lane is leased (with `leased`: else `_OFF`), decided as a call its leases cover
    (`covered`: the guardrails read an untouched budget), which is what it is while they do."""
    entry = book.entry(call.profile, call.tool)
    limited = entry is not None and limits_spend(entry.caps)
    if entry is None or (limited and not leased):
        return _OFF
    cost = to_micros(call.estimated_cost) or entry.price
    decision = decide_call(entry, call.instance, cost, covered(entry.caps, cost) if limited else _NO_SPEND)
    if decision.outcome is not Outcome.AUTO:  # a block or a hold is not decided on a lane
        return _OFF
    decided = orjson.dumps({"reason": decision.reason, "cost": decision.cost, "binding": call.binding}).decode()
    settled, released = settlement_row(None, "", "", True, cost, cost), settlement_row(None, "", "", False, cost, 0)
    return Lane(call.profile, call.tool, from_micros(cost), cost, decision.reason, decision.wire_trace, decided,
                settled, released, entry.caps, Settlement(from_micros(cost), None), limited)


def covered(caps: CapSet, cost: int) -> SpendState:
    """The spend state of a call its leases cover: nothing spent, a balance of exactly its price."""
    return SpendState(balance=cost) if caps.prepaid else _NO_SPEND
