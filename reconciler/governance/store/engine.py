"""Opening the store and its transactions: SQLite (embedded) or PostgreSQL (shared by routers).

SQLite (WAL) at `$HANDLER_STATE_DIR/handler.db` by default; PostgreSQL when `HANDLER_STORE_URL`
names one, so that several routers share approvals and caps. Every write happens in one short
transaction (`Store.begin`): on SQLite it is `BEGIN IMMEDIATE` (one writer at a time, across
processes), on PostgreSQL row locks taken in a fixed order. The schema is applied by Alembic
(`migrate`), at start and by `handler store migrate`, under a lock so that two routers starting
together cannot race: a file lock beside the SQLite file, `pg_advisory_xact_lock` on PostgreSQL.

What SQLAlchemy or the database driver raises leaves this module as a `StoreError` (`begin`,
`read`, `migrate`, `open_store`), so callers handle the project's own error type only: the driver's
own errors too, from statements run on its connection (the audit trail's COPY on PostgreSQL). A
store that is up but refuses the data (`refused_by_store`) raises `StoreRefusedError`, which a retry
would only meet again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeAlias, TypeVar, cast

import psycopg
import sqlalchemy as sa
from psycopg import conninfo
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from reconciler.governance.errors import StoreError, StoreRefusedError
from reconciler.governance.store.migrate import upgrade
from reconciler.places import PRIVATE_FILE_MODE, default_state_dir, ensure_private_dir, open_private_file

__all__ = ["HOLD_CHANNEL_SQL", "PG_CONNECTION_DEFAULTS", "Store", "Transaction", "failure_reason", "marker", "now",
           "open_store", "refused_by_store", "storable", "store_exists", "store_url"]

_Built = TypeVar("_Built")

# One open transaction of the store, passed to the store's statements. Callers outside the package
# only hand it on: it is opaque to them.
Transaction: TypeAlias = Connection

# The SQL expression of the PostgreSQL NOTIFY channel on which a hold stored or decided is announced, worked out by
# the server for the schema the session uses: the stores of two schemas in one database (two deployments) do not wake
# each other.
HOLD_CHANNEL_SQL = "'handler_holds_' || md5(coalesce(current_schema(), ''))"
_MIGRATION_LOCK = 0x48414E444C4552  # "HANDLER": the advisory lock key of migrations


def marker(tx: Transaction) -> str:
    """The driver's placeholder for one parameter of a statement run as it is (`exec_driver_sql`): sqlite3's `?`,
    psycopg's `%s`."""
    return "?" if tx.dialect.paramstyle == "qmark" else "%s"


def refused_by_store(exc: BaseException) -> bool:
    """Whether the store refused the data of a write rather than failed: PostgreSQL's data exceptions and
    constraint violations (SQLSTATE classes 22 and 23: too long, out of range, a NUL in text, a duplicate),
    SQLite's integrity and data errors, and a number past what SQLite's driver binds (OverflowError)."""
    orig = getattr(exc, "orig", None) if isinstance(exc, SQLAlchemyError) else exc
    # psycopg's classes stand for SQLSTATE 22 and 23, and it raises DataError itself for a NUL in text.
    return isinstance(orig, OverflowError | sqlite3.IntegrityError | sqlite3.DataError | psycopg.DataError
                      | psycopg.IntegrityError)


# What SQLite says of a file that is not a database or is damaged: no retry helps, a person must act.
_SQLITE_DAMAGED = frozenset({"file is not a database", "database disk image is malformed"})


def failure_reason(exc: BaseException) -> str:
    """What SQLAlchemy or the driver raised, in the driver's words, never the statement's parameters (they can hold
    a call's arguments)."""
    orig = getattr(exc, "orig", None) if isinstance(exc, SQLAlchemyError) else exc
    if orig is not None:
        return str(orig).strip()
    return exc.__class__.__name__ if isinstance(exc, sa.exc.StatementError) else str(exc)


def storable(text: str | None) -> str | None:
    """`text` as a text column keeps it on either store: PostgreSQL refuses a NUL in text, so each becomes U+FFFD.
    For what a connector or a person wrote (a failed hold's message and cause, a decision's reason), which would
    otherwise fail the write that records it."""
    return text.replace("\x00", "\ufffd") if text is not None and "\x00" in text else text


