"""The gate on the call path: admits each call, settles it after, answers `handler_status` and `handler_decide`.

A call that nothing holds is admitted on its lane (`lanes`): decided once per snapshot, so the call
costs a lookup, and, where a cap or the prepaid balance limits it, the subtraction of its price from
this router's budget leases while they cover it. Otherwise a call that a cap or the balance limits is
admitted here against the leases (`leasekeeper.LeaseKeeper`): its price is reserved on them in memory, and
`decide_call` decides on the spend state they stand for; when they lack room, one store transaction
takes more (or finds the cap reached, which the decision then names). The leases are counted in the
spend rows, so no cap is overspent however many calls or routers race. Either way, an executed
call's audit rows are recorded on the event loop's thread without a lock (`lanes.Records`: one row
for a call settled before its decision is written), and they, a blocked call's row and the spend of
the scopes no cap limits go to the backlog (`store.backlog`), as do settlements, committed a moment later
by its one writer (`recording.BacklogWriter`); a hold is written before the agent hears of it. `admit_now`
is the same decision in one store transaction with a reservation of its own, for callers off the
event loop. The `GovernedGate` puts this gate and the hold runner together as the router's `Gate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from reconciler.config.models import Outcome
from reconciler.config.snapshot import Snapshot
from reconciler.governance.charging import charge_call
from reconciler.governance.decide import Decision, SpendState, decide_call
from reconciler.governance.errors import (
    GovernanceError,
    HoldNotFoundError,
    NotAllowedError,
)
from reconciler.governance.gate import Admission, CallRequest, HoldStatus, Settlement
from reconciler.governance.holds import (
    LISTED_HOLDS,
    PENDING_HINT,
    Hold,
    caller_refusal,
    decide_hold,
    get_hold,
    hold_status,
    list_holds,
    new_request_id,
)
from reconciler.governance.lanes import Records, covered, limits_spend
from reconciler.governance.leasekeeper import LeaseKeeper
from reconciler.governance.leases import Lease
from reconciler.governance.ledger import (
    Reservation,
    current_month,
    ensure_rows,
    read_state,
    reserve,
    settlement_row,
)
from reconciler.governance.notices import Reach, add_notices, list_notices, pending_news, targets_for
from reconciler.governance.recording import BacklogWriter
from reconciler.governance.rulebook import ToolEntry, from_micros, to_micros
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store import Store, Transaction
from reconciler.governance.store.audit import AuditRow, audit_row, insert_audit
from reconciler.governance.store.holds import insert_hold
from reconciler.governance.workers import StoreWorkers

__all__ = ["Admissions"]

log = logging.getLogger("handler.governance")
_NO_SPEND = SpendState()
WITHDRAWER = "the service"  # who rejects the holds of a run that ended


@dataclass(slots=True)  # built on every capped call: plain slots, not frozen (a frozen dataclass takes 4x as long)
class _Charge:
    """Who a capped call's charge is for (`charging.Charged`: its fields read only when a violation names them)."""

    request_id: str
    call: CallRequest

    @property
    def profile(self) -> str:
        return self.call.profile

    @property
    def instance(self) -> str:
        return self.call.instance

    @property
    def binding(self) -> str:
        return self.call.binding

    @property
    def tool(self) -> str:
        return self.call.tool


@dataclass(slots=True)
class _LeasedTicket(_Charge):
    """The ticket of a capped call admitted on the event loop against this router's budget leases (`gate.Ticket`):
    its price reserved on `leased`, its charge added to `scopes` when it settles."""

    admissions: Admissions
    estimate: int  # its price, the most it may be charged
    scopes: tuple[str, ...]
    month: str
    leased: tuple[Lease, ...]

    def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        return self.admissions.settle_leased(self, None if actual_cost is None else to_micros(actual_cost), ok)


@dataclass(slots=True)
class _ReservedTicket(_Charge):
    """The ticket of a call admitted in one store transaction with a reservation of its own (`admit_now`)."""

    admissions: Admissions
    reservation: Reservation

    def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        return self.admissions.settle_reserved(self, None if actual_cost is None else to_micros(actual_cost), ok)


