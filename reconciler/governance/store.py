"""The store behind holds, spend and the audit trail: one schema (SQLAlchemy Core), two backends.

SQLite (WAL) at `$HANDLER_STATE_DIR/handler.db` by default, embedded; PostgreSQL when
`HANDLER_STORE_URL` names one, so that several routers share approvals and caps. Every write
happens in one short transaction: on SQLite it is `BEGIN IMMEDIATE` (one writer at a time, across
processes), on PostgreSQL row locks taken in a fixed order. The schema is applied by Alembic
(`migrations/`), at start and by `handler store migrate`, under a lock so that two routers starting
together cannot race: a file lock beside the SQLite file, `pg_advisory_xact_lock` on PostgreSQL.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from reconciler.governance.errors import StoreError

__all__ = [
    "HOLD_CHANNEL",
    "Store",
    "audit",
    "balances",
    "holds",
    "metadata",
    "notices",
    "open_store",
    "reservations",
    "spend",
    "store_exists",
    "store_url",
]

metadata = sa.MetaData()

# A held call: what the approver sees, its decision and, once run, its result.
holds = sa.Table(
    "holds", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("revision", sa.String(80), nullable=False),
    sa.Column("profile", sa.String(200), nullable=False),
    sa.Column("instance", sa.String(200), nullable=False),
    sa.Column("parent_instance", sa.String(200)),
    sa.Column("interface", sa.String(200), nullable=False),
    sa.Column("tool", sa.String(200), nullable=False),
    sa.Column("binding", sa.String(200), nullable=False),
    sa.Column("arguments", sa.JSON, nullable=False),
    sa.Column("cost", sa.BigInteger, nullable=False),  # the estimate, micro-USD
    sa.Column("approver", sa.JSON),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("trace", sa.JSON, nullable=False),
    # pending → approved → running → executed | failed; pending → rejected
    sa.Column("state", sa.String(16), nullable=False, index=True),
    sa.Column("decided_by", sa.String(200)),
    sa.Column("decided_at", sa.Float),
    sa.Column("claimed_by", sa.String(80)),
    sa.Column("claimed_at", sa.Float),
    sa.Column("finished_at", sa.Float),
    sa.Column("result", sa.JSON),
    sa.Column("message", sa.Text, nullable=False, server_default=""),
    sa.Column("charged", sa.BigInteger),
)

# Every decision and every change of a hold or the balance, in order.
audit = sa.Table(
    "audit", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("at", sa.Float, nullable=False, index=True),
    sa.Column("event", sa.String(32), nullable=False),
    sa.Column("request_id", sa.String(40), index=True),
    sa.Column("profile", sa.String(200)),
    sa.Column("instance", sa.String(200)),
    sa.Column("tool", sa.String(200)),
    sa.Column("actor", sa.String(200)),
    sa.Column("status", sa.String(16)),
    sa.Column("detail", sa.JSON, nullable=False),
)

# Spend per scope ("org:acme", "profile:assistant", "instance:assistant/abc") per calendar month (UTC).
spend = sa.Table(
    "spend", metadata,
    sa.Column("scope", sa.String(420), primary_key=True),
    sa.Column("month", sa.String(7), primary_key=True),
    sa.Column("micros", sa.BigInteger, nullable=False),
)

# The prepaid balance of an org, micro-USD.
balances = sa.Table(
    "balances", metadata,
    sa.Column("account", sa.String(200), primary_key=True),
    sa.Column("micros", sa.BigInteger, nullable=False),
)

# One reservation per admitted priced call, settled to the actual cost or released.
reservations = sa.Table(
    "reservations", metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("request_id", sa.String(40)),
    sa.Column("month", sa.String(7), nullable=False),
    sa.Column("scopes", sa.JSON, nullable=False),
    sa.Column("account", sa.String(200)),  # the prepaid account charged, if any
    sa.Column("reserved", sa.BigInteger, nullable=False),
    sa.Column("charged", sa.BigInteger),
    sa.Column("state", sa.String(16), nullable=False),  # reserved | settled | released
)

# The outbox of approver notifications: one row per hold and channel target, written with the hold
# in one transaction, so a hold is never stored without its notices; sent (and retried) by the
# notifier of `handler up`.
notices = sa.Table(
    "notices", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("hold_id", sa.String(40), nullable=False, index=True),
    sa.Column("channel", sa.String(16), nullable=False),  # email | slack
    sa.Column("target", sa.String(320), nullable=False),  # an email address, a Slack channel
    sa.Column("member", sa.String(200)),  # the member an email's link decides as
    sa.Column("state", sa.String(16), nullable=False, index=True),  # pending, sending, sent, failed, skipped, closed
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("next_at", sa.Float, nullable=False),
    sa.Column("claimed_at", sa.Float),
    sa.Column("sent_at", sa.Float),
    sa.Column("ref", sa.String(200)),  # the channel's id of what was sent (a Slack message's ts)
    sa.Column("error", sa.Text),
    sa.UniqueConstraint("hold_id", "channel", "target", name="uq_notices_target"),
)

HOLD_CHANNEL = "handler_holds"  # PostgreSQL NOTIFY channel: a hold was decided
_DEFAULT_STATE_DIR = ".handler"


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
    state = state_dir or Path(env.get("HANDLER_STATE_DIR") or Path(root) / _DEFAULT_STATE_DIR)
    return f"sqlite:///{state / 'handler.db'}"


class Store:
    """An engine on the store with the few dialect-specific operations the rooms need."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.dialect = engine.dialect.name
        self.extras: dict[str, object] = {}  # per-store caches of the rooms (prepared statements)
        self._writer = threading.Lock() if self.dialect == "sqlite" else None
        if self.dialect not in ("sqlite", "postgresql"):
            raise StoreError(f"unsupported store '{self.dialect}': use SQLite or PostgreSQL")

    @property
    def url(self) -> str:
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """One write transaction (`BEGIN IMMEDIATE` on SQLite).

        On SQLite the threads of one process take turns here first: SQLite has one writer at a time,
        and a thread waiting in its busy handler sleeps in steps of milliseconds, while one waiting
        on this lock wakes as soon as the writer before it commits. Other processes still wait in
        SQLite's busy handler.
        """
        if self._writer is None:
            with self.engine.begin() as conn:
                yield conn
            return
        with self._writer, self.engine.begin() as conn:
            yield conn

    def insert_ignore(self, table: sa.Table) -> Any:
        """An INSERT that does nothing when the primary key exists (upsert's first half)."""
        dialect = sqlite if self.dialect == "sqlite" else postgresql
        return dialect.insert(table).on_conflict_do_nothing()

    def for_update(self, query: sa.Select[Any]) -> sa.Select[Any]:
        """Row locks on PostgreSQL; SQLite's `BEGIN IMMEDIATE` already holds the only write lock."""
        return query.with_for_update() if self.dialect == "postgresql" else query

    def notify(self, conn: Connection, payload: str) -> None:
        """Tell other routers a hold changed (PostgreSQL LISTEN/NOTIFY; SQLite routers poll)."""
        if self.dialect == "postgresql":
            conn.execute(sa.text("SELECT pg_notify(:channel, :payload)"), {"channel": HOLD_CHANNEL, "payload": payload})

    def migrate(self) -> str:
        """Apply the migrations under a lock; returns the revision the store is at."""
        from reconciler.governance.migrating import upgrade

        if self.dialect == "sqlite":
            with _file_lock(self.engine), self.engine.begin() as conn:
                return upgrade(conn)
        with self.engine.begin() as conn:
            conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK})
            return upgrade(conn)

    def close(self) -> None:
        self.engine.dispose()