def now() -> float:
    return time.time()


def store_url(root: str | Path = ".", env: Mapping[str, str] | None = None, *, state_dir: Path | None = None) -> str:
    """The store's SQLAlchemy URL: `HANDLER_STORE_URL`, else SQLite in the state folder.

    The state folder is `state_dir` when the caller was given one (`--state-dir`), else
    `$HANDLER_STATE_DIR`, else `.handler/` under the config root.
    """
    env = os.environ if env is None else env
    url = env.get("HANDLER_STORE_URL", "").strip()
    if url:
        for plain in ("postgresql://", "postgres://"):
            if url.startswith(plain):
                return "postgresql+psycopg://" + url[len(plain):]
        return url
    state = state_dir or default_state_dir(Path(root), env)
    return f"sqlite:///{state / 'handler.db'}"


_READING_KEY = "handler_reading"
_READING = {_READING_KEY: True}  # a connection from `Store.read`


class Store:
    """An engine on the store with the few dialect-specific operations the statements need."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self._statements: dict[Callable[[Store], object], object] = {}  # `statements`: built once per store
        self._writer = threading.Lock() if self.dialect == "sqlite" else None
        if self.dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"unsupported store '{self.dialect}': use SQLite or PostgreSQL")
        # What SQLAlchemy raises, and what the driver raises on its own connection (`Transaction.connection`).
        # OverflowError: a number SQLite's driver cannot bind, raised before the statement reaches the store.
        self._failures: tuple[type[Exception], ...] = (SQLAlchemyError, engine.dialect.loaded_dbapi.Error,
                                                       OverflowError)

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @property
    def driver_dsn(self) -> str:
        """The store's connection string as psycopg takes it, password and options kept, with the connection
        defaults of the pool's (`PG_CONNECTION_DEFAULTS`, `PG_SESSION_DEFAULTS`): for the connections made outside
        the engine's pool (PostgreSQL's listener, the loop's commits). Built by libpq's rules, not as a URL: a URL
        rendered again writes the spaces of `options` as '+', which libpq does not read back as spaces."""
        url = self.engine.url.set(drivername="postgresql")
        query = {key: _query_text(value) for key, value in url.query.items()}
        base = url.set(query={}).render_as_string(hide_password=False)
        return conninfo.make_conninfo(base, **{**query, **_connection_defaults(url)})

    def statements(self, build: Callable[[Store], _Built]) -> _Built:
        """What `build` makes of this store, made once: a module's statements, built once so that SQLAlchemy reuses
        their compiled form and cache keys (building them anew for each use cost more than running them)."""
        found = self._statements.get(build)
        if found is None:
            found = self._statements[build] = build(self)
        return cast(_Built, found)  # made by `build`, kept under it

    @contextmanager
    def begin(self) -> Iterator[Transaction]:
        """One write transaction (`BEGIN IMMEDIATE` on SQLite); a database failure is a `StoreError`.

        On SQLite the threads of one process take turns here first: SQLite has one writer at a time,
        and a thread waiting in its busy handler sleeps in steps of milliseconds, while one waiting
        on this lock wakes as soon as the writer before it commits. Other processes still wait in
        SQLite's busy handler.
        """
        try:
            if self._writer is None:
                with self.engine.begin() as conn:
                    yield conn
                return
            with self._writer, self.engine.begin() as conn:
                yield conn
        except self._failures as exc:
            raise self.failed(exc) from exc

    @contextmanager
    def write_turn_now(self) -> Iterator[bool]:
        """SQLite: this process's turn to write (see `begin`) if no other thread has it now, without waiting for it
        (True); False while another thread writes. Always True on PostgreSQL, which has no such turn."""
        if self._writer is None:
            yield True
            return
        if not self._writer.acquire(blocking=False):
            yield False
            return
        try:
            yield True
        finally:
            self._writer.release()

    @property
    def sqlite_file(self) -> str | None:
        """The SQLite database's file (None on PostgreSQL, and for a database in memory)."""
        database = self.engine.url.database
        return database if self.dialect == "sqlite" and database and database != ":memory:" else None

    @contextmanager
    def read(self) -> Iterator[Transaction]:
        """A connection for reading; a database failure is a `StoreError`.

        On SQLite its transaction is a deferred one: in WAL mode a reader neither waits for the writer nor
        holds it up (the hold runner's poll, taking the write lock, kept the gate's writer waiting)."""
        try:
            with self.engine.connect().execution_options(**_READING) as conn:
                yield conn
        except self._failures as exc:
            raise self.failed(exc) from exc

    def failed(self, exc: Exception) -> StoreError:
        """The project's error for what SQLAlchemy or the driver raised (`failure_reason`)."""
        reason = failure_reason(exc)
        if refused_by_store(exc):
            return StoreRefusedError(f"the store {self.url} refused a write: {reason}")
        if self.dialect == "sqlite" and reason in _SQLITE_DAMAGED:
            return StoreError(f"the store {self.url} failed: {reason}. The file is damaged or is not this store: "
                              "stop the service, move the file aside (with its -wal and -shm files) and restore it "
                              "from a backup, or start on a new store there (holds, spend and the audit trail "
                              "start empty)")
        return StoreError(f"the store {self.url} failed: {reason}")

    def insert_ignore(self, table: sa.Table) -> Any:
        """An INSERT that does nothing when the primary key exists (upsert's first half)."""
        dialect = sqlite if self.dialect == "sqlite" else postgresql
        return dialect.insert(table).on_conflict_do_nothing()

    def for_update(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """Row locks on PostgreSQL; SQLite's `BEGIN IMMEDIATE` already holds the only write lock."""
        return query.with_for_update() if self.dialect == "postgresql" else query

    def notify(self, tx: Transaction, payload: str) -> None:
        """Tell other routers a hold changed (PostgreSQL LISTEN/NOTIFY; SQLite routers poll)."""
        if self.dialect == "postgresql":
            tx.execute(sa.text(f"SELECT pg_notify({HOLD_CHANNEL_SQL}, :payload)"), {"payload": payload})

    def migrate(self) -> str:
        """Apply the migrations under a lock; returns the revision the store is at."""
        try:
            if self.dialect == "sqlite":
                with _file_lock(self.engine), self.engine.begin() as conn:
                    return upgrade(conn)
            with self.engine.begin() as conn:
                # Another router's migration may hold the lock, and a migration may rewrite a large table: neither is
                # cut short by the session's timeouts (`PG_SESSION_DEFAULTS`).
                conn.execute(sa.text("SET LOCAL lock_timeout = 0"))
                conn.execute(sa.text("SET LOCAL statement_timeout = 0"))
                conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
                return upgrade(conn)
        except OperationalError as exc:
            raise StoreError(f"cannot reach the store {self.url}: {exc.orig}") from exc
        except SQLAlchemyError as exc:
            raise self.failed(exc) from exc

    def close(self) -> None:
        self.engine.dispose()


@contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database
    if not database or database == ":memory:":
        yield
        return
    fd = open_private_file(Path(database + ".lock"))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _prepare_sqlite_file(database: str) -> None:
    """Create the SQLite file 0600 before SQLite does, in a 0700 folder when we create the folder.

    The store holds held calls' arguments (docs/architecture.md §7): only we may read it. SQLite
    gives its -wal and -shm files the mode of the database file, so they are 0600 too; files an
    older release left wider are made 0600. A folder the user chose for the file is theirs to keep.
    Paths only, never open and close: closing any descriptor of a SQLite file drops the POSIX locks
    this process's connections hold on it.
    """
    path = Path(database)
    if not path.parent.is_dir():  # missing, or not a folder: refused, saying so
        ensure_private_dir(path.parent, "HANDLER_STATE_DIR")
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, PRIVATE_FILE_MODE))
    for suffix in ("", "-wal", "-shm", ".lock"):
        file = Path(database + suffix)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_IMODE(file.stat().st_mode) != PRIVATE_FILE_MODE:
                file.chmod(PRIVATE_FILE_MODE)