class Admissions:
    """Admission, settlement and the built-ins' answers, over one store."""

    def __init__(self, store: Store, workers: StoreWorkers, rulebooks: RulebookCache, keeper: LeaseKeeper, *,
                 batch_seconds: float, held: Callable[[], None], run_now: Callable[[str], Awaitable[None]],
                 seen: Callable[[Snapshot], None] | None = None) -> None:
        """`held` is called on the event loop when a hold was stored; `run_now` runs an approved hold here;
        `seen` is told of each snapshot calls come with, when it changes."""
        self.store = store
        self._keeper = keeper
        self._workers = workers
        self._rulebooks = rulebooks
        self._held = held
        self._run_now = run_now
        # What the calls on the event loop's thread left to write, and the one writer of it and of the backlog.
        self._records = Records(rulebooks, seen, keeper.book)
        self._writer = BacklogWriter(store, workers, self._records, batch_seconds)
        self._backlog = self._writer.backlog
        self._open = 0  # calls admitted here off their lanes and not yet settled (`Records` counts the lanes')
        self._closed = False  # then a settlement is written at once: nothing commits the backlog any more
        self._violations = 0  # reports above the reservation seen here since start, off the lanes
        # The channels this service can announce holds on (None: not said, every notice is queued as
        # pending) and where owners decide: what a held call's agent is told follows it.
        self.reach: Reach | None = None

    @property
    def pricing_violations(self) -> int:
        """How many calls settled here since start reported more than they reserved."""
        return self._violations + self._records.violations

    # --- admission -------------------------------------------------------------------------------

    async def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        if self._closed:  # its settlement would have nowhere to go
            return Admission("blocked", "Blocked: this router is shutting down; retry in a moment.")
        admitted = self._records.admit(snapshot, call)
        if admitted is not None:  # the common case: nothing limits or holds it
            if not self._writer.due:
                self._writer.soon()
            return admitted
        entry = self._rulebooks.rulebook(snapshot).entry(call.profile, call.tool)
        found = None
        if entry is not None:
            found = (await self._admit_leased(snapshot, entry, call) if limits_spend(entry.caps)
                     else self._refuse_unlimited(entry, call))
        admission = found if found is not None else await self._workers.run(self.admit_now, snapshot, call)
        if not self._writer.due and len(self._backlog):  # a flush due runs until the backlog is empty
            self._writer.soon()
        if admission.status == "pending":
            self._held()
        if admission.ticket is not None:  # off its lane: counted until settled
            self._open += 1
        return admission

    def _refuse_unlimited(self, entry: ToolEntry, call: CallRequest) -> Admission | None:
        """A call that no cap or balance limits and that is off its lane: blocked in memory when its rules
        refuse it; None otherwise (a hold is written before the agent hears of it, in `admit_now`)."""
        decision = decide_call(entry, call.instance, to_micros(call.estimated_cost) or entry.price, _NO_SPEND)
        if decision.outcome is not Outcome.BLOCK:
            return None
        request_id = new_request_id()
        self._backlog.add_audit(_decided_row(request_id, call, decision))
        return Admission("blocked", decision.reason, request_id, None, decision.wire_trace)

    async def _admit_leased(self, snapshot: Snapshot, entry: ToolEntry, call: CallRequest) -> Admission:
        """Decide a call a cap or the balance limits against this router's leases (see `leasekeeper`)."""
        cost = to_micros(call.estimated_cost) or entry.price
        needs = self._keeper.needs(entry.caps, entry.profile, call.instance, current_month())
        held: tuple[Lease, ...] | None = None
        decision = decide_call(entry, call.instance, cost, covered(entry.caps, cost))  # as if its leases cover it
        if entry.caps.suspended:  # a suspended org is refused before any lease is taken
            decision = decide_call(entry, call.instance, cost, _NO_SPEND)
        else:
            held = self._keeper.take(needs, cost)
            if held is None:
                waited = await self._keeper.wait(needs, cost)
                held = waited.held
                if held is None:  # the state as this router sees the store (other routers' leases spent): refused
                    decision = decide_call(entry, call.instance, cost, waited.refused or _NO_SPEND)
        if held is not None and decision.outcome is not Outcome.AUTO:
            self._keeper.give_back(held, cost)
        request_id = new_request_id()
        if decision.outcome is Outcome.APPROVE:
            return await self._workers.run(self._hold_now, snapshot, call, decision, request_id)
        if decision.outcome is Outcome.BLOCK or held is None:
            self._backlog.add_audit(_decided_row(request_id, call, decision))
            return Admission("blocked", decision.reason, request_id, None, decision.wire_trace)
        # Its record waits with the lanes': most often it is written as one row with its settlement.
        self._records.decided(request_id, _decided_row(request_id, call, decision))
        if not self._writer.due:
            self._writer.soon()
        # The scopes no cap limits are counted through the backlog when it is settled, as for a call nothing limits.
        ticket = _LeasedTicket(request_id, call, self, cost, needs.counted, needs.month, held)
        return Admission("executed", decision.reason, request_id, ticket, decision.wire_trace)

    def _hold_now(self, snapshot: Snapshot, call: CallRequest, decision: Decision, request_id: str) -> Admission:
        with self.store.begin() as tx:
            return self._store_hold(tx, snapshot, call, decision, request_id)

    def admit_now(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        """`admit` without the event loop: one store transaction, with a reservation of its own."""
        entry = self._rulebooks.rulebook(snapshot).entry(call.profile, call.tool)
        request_id = new_request_id()
        if entry is None:
            return self._refuse_unserved(snapshot, call, request_id)
        cost = to_micros(call.estimated_cost) or entry.price
        month = current_month()
        ensure_rows(self.store, entry.caps, call.profile, call.instance, month)
        # Only what the cap check needs happens under the row locks (read, decide, add); the records of
        # executed and blocked calls go to the backlog. A hold is written here, before the agent hears of it.
        with self.store.begin() as tx:
            state = read_state(self.store, tx, entry.caps, call.profile, call.instance,
                               lock=limits_spend(entry.caps), month=month)
            decision = decide_call(entry, call.instance, cost, state)
            if decision.outcome is Outcome.APPROVE:
                return self._store_hold(tx, snapshot, call, decision, request_id)
            reservation = None
            if decision.outcome is Outcome.AUTO:
                reservation = reserve(self.store, tx, entry.caps, call.profile, call.instance, cost, request_id,
                                      state, month, defer=self._backlog.add_reservation)
        self._backlog.add_audit(_decided_row(request_id, call, decision))
        if reservation is None:
            return Admission("blocked", decision.reason, request_id, None, decision.wire_trace)
        return Admission("executed", decision.reason, request_id, _ReservedTicket(request_id, call, self, reservation),
                         decision.wire_trace)

    def _refuse_unserved(self, snapshot: Snapshot, call: CallRequest, request_id: str) -> Admission:
        """A tool the profile does not serve in this snapshot: blocked, and recorded at once."""
        message = f"Blocked: profile {call.profile} serves no tool {call.tool} in revision {snapshot.revision}."
        with self.store.begin() as tx:
            insert_audit(tx, audit_row("blocked", request_id=request_id, profile=call.profile, instance=call.instance,
                                       tool=call.tool, status="blocked", detail={"reason": message}))
        return Admission("blocked", message, request_id)

    def _store_hold(self, tx: Transaction, snapshot: Snapshot, call: CallRequest, decision: Decision,
              request_id: str) -> Admission:
        """Store the hold with its notices and audit row in the admission's transaction; the agent's answer."""
        values = _hold_values(request_id, snapshot.revision, call, decision)
        insert_hold(tx, values)
        targets = targets_for(values["approver"], snapshot.org)
        add_notices(tx, request_id, targets, self.reach)
        if targets:
            self.store.notify(tx, request_id)  # other routers' notifiers hear of it at once
        insert_audit(tx, _decided_row(request_id, call, decision))
        news = pending_news(request_id, values["approver"], targets, self.reach)
        told = " ".join(filter(None, (decision.reason, news, PENDING_HINT)))
        return Admission("pending", told, request_id, None, decision.wire_trace)

    # --- settlement ------------------------------------------------------------------------------

    async def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        """Charge an admitted call what it reported, never more than its reservation (`charging`), by its ticket."""
        ticket = admission.ticket
        if ticket is None:
            return Settlement(0.0, None)
        settled = ticket.settle(admission, actual_cost, ok)
        if self._closed:  # a call that outlived `aclose` (the router closes after governance): written now
            await asyncio.to_thread(self._writer.write_late, self._records.take(everything=True))
            if settled.remaining is not None:  # a budget applied: what its leases no longer need goes back now
                await self._keeper.settled_after_close()
        elif not self._writer.due:
            self._writer.soon()
        return settled

    def settle_leased(self, ticket: _LeasedTicket, reported: int | None, ok: bool) -> Settlement:
        """Settle a call admitted against leases (on the event loop, where this runs): its decision waits in the
        records, its charge in the backlog, and its leases get back what it did not spend."""
        try:
            charge = charge_call(ticket, ticket.estimate, reported, ok)
            if charge.violation is not None:
                self._violations += 1
            self._records.settled(ticket.request_id, ticket.call, ok, ticket.estimate, charge.charged,
                                  charge.violation)
            self._backlog.add_spend(ticket.scopes, ticket.month, charge.charged)
            if ticket.leased:
                left = self._keeper.settle(ticket.leased, ticket.estimate, charge.charged)
                return Settlement(from_micros(charge.charged), from_micros(left))
            return Settlement(from_micros(charge.charged), None)
        finally:
            self._open = max(0, self._open - 1)

    def settle_reserved(self, ticket: _ReservedTicket, reported: int | None, ok: bool) -> Settlement:
        """Settle a call admitted with a reservation of its own: its settlement row and the reservation's settlement
        (and any pricing violation) go to the backlog."""
        try:
            held = ticket.reservation
            charge = charge_call(ticket, held.reserved, reported, ok)
            delta = charge.charged - held.reserved
            call = ticket.call
            self._backlog.add_audit(settlement_row(ticket.request_id, call.profile, call.instance, ok, held.reserved,
                                                   charge.charged))
            if charge.violation is not None:
                self._violations += 1
                self._backlog.add_audit(charge.violation)
            self._backlog.add_settlement(held.id, charge.charged, ok, delta, held.scopes, held.month, held.account)
            remaining = None if held.remaining is None else max(0, held.remaining - delta)
            return Settlement(from_micros(charge.charged), None if remaining is None else from_micros(remaining))
        finally:
            self._open = max(0, self._open - 1)  # a call admitted by `admit_now` directly was never counted

    # --- the built-ins: handler_status, handler_decide -------------------------------------------

    async def _visible_hold(self, request_id: str, caller: CallRequest) -> Hold | None:
        """The hold `request_id` if this caller may know of it: a caller of its profile, or the instance that
        started its agent. To anyone else it does not exist, so the built-ins answer as for an unknown id."""
        try:
            hold = await self._workers.run(get_hold, self.store, request_id)
        except HoldNotFoundError:
            return None
        parent = caller.proven and caller.instance == hold.parent_instance
        return hold if caller.profile == hold.profile or parent else None

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus:
        hold = await self._visible_hold(request_id, caller)
        if hold is None:
            return HoldStatus("unknown", f"no request '{request_id}'")
        if hold.state != "pending":
            return hold_status(hold)
        notices = await self._workers.run(list_notices, self.store, hold.id)  # who was really told, so far
        return hold_status(hold, pending_news(hold.id, hold.approver, notices, self.reach))

    async def waiting(self, caller: CallRequest) -> list[Mapping[str, Any]]:
        """The pending holds whose agent this proven run started and that are routed to it (`caller_refusal`)."""
        if not caller.proven:
            return []
        holds = await self._workers.run(list_holds, self.store, ("pending",), LISTED_HOLDS)
        return [{"request_id": h.id, "profile": h.profile, "instance": h.instance, "tool": h.tool,
                 "arguments": dict(h.arguments), "reason": h.reason} for h in holds
                if h.parent_instance == caller.instance and caller_refusal(h, caller) is None]

    async def withdraw(self, instance: str, why: str) -> int:
        """Reject the pending holds of the ended run `instance`, each once (one decided meanwhile stays decided)."""
        holds = await self._workers.run(list_holds, self.store, ("pending",), None)
        withdrawn = 0
        for hold in (h for h in holds if h.instance == instance):
            with contextlib.suppress(NotAllowedError):
                await self._workers.run(functools.partial(decide_hold, self.store, hold.id, "reject", WITHDRAWER,
                                                          reason=f"its run ended: {why}"))
                withdrawn += 1
        return withdrawn

    async def decide(self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest,
                     reason: str | None = None) -> HoldStatus:
        hold = await self._visible_hold(request_id, caller)
        if hold is None:
            return HoldStatus("unknown", f"no request '{request_id}'")
        refusal = caller_refusal(hold, caller)
        if refusal is not None:
            return HoldStatus("blocked", refusal)
        try:
            await self._workers.run(functools.partial(decide_hold, self.store, request_id, decision,
                                                      f"instance {caller.instance}", reason=reason))
        except (NotAllowedError, GovernanceError) as exc:
            return HoldStatus("blocked", str(exc))
        if decision == "approve":
            # Run it here and now, so the orchestrator gets the result in the reply; the claim keeps it
            # exactly once if the loop (or another router) reaches it first.
            await self._run_now(request_id)
        return hold_status(await self._workers.run(get_hold, self.store, request_id))

    # --- the backlog -----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Admit no more and commit the backlog; a call admitted here and still running is recorded (straight
        into the store) when it is settled, so no settlement is lost to closing first (docs/architecture.md §7)."""
        self._closed = True
        if running := self._open + self._records.running:
            log.info("%d calls admitted here are still running; each is recorded when it ends", running)
        await self._keeper.aclose()
        await self._writer.aclose()

    async def flush(self) -> None:
        """Commit what waits now (tests, shutdown), with the decision of every call still running."""
        await self._writer.flush()

    def flush_now(self) -> bool:
        """Commit what waits in the backlog on this thread (a worker's); False when the store failed."""
        return self._writer.flush_now()


def _decided_row(request_id: str, call: CallRequest, decision: Decision) -> AuditRow:
    """The audit row of a decision, whichever way the call went."""
    key = (decision.reason, decision.cost, call.binding, decision.cap)
    detail = _DETAILS.get(key)
    if detail is None:
        shown: dict[str, Any] = {"reason": decision.reason, "cost": decision.cost, "binding": call.binding}
        if decision.cap:
            shown["cap"] = decision.cap
        if len(_DETAILS) >= _DETAILS_KEPT:
            _DETAILS.clear()
        detail = _DETAILS[key] = orjson.dumps(shown).decode()
    return audit_row("decided", request_id=request_id, profile=call.profile, instance=call.instance, tool=call.tool,
                     status=decision.status, detail=detail)


# A decision's detail as JSON, by what it holds: the same few decisions recur call after call.
_DETAILS: dict[tuple[str, int, str, str | None], str] = {}
_DETAILS_KEPT = 4096


def _hold_values(request_id: str, revision: str, call: CallRequest, decision: Decision) -> dict[str, Any]:
    return {
        "id": request_id, "revision": revision, "profile": call.profile, "instance": call.instance,
        "parent_instance": call.parent_instance, "interface": call.interface, "tool": call.tool,
        "binding": call.binding, "arguments": dict(call.arguments), "cost": decision.cost,
        "approver": _approver(call, decision), "reason": decision.reason,
        "trace": list(decision.wire_trace),
    }


def _approver(call: CallRequest, decision: Decision) -> dict[str, Any] | None:
    """Whom the hold goes to. Routed to the caller, a proven run a member started (no parent run) goes to that
    member, as a hold routed to them: their approvals page, their channels, theirs to decide (docs/agents.md)."""
    approver = decision.approver.to_dict() if decision.approver else None
    if approver is not None and approver.get("to") == "caller" and call.proven and call.parent_instance is None \
            and call.member is not None:
        return {"to": "member", "member": call.member, "via": "caller"}
    return approver

