"""The real `Gate`: the gate on the call path and the runner of approved holds, over one store.

`app` builds it (`GovernedGate.from_env`), hands it to the router as its gate, starts it with the
router's executor (`start(router.execute_held)`) and closes it (`aclose`). The work is in two
parts: `admissions.Admissions` decides every call, holds what needs a person, reserves and settles
spend, and answers `handler_status` / `handler_decide`; `holdrunner.HoldRunner` runs approved holds,
each exactly once. They share the store, a small thread pool for its calls (`workers`) and the
compiled rulebooks (`rulebook_cache`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, Literal

from reconciler.config.snapshot import Snapshot
from reconciler.governance.admissions import Admissions
from reconciler.governance.alerts import alert_id, record_alert
from reconciler.governance.errors import StoreError
from reconciler.governance.gate import Admission, CallRequest, Executor, HoldStatus, Settlement
from reconciler.governance.holdrunner import HoldRunner
from reconciler.governance.leasekeeper import LeaseKeeper, stable_router_id
from reconciler.governance.leases import LeaseTerms, new_router_id, reconcile_leases
from reconciler.governance.ledger import reconcile_reservations
from reconciler.governance.notices import Reach
from reconciler.governance.rulebook_cache import RulebookCache
from reconciler.governance.store import Store, open_store, store_url
from reconciler.governance.workers import StoreWorkers

__all__ = ["GovernedGate"]

log = logging.getLogger("handler.governance")


class GovernedGate:
    """Governance backed by a store (SQLite or PostgreSQL); implements the router's `Gate`."""

    def __init__(self, store: Store, *, poll_seconds: float = 0.25, owns_store: bool = True,
                 batch_seconds: float = 0.05, router_id: str | None = None, leases: LeaseTerms | None = None) -> None:
        """`router_id` names this router's budget leases; give the same one only to the same router restarted
        (`from_env` keeps one in the state folder), whose start then reconciles what it left."""
        self.store = store
        self._owns_store = owns_store
        self._restarted_as = router_id
        self._workers = StoreWorkers()
        self._rulebooks = RulebookCache()
        router_id = router_id or new_router_id()
        self._keeper = LeaseKeeper(store, self._workers, router_id, leases or LeaseTerms())
        # The holds it claims name it as its leases do: the id an operator finds in the state folder (`router-id`).
        self._runner = HoldRunner(store, self._workers, self._rulebooks, poll_seconds=poll_seconds,
                                  heard=self._hold_changed, make_room=self._keeper.make_room, runner_id=router_id,
                                  release_credit=self._keeper.fold)
        self._admissions = Admissions(store, self._workers, self._rulebooks, self._keeper, batch_seconds=batch_seconds,
                                held=self._hold_changed, run_now=self._runner.run_now, seen=self._first_snapshot)
        # Called on the event loop when a hold was stored here or (PostgreSQL) by another router: the
        # notifier of `handler up` sends its notices at once instead of at its next poll.
        self.on_hold: Callable[[], None] | None = None
        self._unready: dict[str, list[int]] = {}  # alert id → calls reported since its last write was scheduled
        self._unready_tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def from_env(cls, root: str | Path = ".", env: Mapping[str, str] | None = None, *,
                 state_dir: Path | None = None) -> GovernedGate:
        """Open (and migrate, under a lock) the store named by the environment; see `store_url`. With a state
        folder (one service's), the router's id is kept there."""
        store = open_store(store_url(root, env, state_dir=state_dir))
        return cls(store, router_id=stable_router_id(state_dir) if state_dir is not None else None)

    def admit(self, snapshot: Snapshot, call: CallRequest) -> Coroutine[Any, Any, Admission]:
        """`Admissions.admit`'s coroutine, handed over as it is: every call passes here, and awaiting it in a
        coroutine of this one would cost each call another frame (`benchmarks/gate.py`)."""
        return self._admissions.admit(snapshot, call)

    def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Coroutine[Any, Any, Settlement]:
        """`Admissions.settle`'s coroutine, handed over as `admit`'s is."""
        return self._admissions.settle(admission, actual_cost, ok)

    def _hold_changed(self) -> None:
        if self.on_hold is not None:
            self.on_hold()

    @property
    def reach(self) -> Reach | None:
        """The channels this service announces holds on, and its dashboard (None: not said)."""
        return self._admissions.reach

    @reach.setter
    def reach(self, reach: Reach | None) -> None:
        self._admissions.reach = reach

    def use_snapshot(self, snapshot: Snapshot) -> None:
        """The live snapshot, against which approved holds are checked again before they run."""
        self._runner.use_snapshot(snapshot)

    # --- the Gate --------------------------------------------------------------------------------

    def _first_snapshot(self, snapshot: Snapshot) -> None:
        if self._runner.snapshot is None:  # until the router says which snapshot is live, the first one seen is
            self._runner.use_snapshot(snapshot)

    def admit_now(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        """`admit` without the event loop: one store transaction."""
        return self._admissions.admit_now(snapshot, call)

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus:
        return await self._admissions.status(request_id, caller)

    async def decide(self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest,
                     reason: str | None = None) -> HoldStatus:
        return await self._admissions.decide(request_id, decision, caller, reason)

    async def waiting(self, caller: CallRequest) -> list[Mapping[str, Any]]:
        return await self._admissions.waiting(caller)

    async def withdraw(self, instance: str, why: str) -> int:
        return await self._admissions.withdraw(instance, why)

    def report_unready(self, snapshot: Snapshot, binding: str, cause: str, message: str) -> None:
        """Record the failed call against its alert, in the background; the first report of a cause queues the
        owners' notices and wakes the notifier. Reports made while a write is under way ride with the next one."""
        ident = alert_id(binding, cause, message)
        waiting = self._unready.get(ident)
        if waiting is not None:
            waiting[0] += 1
            return
        self._unready[ident] = [1]
        task = asyncio.get_running_loop().create_task(self._record_unready(ident, snapshot, binding, cause, message))
        self._unready_tasks.add(task)
        task.add_done_callback(self._unready_tasks.discard)

    async def _record_unready(self, ident: str, snapshot: Snapshot, binding: str, cause: str, message: str) -> None:
        calls = self._unready.pop(ident, [1])[0]
        try:
            added = await self._workers.run(record_alert, self.store, snapshot.org, self.reach, binding, cause,
                                            message, calls)
        except StoreError as exc:  # the owners are told at the next failed call, once the store answers
            log.warning("binding '%s' cannot start (%s), and its owners could not be told: %s", binding, message, exc)
            return
        if added:
            log.warning("binding '%s' cannot start until it is set up; its owners are told: %s", binding, message)
            self._hold_changed()  # the notifier sends what was queued now, not at its next poll

    @property
    def pricing_violations(self) -> int:
        """How many calls settled here reported more than they reserved (each is in the audit trail)."""
        return self._admissions.pricing_violations

    async def flush(self) -> None:
        """Commit the backlog of records and spend now (tests, shutdown)."""
        await self._admissions.flush()

    # --- approved holds --------------------------------------------------------------------------

    async def start(self, executor: Executor) -> None:
        """Reconcile what a stopped router left reserved, then run approved holds through `executor` from
        now on (also those approved while no router was up)."""
        reconciled = await self._workers.run(reconcile_reservations, self.store)
        if reconciled:
            log.warning("%d reservations a stopped router never settled are charged what they reserved", reconciled)
        leases = await self._workers.run(functools.partial(reconcile_leases, by=self._keeper.router), self.store,
                                         self._restarted_as)
        if leases:
            log.warning("%d budget leases stopped routers never returned are reconciled: what they had not issued "
                        "is given back", len(leases))
        self._keeper.start()
        await self._runner.start(executor)

    # --- closing ---------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop running holds (those running now finish), commit the backlog, close the store."""
        await asyncio.gather(*self._unready_tasks, return_exceptions=True)
        await self._runner.aclose()
        await self._admissions.aclose()
        self._close_store()

    def close(self) -> None:
        """`aclose` without the event loop, for a gate that was never started."""
        self._admissions.flush_now()
        self._close_store()

    def _close_store(self) -> None:
        self._workers.shutdown()
        if self._owns_store:
            self.store.close()
