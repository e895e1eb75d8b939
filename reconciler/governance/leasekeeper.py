"""The router's side of budget leases: capped calls admitted in memory, the leases kept in line with the store.

The gate asks `take` for every capped call: the call's price is reserved on each of its leases (its
capped spend rows and the prepaid balance, `leases.LeaseBook`) with no store round trip. A call whose
leases lack room `wait`s: the keeper runs one sync (`leases.sync`, one transaction) for all the calls
waiting then, which takes more from the store for them and serves them in the order they came; a call
the store cannot cover comes back with the spend state its guardrails block it on, naming the cap.
Between calls the keeper ticks (`LeaseTerms.tick_seconds`): it measures each lease's rate, takes more
for busy leases before they run out, keeps `issued` ahead of the calls, renews, returns idle leases,
and now and then reconciles the expired leases of routers that died. At shutdown it returns all.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path

from reconciler.governance.errors import StoreError
from reconciler.governance.leases import (
    Lease,
    LeaseBook,
    LeaseTerms,
    Needs,
    Waiter,
    new_router_id,
    reconcile_leases,
    sync,
)
from reconciler.governance.rulebook import CapSet
from reconciler.governance.store import Store
from reconciler.governance.workers import StoreWorkers
from reconciler.places import ensure_private_dir, open_private_file

__all__ = ["LeaseKeeper", "stable_router_id"]

log = logging.getLogger("handler.governance")
_ID_FILE = "router-id"


def stable_router_id(state_dir: Path) -> str:
    """This router's id, kept in its state folder: the same across restarts, so a router starting again
    reconciles the leases its previous process left at once (a state folder belongs to one service)."""
    path = state_dir / _ID_FILE
    try:
        found = path.read_text().strip()
    except FileNotFoundError:
        found = ""
    if found.startswith("router-"):
        return found
    made = new_router_id()
    ensure_private_dir(state_dir, "HANDLER_STATE_DIR")
    fd = open_private_file(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        os.write(fd, (made + "\n").encode())
    finally:
        os.close(fd)
    return made


class LeaseKeeper:
    """One router's leases: admission against them in memory, and the keeper that syncs them with the store."""

    def __init__(self, store: Store, workers: StoreWorkers, router: str, terms: LeaseTerms) -> None:
        self.store = store
        self.book = LeaseBook(router, terms)
        self._workers = workers
        self._waiting: list[tuple[Waiter, asyncio.Future[Waiter]]] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def router(self) -> str:
        return self.book.router

    # --- on the call path ------------------------------------------------------------------------

    def needs(self, caps: CapSet, profile: str, instance: str, month: str) -> Needs:
        return self.book.needs(caps, profile, instance, month)

    def take(self, needs: Needs, cost: int) -> tuple[Lease, ...] | None:
        """The call's price reserved on its leases, or None: then `wait`."""
        return self.book.take(needs, cost)

    async def wait(self, needs: Needs, cost: int) -> Waiter:
        """Wait for the next sync: it reserves for this call (`held`), or finds that the store cannot cover it
        (`refused`, the state its guardrails block on). A `StoreError` of the sync is raised here."""
        self.start()
        assert self._wake is not None  # noqa: S101 - start() made it
        future: asyncio.Future[Waiter] = asyncio.get_running_loop().create_future()
        self._waiting.append((Waiter(needs, cost), future))
        self._wake.set()
        return await future

    def give_back(self, held: Sequence[Lease], cost: int) -> None:
        self.book.give_back(held, cost)

    def settle(self, held: Sequence[Lease], cost: int, charged: int) -> int:
        """A call ended, charged `charged`; returns the budget left as this router sees it."""
        return self.book.settle(held, cost, charged)

    def fold(self) -> None:
        """Give the leases the credit the lanes hold and count what their calls spent (`LeaseBook.fold`), on the
        event loop's thread, the lanes' own: before every sync, so that it sizes, gives back and returns leases on
        what their calls use, and before an approved hold asks for the room they hold (`make_room`)."""
        self.book.fold()

    async def settled_after_close(self) -> None:
        """A call that outlived `aclose` ended: give back what its leases no longer need, now."""
        self.fold()
        try:
            await asyncio.to_thread(sync, self.store, self.book, (), closing=True)
        except StoreError as exc:
            log.error("could not return the unused part of a budget lease; it is reconciled when it "
                      "expires: %s", exc)

    def make_room(self, caps: CapSet, profile: str, instance: str, month: str) -> bool:
        """Give back (on this thread) the unused part of this router's leases on a call's caps, so that a call
        reserved on its own (an approved hold) may use it; False when they hold nothing unused."""
        cuts = [need.cut for need in self.book.needs(caps, profile, instance, month).leased]
        if not self.book.has_room(cuts):
            return False
        sync(self.store, self.book, (), only=cuts)
        return True

    # --- the keeper ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the keeper (once; the first capped call starts it when nothing else did)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._keep(), name="handler-leases")

    async def _keep(self) -> None:
        assert self._wake is not None  # noqa: S101 - set by start() before the task exists
        terms = self.book.terms
        last_tick = last_reconcile = time.monotonic()
        while not self._closed or self._waiting:
            if not self._waiting:
                idle = terms.tick_seconds if len(self.book) else terms.ttl_seconds / 2
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), idle)
                if self._closed and not self._waiting:
                    break
            self._wake.clear()
            self.fold()  # first: what the lanes' calls took since the last fold counts in this tick's rate
            moment = time.monotonic()
            if moment - last_tick >= terms.tick_seconds:
                self.book.tick(moment - last_tick)
                last_tick = moment
            batch, self._waiting = self._waiting, []
            try:
                await self._workers.run(sync, self.store, self.book, [w for w, _ in batch])
            except StoreError as exc:
                log.warning("could not bring the budget leases in line with the store: %s", exc)
                # The calls that came while it waited would wait as long again on the same lock: they fail with it,
                # so no call waits past one lock timeout (docs/scaling.md).
                batch, self._waiting = batch + self._waiting, []
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self._serve(batch)
            if moment - last_reconcile >= terms.ttl_seconds / 2:
                last_reconcile = moment
                await self._reconcile_expired()

    def _serve(self, batch: list[tuple[Waiter, asyncio.Future[Waiter]]]) -> None:
        """Answer the calls a sync served; the others wait for the next one."""
        for waiter, future in batch:
            if future.done():  # the caller went away: what was taken for it goes back
                if waiter.held is not None:
                    self.book.give_back(waiter.held, waiter.cost)
            elif waiter.held is not None or waiter.refused is not None:
                future.set_result(waiter)
            else:
                self._waiting.append((waiter, future))

    async def _reconcile_expired(self) -> None:
        try:
            closed = await self._workers.run(functools.partial(reconcile_leases, by=self.router), self.store)
        except StoreError as exc:
            log.warning("could not reconcile expired budget leases: %s", exc)
            return
        if closed:
            log.warning("%d budget leases other routers never returned are reconciled: what they had not "
                        "issued is given back", len(closed))

    async def aclose(self) -> None:
        """Serve the calls still waiting, stop the keeper, and give back everything the leases do not use
        (a lease whose calls still run stays open until they settle: `settled_after_close`)."""
        self._closed = True
        if self._task is not None:
            assert self._wake is not None  # noqa: S101
            self._wake.set()
            await self._task
        if len(self.book):
            self.fold()
            try:
                await self._workers.run(functools.partial(sync, closing=True), self.store, self.book, ())
            except StoreError as exc:
                log.error("could not return the budget leases; they are reconciled when they expire: %s", exc)
