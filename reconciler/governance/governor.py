"""The real `Gate`: decides every call, holds what needs a person, reserves and settles spend.

The router calls `admit` before dispatch and `settle` after, and serves `handler_status` and
`handler_decide` through `status` and `decide`. Each admission is one store transaction: the spend
rows are read (locked when a cap or balance applies), `decide_call` decides on exactly that state,
and the reservation, the hold or the refusal is written with its audit row before the transaction
ends — so no cap is overspent however many calls or routers race.

Approved holds are run by a background loop (`start(executor)`): it finds approved holds in the
store (woken by PostgreSQL NOTIFY, else a short poll), claims each atomically, checks the binding,
explicit blocks and guardrails again on the live snapshot, runs it through the router's executor
and records the result, exactly once. Store work runs in a small thread pool, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import sys
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from reconciler.config.models import Outcome
from reconciler.config.snapshot import Snapshot
from reconciler.governance.decide import Decision, SpendState, Step, decide_call, guardrail_block
from reconciler.governance.errors import HoldNotFoundError, NotAllowedError, StoreError
from reconciler.governance.gate import Admission, CallRequest, CallResult, Executor, HoldStatus, Settlement
from reconciler.governance.holds import (
    PENDING_HINT,
    Hold,
    approved_ids,
    caller_refusal,
    claim_hold,
    decide_hold,
    finish_hold,
    get_hold,
    hold_status,
    new_request_id,
)
from reconciler.governance.ledger import (
    Reservation,
    current_month,
    ensure_rows,
    read_state,
    reserve,
    scopes_for,
    settle,
    settlement_row,
)
from reconciler.governance.notices import add_notices, describe, targets_for
from reconciler.governance.rulebook import CapSet, Rulebook, ToolEntry, compile_rulebook, from_micros, to_micros
from reconciler.governance.store import Store, open_store, store_url
from reconciler.governance.store.audit import audit_row, insert_audit, record
from reconciler.governance.store.backlog import Backlog
from reconciler.governance.store.holds import insert_hold
from reconciler.governance.store.listening import HoldListener

__all__ = ["Governor"]

T = TypeVar("T")
_NO_SPEND = SpendState()
_MAX_TRACES = 50_000


@dataclass(frozen=True, slots=True)
class _Unlimited:
    """Spend of a call nothing limits: counted through the backlog, never checked."""

    scopes: tuple[str, ...]
    month: str
    estimate: int
    profile: str
    instance: str


@dataclass(frozen=True, slots=True)
class _Token:
    request_id: str
    reservation: Reservation | None
    unlimited: _Unlimited | None = None


def _limits_spend(caps: CapSet) -> bool:
    return caps.prepaid or caps.org is not None or caps.profile is not None or caps.instance is not None


class Governor:
    """Governance backed by a store (SQLite or PostgreSQL); implements the router's `Gate`."""

    def __init__(self, store: Store, *, poll_seconds: float = 0.25, owns_store: bool = True,
                 batch_seconds: float = 0.05) -> None:
        self.store = store
        self.runner_id = "router-" + secrets.token_hex(6)
        self._poll = poll_seconds
        self._owns_store = owns_store
        self._books: dict[int, tuple[Snapshot, Rulebook]] = {}
        self._books_lock = threading.Lock()
        self._snapshot: Snapshot | None = None
        self._executor: Executor | None = None
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="handler-store")
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[bool]] = {}
        self._listener: HoldListener | None = None
        self._stopping = False
        self._backlog = Backlog()
        self._batch_seconds = batch_seconds
        self._flushing: asyncio.Task[None] | None = None
        self._traces: dict[int, tuple[tuple[Step, ...], tuple[Mapping[str, Any], ...]]] = {}
        # Called on the event loop when a hold was stored here or (PostgreSQL) by another router: the
        # notifier of `handler up` sends its notices at once instead of at its next poll.
        self.on_hold: Callable[[], None] | None = None

    @classmethod
    def from_env(cls, root: str | Path = ".", env: Mapping[str, str] | None = None, *,
                 state_dir: Path | None = None) -> Governor:
        """Open (and migrate, under a lock) the store named by the environment; see `store_url`."""
        return cls(open_store(store_url(root, env, state_dir=state_dir)))

    # --- compiled snapshots ----------------------------------------------------------------------

    def rulebook(self, snapshot: Snapshot) -> Rulebook:
        """The snapshot's compiled tables, built on first use and kept for the latest few snapshots."""
        key = id(snapshot)
        found = self._books.get(key)
        if found is not None and found[0] is snapshot:
            return found[1]
        with self._books_lock:
            book = compile_rulebook(snapshot)
            if len(self._books) >= 4:
                self._books.pop(next(iter(self._books)))
            self._books[key] = (snapshot, book)  # the snapshot is kept so its id is not reused
        return book

    def use_snapshot(self, snapshot: Snapshot) -> None:
        """The live snapshot, against which approved holds are checked again before they run."""
        self._snapshot = snapshot
        if self._wake is not None:
            self._wake.set()

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    # --- the Gate --------------------------------------------------------------------------------

    async def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        if self._snapshot is None:  # until the router says which snapshot is live, the first one seen is
            self.use_snapshot(snapshot)
        quick = self._admit_unlimited(snapshot, call)
        if quick is not None:
            return quick
        admission = await self._io(self.admit_now, snapshot, call)
        if len(self._backlog):
            self._flush_soon()
        if admission.status == "pending" and self.on_hold is not None:
            self.on_hold()
        return admission

    def _admit_unlimited(self, snapshot: Snapshot, call: CallRequest) -> Admission | None:
        """Decide in memory a call that no cap or balance limits and that is not held; None otherwise."""
        entry = self.rulebook(snapshot).entry(call.profile, call.tool)
        if entry is None or _limits_spend(entry.caps):
            return None
        cost = to_micros(call.estimated_cost) or entry.price
        decision = decide_call(entry, call.instance, cost, _NO_SPEND)
        if decision.outcome is Outcome.APPROVE:
            return None  # a hold is written before the agent hears of it
        request_id = new_request_id()
        self._backlog.add_audit(audit_row("decided", request_id=request_id, profile=call.profile,
                                          instance=call.instance, tool=call.tool, status=decision.status,
                                          detail={"reason": decision.reason, "cost": cost, "binding": call.binding}))
        self._flush_soon()
        trace = self._trace_dicts(decision.trace)
        if decision.outcome is Outcome.BLOCK:
            return Admission("blocked", decision.reason, request_id, None, trace)
        unlimited = _Unlimited(scopes_for(entry.caps, call.profile, call.instance), current_month(), cost,
                               call.profile, call.instance)
        return Admission("executed", decision.reason, request_id, _Token(request_id, None, unlimited), trace)

    def _trace_dicts(self, trace: tuple[Step, ...]) -> tuple[Mapping[str, Any], ...]:
        # Traces of cached decisions are shared objects: their wire form is worked out once each.
        found = self._traces.get(id(trace))
        if found is None or found[0] is not trace:
            if len(self._traces) > _MAX_TRACES:  # old snapshots' decisions: let them go
                self._traces.clear()
            found = self._traces[id(trace)] = (trace, tuple(s.to_dict() for s in trace))
        return found[1]

    def _flush_soon(self) -> None:
        if self._flushing is None or self._flushing.done():
            self._flushing = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        await asyncio.sleep(self._batch_seconds)  # gather what the next moments bring into one commit
        await self.flush()

    async def flush(self) -> None:
        """Commit the backlog of unlimited calls now (tests, shutdown)."""
        try:
            await self._io(self._backlog.flush, self.store)
        except StoreError as exc:  # the decisions stand; only their record is late or lost
            print(f"handler: could not record {len(self._backlog)} audit/spend rows: {exc}", file=sys.stderr)

    def admit_now(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        """`admit` without the event loop: one store transaction."""
        book = self.rulebook(snapshot)
        entry = book.entry(call.profile, call.tool)
        request_id = new_request_id()
        if entry is None:
            message = f"Blocked: profile {call.profile} serves no tool {call.tool} in revision {snapshot.revision}."
            with self.store.begin() as conn:
                record(conn, "blocked", request_id=request_id, profile=call.profile, instance=call.instance,
                       tool=call.tool, status="blocked", detail={"reason": message})
            return Admission("blocked", message, request_id)
        cost = to_micros(call.estimated_cost) or entry.price
        caps = entry.caps
        limited = caps.prepaid or any(c is not None for c in (caps.org, caps.profile, caps.instance))
        month = current_month()
        ensure_rows(self.store, caps, call.profile, call.instance, month)
        # Only what the cap check needs happens under the row locks (read, decide, add); the records of
        # executed and blocked calls go to the backlog. A hold is written here, before the agent hears of it.
        with self.store.begin() as conn:
            state = read_state(self.store, conn, caps, call.profile, call.instance, lock=limited, month=month)
            decision = decide_call(entry, call.instance, cost, state)
            res = None
            if decision.outcome is Outcome.AUTO:
                res = reserve(self.store, conn, caps, call.profile, call.instance, cost, request_id, state, month,
                              defer=self._backlog.add_reservation)
            trace = self._trace_dicts(decision.trace)
            detail = {"reason": decision.reason, "cost": cost, "binding": call.binding}
            if decision.cap:
                detail["cap"] = decision.cap
            if decision.outcome is Outcome.APPROVE:
                values = _hold_values(request_id, snapshot.revision, call, decision, cost, trace)
                insert_hold(conn, values)
                targets = targets_for(values["approver"], snapshot.org)
                add_notices(conn, request_id, targets)
                if targets:
                    self.store.notify(conn, request_id)  # other routers' notifiers hear of it at once
                insert_audit(conn, audit_row("decided", request_id=request_id, profile=call.profile,
                                             instance=call.instance, tool=call.tool, status=decision.status,
                                             detail=detail))
                told = " ".join(filter(None, (decision.reason, describe(targets), PENDING_HINT)))
                return Admission("pending", told, request_id, None, trace)
        self._backlog.add_audit(audit_row("decided", request_id=request_id, profile=call.profile,
                                          instance=call.instance, tool=call.tool, status=decision.status,
                                          detail=detail))
        if res is not None:
            return Admission("executed", decision.reason, request_id, _Token(request_id, res), trace)
        return Admission("blocked", decision.reason, request_id, None, trace)

    async def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        token = admission.token
        if isinstance(token, _Token) and token.unlimited is not None:
            spent = token.unlimited
            charged = (spent.estimate if actual_cost is None else to_micros(actual_cost)) if ok else 0
            self._backlog.add_spend(spent.scopes, spent.month, charged)
            self._backlog.add_audit(settlement_row(token.request_id, spent.profile, spent.instance, ok,
                                                   spent.estimate, charged))
            self._flush_soon()
            return Settlement(from_micros(charged), None)
        if not isinstance(token, _Token) or token.reservation is None:
            return Settlement(0.0, None)
        res = token.reservation
        charged = (res.reserved if actual_cost is None else to_micros(actual_cost)) if ok else 0
        delta = charged - res.reserved
        self._backlog.add_settlement(res.id, charged, ok, delta, res.scopes, res.month, res.account)
        self._backlog.add_audit(settlement_row(token.request_id, res.profile, res.instance, ok, res.reserved,
                                               charged))
        self._flush_soon()
        remaining = None if res.remaining is None else max(0, res.remaining - delta)
        return Settlement(from_micros(charged), None if remaining is None else from_micros(remaining))

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus:
        try:
            hold = await self._io(get_hold, self.store, request_id)
        except HoldNotFoundError:
            return HoldStatus("unknown", f"no request '{request_id}'")
        if caller.profile != hold.profile and caller.instance != hold.parent_instance:
            return HoldStatus("unknown", f"no request '{request_id}'")
        return hold_status(hold)

    async def decide(self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest) -> HoldStatus:
        try:
            hold = await self._io(get_hold, self.store, request_id)
        except HoldNotFoundError:
            return HoldStatus("unknown", f"no request '{request_id}'")
        refusal = caller_refusal(hold, caller)
        if refusal is not None:
            return HoldStatus("blocked", refusal)
        try:
            await self._io(decide_hold, self.store, request_id, decision, f"instance {caller.instance}")
        except NotAllowedError as exc:
            return HoldStatus("blocked", str(exc))
        if decision == "approve" and self._executor is not None:
            # Run it here and now, so the orchestrator gets the result in the reply; the claim keeps it
            # exactly once if the loop (or another router) reaches it first.
            await asyncio.shield(self._spawn(request_id))
        return hold_status(await self._io(get_hold, self.store, request_id))

    # --- running approved holds ------------------------------------------------------------------

    async def start(self, executor: Executor) -> None:
        """Run approved holds from now on (also those approved while no router was up)."""
        self._executor = executor
        self._wake = asyncio.Event()
        if self.store.dialect == "postgresql":
            loop = asyncio.get_running_loop()
            self._listener = HoldListener(self.store, lambda: loop.call_soon_threadsafe(self._heard))
            self._listener.start()
        self._loop_task = asyncio.create_task(self._run_loop(), name="handler-holds")

    def _heard(self) -> None:
        """A hold changed in the store, here or in another router (PostgreSQL NOTIFY)."""
        if self._wake is not None:
            self._wake.set()
        if self.on_hold is not None:
            self.on_hold()

    async def _run_loop(self) -> None:
        assert self._wake is not None  # noqa: S101 - set by start() before the task exists
        while not self._stopping:
            self._wake.clear()
            if self._snapshot is not None:
                await self.run_approved()
            if self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll)

    async def run_approved(self) -> int:
        """Start every approved hold not yet running here; returns how many were started."""
        ids = await self._io(approved_ids, self.store)
        fresh = [rid for rid in ids if rid not in self._running]
        for rid in fresh:
            self._spawn(rid)
        return len(fresh)

    def _spawn(self, request_id: str) -> asyncio.Task[bool]:
        """The task running this hold here: the one already started, or a new one."""
        task = self._running.get(request_id)
        if task is None:
            task = asyncio.create_task(self.run_hold(request_id), name=f"hold-{request_id}")
            self._running[request_id] = task
            task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[bool]) -> None:
        for rid, running in list(self._running.items()):
            if running is task:
                del self._running[rid]

    async def run_hold(self, request_id: str) -> bool:
        """Claim and run one approved hold; False when another runner (or an earlier run) had it."""
        if self._executor is None or self._snapshot is None:
            return False
        if not await self._io(claim_hold, self.store, request_id, self.runner_id):
            return False
        hold = await self._io(get_hold, self.store, request_id)
        snapshot = self._snapshot
        recheck = await self._io(self._recheck, snapshot, hold)
        if isinstance(recheck, str):
            await self._io(_finish, self.store, request_id, False, None, recheck, None)
            return True
        call = CallRequest(hold.profile, hold.instance, hold.parent_instance, hold.interface, hold.tool,
                           hold.binding, hold.arguments, from_micros(hold.cost))
        try:
            result = await self._executor(call)
        except Exception as exc:  # the router's executor failed: the hold fails, it is never retried
            result = CallResult(False, {"error": "unavailable", "message": f"the call could not run: {exc}"})
        ok, output = result.ok, result.output
        actual = to_micros(result.cost) if ok and result.cost is not None else None
        charged, _ = await self._io(settle, self.store, recheck, actual, ok, request_id)
        message = "" if ok else str(output.get("message") or output.get("error") or "the call failed")
        await self._io(_finish, self.store, request_id, ok, dict(output), message, charged)
        return True

    def _recheck(self, snapshot: Snapshot, hold: Hold) -> Reservation | str:
        """At run time: the binding, explicit blocks and guardrails again; a reservation or the reason."""
        if hold.binding not in snapshot.bindings:
            return f"the binding {hold.binding} this call was held on is gone from the config"
        entry: ToolEntry | None = self.rulebook(snapshot).entry(hold.profile, hold.tool)
        if entry is None:
            return f"profile {hold.profile} no longer serves {hold.tool}"
        month = current_month()
        ensure_rows(self.store, entry.caps, hold.profile, hold.instance, month)
        with self.store.begin() as conn:
            state = read_state(self.store, conn, entry.caps, hold.profile, hold.instance, lock=True, month=month)
            blocked = guardrail_block(entry.caps, hold.profile, hold.instance, hold.cost, state)
            if blocked is not None:
                return f"blocked since it was approved: {blocked[1]}"
            now = decide_call(entry, hold.instance, hold.cost, state)
            if now.outcome is Outcome.BLOCK:
                return f"blocked since it was approved: {now.reason}"
            return reserve(self.store, conn, entry.caps, hold.profile, hold.instance, hold.cost, hold.id, state,
                           month)

    async def aclose(self) -> None:
        """Stop the loop, let running holds finish, close the store."""
        # The loop is told to stop rather than cancelled: a cancellation arriving as `wait_for` times
        # out can be lost (Python 3.11), which would leave the loop running and this waiting forever.
        self._stopping = True
        if self._wake is not None:
            self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        if self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)
        if self._listener is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._listener.stop)
        if self._flushing is not None:  # close() below commits what it was waiting to gather
            self._flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flushing
        self.close()

    def close(self) -> None:
        try:
            self._backlog.flush(self.store)
        except StoreError as exc:
            print(f"handler: could not record {len(self._backlog)} audit/spend rows: {exc}", file=sys.stderr)
        self._pool.shutdown(wait=True)
        if self._owns_store:
            self.store.close()


def _finish(store: Store, rid: str, ok: bool, result: Mapping[str, Any] | None, message: str,
            charged: int | None) -> None:
    finish_hold(store, rid, ok=ok, result=result, message=message, charged=charged)


def _hold_values(rid: str, revision: str, call: CallRequest, decision: Decision, cost: int,
                 trace: tuple[Mapping[str, Any], ...]) -> dict[str, Any]:
    return {
        "id": rid, "revision": revision, "profile": call.profile, "instance": call.instance,
        "parent_instance": call.parent_instance, "interface": call.interface, "tool": call.tool,
        "binding": call.binding, "arguments": dict(call.arguments), "cost": cost,
        "approver": decision.approver.to_dict() if decision.approver else None, "reason": decision.reason,
        "trace": list(trace),
    }