# libpq's, for every PostgreSQL connection the store makes, unless its URL sets them: a server that does not answer
# fails a connection in 10 s instead of the system's minutes of TCP retries, and one that stopped answering
# mid-transaction is found dead by keepalives in about a minute, so the records of calls are retried, not stalled.
PG_CONNECTION_DEFAULTS: Mapping[str, str] = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "30",
                                             "keepalives_interval": "10", "keepalives_count": "3"}
# The server's, for every session the store opens, unless the URL's `options` set them: a row or lock another session
# holds (an operator's open transaction in psql, a stuck router) fails the statement waiting for it after 10 s, so
# the call or the records waiting on it are answered or retried instead of stalled; no statement runs longer than a
# minute; and a session left idle inside its transaction for a minute is ended by the server, its locks freed.
# Migrations lift the first two for their own transaction (`Store.migrate`).
PG_SESSION_DEFAULTS: Mapping[str, str] = {"lock_timeout": "10s", "statement_timeout": "60s",
                                          "idle_in_transaction_session_timeout": "60s"}
_SETTING = re.compile(r"(?:-c\s*|--)([A-Za-z_.]+)=")  # a setting in `options`: "-c name=value" or "--name=value"


def _connection_defaults(url: sa.engine.URL) -> dict[str, str]:
    """`PG_CONNECTION_DEFAULTS` less what the URL sets itself, and `options` with the URL's own and
    `PG_SESSION_DEFAULTS` less those it sets."""
    found = {key: value for key, value in PG_CONNECTION_DEFAULTS.items() if key not in url.query}
    given = _query_text(url.query.get("options", ""))
    named = set(_SETTING.findall(given))
    settings = [f"-c {key}={value}" for key, value in PG_SESSION_DEFAULTS.items() if key not in named]
    if settings:
        found["options"] = " ".join(filter(None, (given, *settings)))
    return found


