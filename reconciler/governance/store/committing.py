"""The backlog's commits from the event loop: no thread, no hand-over of the interpreter's lock.

A busy router commits its backlog (`backlog`) twenty times a second. Committed on a worker thread,
each commit's calls into the driver made the thread and the event loop trade the interpreter's lock
back and forth — 2,500 to 3,800 context switches a second at 8 sessions against the open gate's
800 to 1,100, measured — which cost the loop more than the commit itself. So the loop commits what
most commits hold, audit rows and spend sums, itself (`loop_committer`):

- on PostgreSQL over a psycopg async connection of its own (made when first needed, made again after
  a failure), in one statement (`PG_FLUSH`): the audit rows and the spend sums go as two JSON
  parameters that the server unpacks, so a commit is one round trip the loop awaits between its
  other work. A transaction of COPY and an upsert took five (BEGIN, COPY, its end, the upsert,
  COMMIT) and cost the router three to four times the CPU a commit (`benchmarks/commit.py`);
- on SQLite on a connection of its own that never waits: it takes this process's write turn only if
  no thread has it (`Store.write_turn_now`) and the file's write lock only if no other process has
  it (no busy wait), and it never checkpoints the write-ahead log itself (a checkpoint writes the
  database and syncs it to disk), which a worker does in the background every `CHECKPOINT_EVERY`
  commits. Committing then only appends to the log (`synchronous=NORMAL`): no disk wait.

Whatever the loop cannot commit at once — reservations, settlements or balances waiting too (the paths
of `admit_now` and of holds), a write lock another holds — is left to the worker's transaction,
`Backlog.flush`, which waits its turn. So is a commit the store refused for its data
(`StoreRefusedError`): the worker writes its rows one by one and sets aside those refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3

import orjson
import psycopg

from reconciler.governance.errors import StoreError
from reconciler.governance.store.audit import audit_statements
from reconciler.governance.store.backlog import Backlog, spend_statements
from reconciler.governance.store.engine import Store

__all__ = ["CHECKPOINT_EVERY", "PG_FLUSH", "PostgresCommitter", "SqliteCommitter", "loop_committer"]

log = logging.getLogger("handler.governance")

CHECKPOINT_EVERY = 200  # SQLite commits from the loop between two checkpoints of the write-ahead log (~10 s busy)

# One flush on PostgreSQL, atomic as every statement is: the audit rows, then the spend sums, each a JSON array of
# rows taken apart in their order (the audit ids follow it; the spend rows are locked in the order of their keys,
# as `spend_statements` orders them, so two routers' flushes never deadlock). The data-modifying WITH runs whether
# or not the INSERT after it reads it.
PG_FLUSH = (
    "WITH added AS (INSERT INTO audit (at, event, request_id, profile, instance, tool, actor, status, detail) "
    "SELECT (r->>0)::float8, r->>1, r->>2, r->>3, r->>4, r->>5, r->>6, r->>7, (r->>8)::json "
    "FROM json_array_elements(%s::json) WITH ORDINALITY AS a(r, n) ORDER BY n) "
    "INSERT INTO spend (scope, month, micros) SELECT r->>0, r->>1, (r->>2)::bigint "
    "FROM json_array_elements(%s::json) WITH ORDINALITY AS s(r, n) ORDER BY n "
    "ON CONFLICT (scope, month) DO UPDATE SET micros = spend.micros + excluded.micros"
)


def loop_committer(store: Store) -> PostgresCommitter | SqliteCommitter | None:
    """The committer for `store`'s dialect; None for a SQLite database in memory (no second connection sees it)."""
    if store.dialect == "postgresql":
        return PostgresCommitter(store)
    if store.sqlite_file is not None:
        return SqliteCommitter(store, store.sqlite_file)
    return None


class PostgresCommitter:
    """Commits a backlog's audit rows and spend from the event loop, on PostgreSQL."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._conn: psycopg.AsyncConnection[tuple[object, ...]] | None = None

    async def flush(self, backlog: Backlog) -> bool:
        """Commit what `backlog` holds in one transaction; False when it holds more than audit rows and spend (the
        caller commits it with `Backlog.flush` on a worker thread). When the store fails, what was taken is put back
        and a `StoreError` raised (`StoreRefusedError` when it refused the data). Callers shield it from
        cancellation: cancelled while its statement is under way, it puts back what may have been committed, and
        spend then counts twice (over, never under)."""
        taken = backlog.take_plain()
        if taken is None:
            return False
        if not taken.count():
            return True
        sums = [(scope, month, micros) for (scope, month), micros in sorted(taken.spend.items())]
        try:
            conn = self._conn or await self._connect()
            await conn.execute(PG_FLUSH, (orjson.dumps(taken.audit).decode(), orjson.dumps(sums).decode()))
        except psycopg.Error as exc:
            backlog.put_back(taken)
            await self.aclose()  # a broken connection is made again at the next commit
            raise self._store.failed(exc) from exc
        except BaseException:
            backlog.put_back(taken)
            raise
        return True

    async def _connect(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        self._conn = await psycopg.AsyncConnection.connect(self._store.driver_dsn, autocommit=True)
        return self._conn

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


class SqliteCommitter:
    """Commits a backlog's audit rows and spend on the event loop's thread, on SQLite, never waiting for a lock."""

    def __init__(self, store: Store, database: str) -> None:
        self._store = store
        self._database = database
        self._conn: sqlite3.Connection | None = None
        self._commits = 0  # since the last checkpoint
        self._checkpoint: asyncio.Future[None] | None = None

    async def flush(self, backlog: Backlog) -> bool:
        """Commit what `backlog` holds in one transaction; False, having written nothing, when it holds more than
        audit rows and spend or another thread or process is writing (the caller commits it on a worker thread,
        which waits its turn). When the store fails, what was taken is put back and a `StoreError` raised
        (`StoreRefusedError` when it refused the data)."""
        with self._store.write_turn_now() as mine:
            if not mine:
                return False
            taken = backlog.take_plain()
            if taken is None:
                return False
            if not taken.count():
                return True
            try:
                conn = self._conn or self._connect()
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                backlog.put_back(taken)
                if _busy(exc):
                    return False
                self._close()
                raise StoreError(f"the store {self._store.url} failed: {exc}") from exc
            try:
                for statement, parameters in (*audit_statements("?", taken.audit), *spend_statements("?", taken.spend)):
                    conn.execute(statement, parameters)
                conn.execute("COMMIT")
            except (sqlite3.Error, OverflowError) as exc:  # OverflowError: a number past SQLite's integers
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                backlog.put_back(taken)
                raise self._store.failed(exc) from exc
        self._commits += 1
        if self._commits >= CHECKPOINT_EVERY and (self._checkpoint is None or self._checkpoint.done()):
            self._commits = 0
            self._checkpoint = asyncio.get_running_loop().run_in_executor(None, self._checkpoint_now)
        return True

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self._database, timeout=0, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA busy_timeout=0")  # a write lock another holds: the worker's commit waits for it
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # never here: `_checkpoint_now`, on a worker
        self._conn = conn
        return conn

    def _checkpoint_now(self) -> None:
        """Copy the write-ahead log into the database as far as no reader needs it (PASSIVE: it waits for nobody)."""
        try:
            conn = sqlite3.connect(self._database, timeout=5, isolation_level=None)
            try:
                conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            finally:
                conn.close()
        except sqlite3.Error as exc:
            log.warning("could not checkpoint the store's write-ahead log %s-wal, will try again: %s", self._database,
                        exc)

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def aclose(self) -> None:
        if self._checkpoint is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint
        self._close()


def _busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", None) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED) or \
        "locked" in str(exc)