_MIGRATION_LOCK = 0x48414E444C4552  # "HANDLER": the advisory lock key of migrations


@contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    database = engine.url.database
    if not database or database == ":memory:":
        yield
        return
    with Path(database + ".lock").open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _sqlite_engine(url: str) -> Engine:
    database = sa.engine.make_url(url).database
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
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
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def store_exists(url: str) -> bool:
    """False for a SQLite file not created yet (read-only commands then show an empty store)."""
    if not url.startswith("sqlite"):
        return True
    database = sa.engine.make_url(url).database
    return not database or database == ":memory:" or Path(database).exists()


def open_store(url: str, *, migrate: bool = True) -> Store:
    """Open the store at `url` (see `store_url`) and, by default, bring its schema up to date."""
    try:
        backend = sa.engine.make_url(url).get_backend_name()
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"cannot use the store URL {url!r}: {exc}") from exc
    if backend not in ("sqlite", "postgresql"):
        raise StoreError(f"unsupported store '{backend}' in {url!r}: use SQLite (the default) or PostgreSQL "
                         "(HANDLER_STORE_URL=postgresql://user@host/db)")
    try:
        if backend == "sqlite":
            engine = _sqlite_engine(url)
        else:
            engine = sa.create_engine(url, pool_size=10, max_overflow=20, pool_pre_ping=True)
        store = Store(engine)
    except (sa.exc.ArgumentError, sa.exc.NoSuchModuleError) as exc:
        raise StoreError(f"cannot use the store URL {url!r}: {exc}") from exc
    if migrate:
        try:
            store.migrate()
        except sa.exc.OperationalError as exc:
            store.close()
            raise StoreError(f"cannot reach the store {store.url}: {exc.orig}") from exc
    return store


def now() -> float:
    return time.time()