def _query_text(value: str | tuple[str, ...]) -> str:
    """A URL query parameter as one string: one given several times (`options`), its values joined by spaces."""
    return " ".join(value) if isinstance(value, tuple) else value


def _sqlite_engine(url: str) -> Engine:
    database = sa.engine.make_url(url).database
    if database and database != ":memory:":
        try:
            _prepare_sqlite_file(database)
        except OSError as exc:
            raise StoreError(f"cannot prepare the store's file {database}: {exc}") from None
    engine = sa.create_engine(url, connect_args={"timeout": 60.0}, pool_size=8, max_overflow=8)

    @sa.event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transactions out of the driver's hands so that `begin` below decides how they start.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=60000")
        cursor.close()

    @sa.event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READING_KEY) else "BEGIN IMMEDIATE")

    return engine


def store_exists(url: str) -> bool:
    """False for a SQLite file not created yet (read-only commands then show an empty store)."""
    if not url.startswith("sqlite"):
        return True
    database = sa.engine.make_url(url).database
    return not database or database == ":memory:" or Path(database).exists()


def _in_memory(url: sa.engine.URL) -> bool:
    """Whether a SQLite URL names a database in memory: no file (`sqlite://`), `:memory:`, or a `file:` URI's."""
    database = url.database or ""
    return database in ("", ":memory:") or database.startswith("file::memory:") or url.query.get("mode") == "memory"


def open_store(url: str, *, migrate: bool = True) -> Store:
    """Open the store at `url` (see `store_url`) and, by default, bring its schema up to date."""
    try:
        backend = sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"cannot use the store URL {url!r}: {exc}") from exc
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported store '{backend}' in {url!r}: use SQLite (the default) or PostgreSQL "
                         "(HANDLER_STORE_URL=postgresql://user@host/db)")
    if backend == "sqlite" and _in_memory(sa.engine.make_url(url)):
        raise StoreError(f"the store URL {url!r} names a SQLite database in memory, which no other process sees (the "
                         "service's holds would be out of reach of 'handler approvals', and each command would find "
                         "an empty store): name a file, e.g. HANDLER_STORE_URL=sqlite:////var/lib/handler/handler.db, "
                         "or unset HANDLER_STORE_URL for handler.db in the state folder")
    try:
        if backend == "sqlite":
            engine = _sqlite_engine(url)
        else:
            engine = sa.create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True,
                                      connect_args=_connection_defaults(sa.engine.make_url(url)))
        store = Store(engine)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise StoreError(f"cannot use the store URL {url!r}: {exc}") from exc
    if migrate:
        try:
            store.migrate()
        except StoreError:
            store.close()
            raise
    return store
