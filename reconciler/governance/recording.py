"""The one writer of what calls leave to record: the backlog (`store.backlog`) and the rows the lanes kept on the
event loop's thread (`lanes.Records`), committed together a moment after they came (docs/architecture.md §7).

`Admissions` adds rows to `backlog` and asks for a flush (`soon`) when none is due; the writer gathers what the
next `batch_seconds` bring into one commit, and keeps committing until nothing waits. A commit runs on the event
loop itself when it holds only audit rows and spend and the store is free (`store.committing`), else on a worker
thread; one that fails keeps its rows for the next try, a second later. `aclose` commits what is left, with the
decision of every call still running; a call settled after it is written at once (`write_late`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from reconciler.governance.errors import StoreError, StoreRefusedError
from reconciler.governance.lanes import Charges, Records
from reconciler.governance.store import Store
from reconciler.governance.store.audit import AuditRow
from reconciler.governance.store.backlog import Backlog
from reconciler.governance.store.committing import loop_committer
from reconciler.governance.workers import StoreWorkers

__all__ = ["BacklogWriter"]

log = logging.getLogger("handler.governance")
_RETRY_SECONDS = 1.0  # between tries to commit the backlog while the store fails
Taken = tuple[list[AuditRow], Charges]  # what `Records.take` hands over


class BacklogWriter:
    """Commits `backlog` and what `records` took, a batch at a time (the module's docstring)."""

    def __init__(self, store: Store, workers: StoreWorkers, records: Records, batch_seconds: float) -> None:
        self.store = store
        self.backlog = Backlog()
        self.due = False  # a flush is scheduled: it runs until the backlog and the lanes' records are empty
        self._workers = workers
        self._records = records
        self._batch_seconds = batch_seconds
        self._loop_commits = loop_committer(store)  # None: every commit goes to a worker thread
        self._commit_lock = asyncio.Lock()
        self._commits: set[asyncio.Future[bool]] = set()
        self._flushing: asyncio.Task[None] | None = None

    def soon(self) -> None:
        """Schedule a flush; the call path asks only when none is `due` (a flush due runs until nothing waits)."""
        if self._flushing is None or self._flushing.done():
            self.due = True
            self._flushing = asyncio.get_running_loop().create_task(self._flush_later())

    async def _flush_later(self) -> None:
        """Commit until nothing waits: rows added while a commit runs are not left waiting for the next call (they
        were, and `handler spend` missed the last settlements of a burst)."""
        pause = self._batch_seconds
        try:
            while True:
                await asyncio.sleep(pause)  # gather what the next moments bring into one commit
                done = await self._commit(self._records.take())
                if not len(self.backlog) and not len(self._records):
                    return
                pause = self._batch_seconds if done else _RETRY_SECONDS
        finally:
            self.due = False

    async def flush(self) -> None:
        """Commit now (tests, shutdown), with the decision of every call still running."""
        await self._commit(self._records.take(everything=True))

    async def _commit(self, taken: Taken) -> bool:
        """Commit the backlog with what the event loop's thread recorded (`taken`); False when the store failed: the
        rows are kept for the next try."""
        if self._loop_commits is None:
            return await self._workers.run(self.flush_now, taken)
        self.backlog.add_rows(*taken)
        task = asyncio.ensure_future(self._commit_on_loop())
        self._commits.add(task)
        task.add_done_callback(self._commits.discard)
        return await asyncio.shield(task)  # a commit under way is never cancelled: `aclose` waits for it

    async def _commit_on_loop(self) -> bool:
        assert self._loop_commits is not None  # noqa: S101 - only called with one
        async with self._commit_lock:  # one at a time: a commit returns once what was added before it is committed
            waiting = len(self.backlog)
            try:
                if await self._loop_commits.flush(self.backlog):
                    return True
            except StoreRefusedError:
                pass  # the worker's flush writes the rows one by one and sets aside those refused
            except StoreError as exc:
                _not_recorded(waiting, exc)
                return False
            return await self._workers.run(self.flush_now)  # settlements too, or the store busy: the worker waits

    def flush_now(self, taken: Taken | None = None) -> bool:
        """Commit the backlog on this thread, with what the event loop's thread recorded (`taken` there); False
        when the store failed: the rows are kept for the next try (the decisions stand, only their record is late)."""
        if taken is not None:
            self.backlog.add_rows(*taken)
        waiting = len(self.backlog)
        try:
            self.backlog.flush(self.store)
        except StoreError as exc:
            _not_recorded(waiting, exc)
            return False
        return True

    def write_late(self, taken: Taken | None = None) -> None:
        """Commit on this thread, once nothing else will (a call settled after `aclose`, or `aclose` itself)."""
        if not self.flush_now(taken):
            log.error("the store failed: %d audit/spend rows are not recorded", len(self.backlog))

    async def aclose(self) -> None:
        """Stop the flush under way, let a commit on the loop end, and commit what is left (on this thread)."""
        if self._flushing is not None:
            self._flushing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flushing
        if self._commits:  # a commit under way on the loop ends first: what it took is in the store or back
            await asyncio.gather(*self._commits, return_exceptions=True)
        self.write_late(self._records.take(everything=True))
        if self._loop_commits is not None:
            await self._loop_commits.aclose()


def _not_recorded(waiting: int, exc: StoreError) -> None:
    log.warning("could not record %d audit/spend rows yet, will retry: %s", waiting, exc)
