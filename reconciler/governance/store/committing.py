"""The backlog's commits from the event loop, on PostgreSQL: no thread, no hand-over of the interpreter's lock.

A busy router commits its backlog (`backlog`) twenty times a second. Committed on a worker thread,
each commit's round trips (BEGIN, COPY, the spend upsert, COMMIT) made the thread and the event loop
trade the interpreter's lock back and forth — over a hundred context switches a commit, measured —
which cost the loop more than the commit itself. `LoopCommitter` commits on the loop instead, over a
psycopg async connection of its own (made when first needed, made again after a failure), so the
loop only waits on the socket between its other work. It commits what most commits hold: audit rows
and spend sums. A backlog holding more (reservations, their settlements, balances: the paths of
`admit_now` and of holds) is left to the worker's transaction, `Backlog.flush`.

SQLite has no such driver (its async wrappers run a thread): its commits stay on the worker.
"""

from __future__ import annotations

import psycopg

from reconciler.governance.errors import StoreError
from reconciler.governance.store.audit import COPY_AUDIT
from reconciler.governance.store.backlog import Backlog, spend_statements
from reconciler.governance.store.engine import Store

__all__ = ["LoopCommitter"]


class LoopCommitter:
    """Commits a backlog's audit rows and spend from the event loop; PostgreSQL only."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def flush(self, backlog: Backlog) -> bool:
        """Commit what `backlog` holds in one transaction; False when it holds more than audit rows and spend (the
        caller commits it with `Backlog.flush` on a worker thread). When the store fails, what was taken is put back
        and a `StoreError` raised. Callers shield it from cancellation: cancelled while its COMMIT is under way, it
        puts back what may have been committed, and spend then counts twice (over, never under)."""
        taken = backlog.take_plain()
        if taken is None:
            return False
        if not taken.count():
            return True
        try:
            conn = self._conn or await self._connect()
            async with conn.transaction(), conn.cursor() as cursor:
                if taken.audit:
                    async with cursor.copy(COPY_AUDIT) as copy:
                        for row in taken.audit:
                            await copy.write_row(row)
                for statement, parameters in spend_statements("%s", taken.spend):
                    await cursor.execute(statement, parameters)
        except psycopg.Error as exc:
            backlog.put_back(taken)
            await self.aclose()  # a broken connection is made again at the next commit
            raise StoreError(f"the store {self._store.url} failed: {str(exc).strip()}") from exc
        except BaseException:
            backlog.put_back(taken)
            raise
        return True

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        self._conn = await psycopg.AsyncConnection.connect(self._store.driver_dsn)
        return self._conn

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
