"""The runner of approved holds: finds them, claims each once, checks it again, runs it, records the end.

`start(executor)` starts a loop that looks for approved holds in the store — woken by PostgreSQL
NOTIFY (`store.listening`) or by a decision taken here, else every `poll_seconds` (while LISTEN is up,
only every `LISTENING_POLL_SECONDS`, in case a notification was lost) — and also finds
those approved while no router ran. Each hold is claimed atomically (`holds.claim_hold`: of all the
routers sharing the store exactly one wins), then checked again on the live snapshot: its binding,
the explicit blocks and the guardrails, with its price reserved as it would be for a new call. It
then runs through the router's executor (`Router.execute_held`), is settled at the cost the
connector reported (else the price), never above what was reserved (`charging`), and finished
with its result or the reason it failed: for the agent, its message without advice to retry (the
state is final), for people also its cause (what the router and the connector said). A hold is
never run twice: one that failed, or whose router died while running it, stays so. A store that
fails once the call has run does not lose its end: the settlement left unwritten counts at the
reservation until reconciled (over, never under), and the end is written again until it lands.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.config.models import Outcome
from reconciler.config.snapshot import Snapshot
from reconciler.governance.decide import decide_call, guardrail_block
from reconciler.governance.errors import StoreError, StoreRefusedError
from reconciler.governance.gate import CallRequest, CallResult, Executor
from reconciler.governance.holds import Hold, approved_ids, claim_hold, finish_hold, get_hold
from reconciler.governance.ledger import HeldTicket, Reservation, current_month, ensure_rows, read_state, reserve
from reconciler.governance.rulebook import CapSet, ToolEntry, from_micros, to_micros
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store import Store
from reconciler.governance.store.listening import HoldListener
from reconciler.governance.workers import StoreWorkers

__all__ = ["HoldRunner"]

log = logging.getLogger("handler.governance")


_RETRY_SECONDS = 1.0  # the first pause before recording a hold's end again while the store fails, doubled each time
_MOST_RETRY_SECONDS = 30.0

# How often the runner looks for approved holds while PostgreSQL's LISTEN connection is up, which wakes it at every
# decision: only in case a notification was lost.
LISTENING_POLL_SECONDS = 5.0


class HoldRunner:
    """Runs the approved holds of one store, each exactly once across every router sharing it."""

    def __init__(self, store: Store, workers: StoreWorkers, rulebooks: RulebookCache, *, poll_seconds: float,
                 heard: Callable[[], None], make_room: Callable[[CapSet, str, str, str], bool] | None = None,
                 runner_id: str | None = None, release_credit: Callable[[], None] | None = None) -> None:
        """`heard` is called on the event loop when another router changed a hold (PostgreSQL NOTIFY);
        `make_room` gives back the unused part of this router's budget leases on a call's caps, and `release_credit`
        (on the event loop, first) the credit the lanes hold on them."""
        self.store = store
        self._make_room = make_room
        self._release_credit = release_credit
        self.runner_id = runner_id or "router-" + secrets.token_hex(6)
        self.snapshot: Snapshot | None = None  # the live snapshot, against which holds are checked again
        self._workers = workers
        self._rulebooks = rulebooks
        self._poll = poll_seconds
        self._heard_elsewhere = heard
        self._executor: Executor | None = None
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._running: dict[str, asyncio.Task[bool]] = {}
        self._listener: HoldListener | None = None
        self._stopping = False
        self._unread = False  # the last poll could not read the store (said once in the log, until it can again)

    @property
    def listening(self) -> bool:
        """Whether PostgreSQL's LISTEN connection is up, so every decision wakes this runner at once."""
        return self._listener is not None and self._listener.connected

    def use_snapshot(self, snapshot: Snapshot) -> None:
        """The live snapshot, against which approved holds are checked again before they run."""
        self.snapshot = snapshot
        if self._wake is not None:
            self._wake.set()

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
        self._heard_elsewhere()

    async def _run_loop(self) -> None:
        assert self._wake is not None  # noqa: S101 - set by start() before the task exists
        while not self._stopping:
            self._wake.clear()
            if self.snapshot is not None:
                await self._poll_store()
            if self._stopping:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(self._poll, LISTENING_POLL_SECONDS) if self.listening
                                       else self._poll)

    async def _poll_store(self) -> None:
        """`run_approved`, for the loop: a store that cannot be read now (down, restarting, a lock held past its
        timeout) is read again at the next poll. Raised, it ended the loop, and this router ran no approved hold
        again until it restarted."""
        try:
            await self.run_approved()
        except StoreError as exc:
            if not self._unread:
                self._unread = True
                log.warning("cannot read the approved holds from the store (%s); trying again every %.2g s, approved "
                            "holds wait there until it answers", exc, self._poll)
            return
        if self._unread:
            self._unread = False
            log.warning("the approved holds are read from the store again")

    async def run_approved(self) -> int:
        """Start every approved hold not yet running here; returns how many were started."""
        ids = await self._workers.run(approved_ids, self.store)
        fresh = [rid for rid in ids if rid not in self._running]
        for rid in fresh:
            self._spawn(rid)
        return len(fresh)

    async def run_now(self, request_id: str) -> None:
        """Run a hold just approved here and wait for it to end (nothing, before `start`)."""
        if self._executor is not None:
            await asyncio.shield(self._spawn(request_id))

    def _spawn(self, request_id: str) -> asyncio.Task[bool]:
        """The task running this hold here: the one already started, or a new one."""
        task = self._running.get(request_id)
        if task is None:
            task = asyncio.create_task(self.run_hold(request_id), name=f"hold-{request_id}")
            self._running[request_id] = task
            task.add_done_callback(lambda done: self._forget(request_id, done))
        return task

    def _forget(self, request_id: str, task: asyncio.Task[bool]) -> None:
        if self._running.get(request_id) is task:
            del self._running[request_id]

    async def run_hold(self, request_id: str) -> bool:
        """Claim and run one approved hold; False when another runner (or an earlier run) had it."""
        if self._executor is None or self.snapshot is None:
            return False
        if not await self._workers.run(claim_hold, self.store, request_id, self.runner_id):
            return False
        hold = await self._workers.run(get_hold, self.store, request_id)
        if self._release_credit is not None:  # what the lanes hold of the leases is room `make_room` may give back
            self._release_credit()
        recheck = await self._workers.run(self._recheck, self.snapshot, hold)  # the snapshot live now
        if isinstance(recheck, str):
            await self._workers.run(_finish, self.store, hold, False, None, recheck, None, None)
            return True
        result = await self._execute(self._executor, hold)
        try:  # at the cost it reported, a failure's too (the call log's cost)
            charged = to_micros((await self._workers.run(recheck.settle, None, result.cost, result.ok)).charged)
        except StoreError as exc:  # left reserved: charged what it reserved when reconciled, as a killed router's
            log.warning("hold %s ran, but its settlement could not be written: it counts at its reservation until "
                        "reconciled: %s", request_id, exc)
            charged = recheck.reservation.reserved
        output = dict(result.output) if result.ok else _final_output(result.output)
        message = "" if result.ok else _failure_message(output)
        cause = None if result.ok else _without_retry_advice(result.cause or message)
        await self._finish_for_good(hold, result.ok, output, message, charged, cause)
        return True

    async def _finish_for_good(self, hold: Hold, ok: bool, output: Mapping[str, Any], message: str, charged: int,
                               cause: str | None) -> None:
        """Record the end of a hold that ran, trying again while the store fails (the end kept here meanwhile), so
        a moment's outage leaves no hold running for good; given up only when the runner stops. An end the store
        refuses for its data (which a retry meets again) is recorded as failed, naming the store's reason."""
        pause = _RETRY_SECONDS
        dropped = False  # the call's own output and words, once the store refused them
        while True:
            try:
                await self._workers.run(_finish, self.store, hold, ok, output, message, charged, cause)
            except StoreRefusedError as exc:
                if dropped:  # refused again: nothing of the call's own is left to drop
                    log.error("hold %s ran, but the store refused its end: it stays running: %s", hold.id, exc)
                    raise
                log.error("hold %s ran, but the store refused its end (%s): it is recorded as failed", hold.id, exc)
                message = "the call ran, but its result could not be stored"
                ok, output, cause, dropped = False, {"error": "unavailable", "message": message}, str(exc), True
            except StoreError as exc:
                if self._stopping:
                    log.error("hold %s ran, but its end could not be recorded before the router stopped; it stays "
                              "running: %s", hold.id, exc)
                    raise
                log.warning("hold %s ran, but its end is not recorded yet, will try again in %.0f s: %s", hold.id,
                            pause, exc)
                await asyncio.sleep(pause)
                pause = min(pause * 2, _MOST_RETRY_SECONDS)
            else:
                return

    @staticmethod
    async def _execute(executor: Executor, hold: Hold) -> CallResult:
        call = CallRequest(hold.profile, hold.instance, hold.parent_instance, hold.interface, hold.tool,
                           hold.binding, hold.arguments, from_micros(hold.cost))
        try:
            return await executor(call)
        except Exception as exc:  # the router's executor failed: the hold fails, it is never retried
            return CallResult(False, {"error": "unavailable", "message": f"the call could not run: {exc}"},
                              cause=f"the router could not run it: {type(exc).__name__}: {exc}")

    def _recheck(self, snapshot: Snapshot, hold: Hold) -> HeldTicket | str:
        """At run time: the binding, explicit blocks and guardrails again; the ticket of its new reservation, or the
        reason it may not run."""
        if hold.binding not in snapshot.bindings:
            return f"the binding {hold.binding} this call was held on is gone from the config"
        entry = self._rulebooks.rulebook(snapshot).entry(hold.profile, hold.tool)
        if entry is None:
            return f"profile {hold.profile} no longer serves {hold.tool}"
        month = current_month()
        ensure_rows(self.store, entry.caps, hold.profile, hold.instance, month)
        found = self._reserve(entry, hold, month)
        # What this router's own leases hold unused is room for this call too: given back, then tried again.
        if isinstance(found, str) and self._make_room is not None and self._make_room(
                entry.caps, hold.profile, hold.instance, month):
            found = self._reserve(entry, hold, month)
        return found if isinstance(found, str) else HeldTicket(self.store, found, hold.id, hold.binding, hold.tool)

    def _reserve(self, entry: ToolEntry, hold: Hold, month: str) -> Reservation | str:
        with self.store.begin() as tx:
            state = read_state(self.store, tx, entry.caps, hold.profile, hold.instance, lock=True, month=month)
            blocked = guardrail_block(entry.caps, hold.profile, hold.instance, hold.cost, state)
            if blocked is not None:
                return f"blocked since it was approved: {blocked[1]}"
            now = decide_call(entry, hold.instance, hold.cost, state)
            if now.outcome is Outcome.BLOCK:
                return f"blocked since it was approved: {now.reason}"
            return reserve(self.store, tx, entry.caps, hold.profile, hold.instance, hold.cost, hold.id, state, month)

    async def aclose(self) -> None:
        """Stop the loop and the listener; holds running now finish first."""
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


def _finish(store: Store, hold: Hold, ok: bool, result: Mapping[str, Any] | None, message: str,
            charged: int | None, cause: str | None) -> None:
    finish_hold(store, hold.id, ok=ok, result=result, message=message, charged=charged, cause=cause,
                approved_by=hold.decided_by)


def _failure_message(output: Mapping[str, Any]) -> str:
    return str(output.get("message") or output.get("error") or "the call failed")


# The router's advice on a live call's `unavailable` ("...; retrying later may work"). A failed hold is
# final, so the advice is dropped from what the agent and the approvers read of it.
_RETRY_ADVICE = re.compile(r"\s*[;,.]?\s*retrying later may work\.?\s*$", re.IGNORECASE)


def _without_retry_advice(text: str) -> str:
    return _RETRY_ADVICE.sub("", text) or text


def _final_output(output: Mapping[str, Any]) -> dict[str, Any]:
    """A failed run's output as the hold keeps it: its message without advice to retry."""
    final = dict(output)
    if isinstance(final.get("message"), str):
        final["message"] = _without_retry_advice(final["message"])
    return final
