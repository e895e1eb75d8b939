"""The store's engine: where it lives, its migrations on both backends, two routers migrating at once, and
database failures as `StoreError`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext

from reconciler.config.snapshot import Snapshot
from reconciler.governance.errors import StoreError, StoreRefusedError
from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store, migrate, open_store, store_exists, store_url
from reconciler.governance.store.audit import audit_row, insert_audit, read_audit
from reconciler.governance.store.holds import fetch_hold, insert_hold
from reconciler.governance.store.migrate import head_revision
from reconciler.governance.store.tables import metadata
from tests.governance.builders import OWNERS_ORG, cap_snapshot, make_snapshot, priced_call
from tests.governance.governed import mail, run


def test_the_default_store_is_sqlite_in_the_state_folder(tmp_path: Path) -> None:
    assert store_url(tmp_path, {}) == f"sqlite:///{tmp_path / '.handler' / 'handler.db'}"
    assert store_url(tmp_path, {"HANDLER_STATE_DIR": "/srv/state"}) == "sqlite:////srv/state/handler.db"
    assert store_url(tmp_path, {"HANDLER_STORE_URL": "postgresql://u@db/h"}) == "postgresql+psycopg://u@db/h"


def test_sqlite_runs_in_wal_mode_and_is_created_on_first_open(sqlite_url: str) -> None:
    assert not store_exists(sqlite_url)
    store = open_store(sqlite_url)
    try:
        assert store_exists(sqlite_url)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        store.close()


def test_migrations_build_exactly_the_declared_schema(store: Store) -> None:
    with store.engine.connect() as conn:
        context = MigrationContext.configure(conn)
        assert context.get_current_revision() == head_revision()
        assert compare_metadata(context, metadata) == []


def test_migrating_twice_changes_nothing(store: Store) -> None:
    assert store.migrate() == head_revision()
    assert store.migrate() == head_revision()


def _alembic(conn: sa.Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrate.__file__).parent / "migrations"))
    config.attributes["connection"] = conn
    return config


def test_a_store_of_the_previous_revision_is_migrated_with_its_holds_kept(store_url: str) -> None:
    """0003 adds a hold's decision reason and a failed run's cause (holds stored before read None for both),
    0004 the budget leases, 0005 indexes only pricing violations by time, 0006 rows set aside by time, 0007 guards
    SQLite's sums, 0008 adds the MCP endpoints' tokens, 0009 the alerts of bindings not set up."""
    store = open_store(store_url, migrate=False)
    try:
        with store.engine.begin() as conn:
            command.upgrade(_alembic(conn), "0002")
        with store.begin() as tx:
            insert_hold(tx, {"id": "req_old", "revision": "r1", "profile": "p", "instance": "i",
                             "parent_instance": None, "interface": "mail/v1", "tool": "mail_send",
                             "binding": "mail-b", "arguments": {}, "cost": 0, "approver": None, "reason": "held",
                             "trace": []})
        assert store.migrate() == head_revision() == "0009"
        with store.engine.connect() as conn:
            indexes = {i["name"] for i in sa.inspect(conn).get_indexes("audit")}
        assert indexes == {"ix_audit_request_id", "ix_audit_violations", "ix_audit_set_aside"}
        row = fetch_hold(store, "req_old")
        assert row is not None
        assert (row["state"], row["decision_reason"], row["cause"]) == ("pending", None, None)
        with store.engine.begin() as conn:  # and back: the downgrade drops exactly those columns and leases
            command.downgrade(_alembic(conn), "0002")
        with store.engine.connect() as conn:
            columns = {c["name"] for c in sa.inspect(conn).get_columns("holds")}
            assert not {"leases", "tokens"} & set(sa.inspect(conn).get_table_names())
            assert "ix_audit_at" in {i["name"] for i in sa.inspect(conn).get_indexes("audit")}
        assert "decision_reason" not in columns
        assert "cause" not in columns
        assert "message" in columns
    finally:
        store.close()


def test_a_reader_is_not_held_up_by_a_writer_and_sees_what_was_committed(store: Store) -> None:
    """The hold runner polls while the gate's writer commits: a read neither waits for a write transaction
    nor sees what it has not committed (SQLite's WAL, PostgreSQL's MVCC)."""
    hold = {"id": "req_committed", "revision": "r1", "profile": "p", "instance": "i", "parent_instance": None,
            "interface": "mail/v1", "tool": "mail_send", "binding": "mail-b", "arguments": {}, "cost": 0,
            "approver": None, "reason": "held", "trace": []}
    with store.begin() as tx:
        insert_hold(tx, hold)
    with store.begin() as tx:
        insert_hold(tx, {**hold, "id": "req_uncommitted"})
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # another thread, as the store's workers read
            seen = pool.submit(lambda: [fetch_hold(store, rid) is not None
                                        for rid in ("req_committed", "req_uncommitted")]).result(timeout=10)
    assert seen == [True, False]
    assert fetch_hold(store, "req_uncommitted") is not None


def test_a_store_a_newer_version_migrated_is_refused_saying_what_to_do_and_left_as_it_is(store_url: str) -> None:
    """A host not yet upgraded, restarting during a rolling upgrade (docs/scaling.md): it must not touch the schema."""
    store = open_store(store_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        store.close()
    with pytest.raises(StoreError) as refused:
        open_store(store_url)
    assert f"revision 9999, which this version does not know (its newest is {head_revision()})" in str(refused.value)
    assert "Upgrade handler on this host" in str(refused.value)
    store = open_store(store_url, migrate=False)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "9999"
            assert "leases" in sa.inspect(conn).get_table_names()
    finally:
        store.close()


def test_two_processes_migrating_together_do_not_race(store_url: str) -> None:
    code = ("import sys; from reconciler.governance.store import open_store; "
            "s = open_store(sys.argv[1]); print(s.migrate()); s.close()")
    procs = [subprocess.Popen([sys.executable, "-c", code, store_url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    outs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    assert {o.strip() for o, _ in outs} == {head_revision()}
    store = open_store(store_url, migrate=False)
    try:
        with store.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM alembic_version")).scalar() == 1
    finally:
        store.close()


def test_an_unreachable_store_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot reach the store"):
        open_store("postgresql+psycopg://postgres@127.0.0.1:9/none?connect_timeout=2")
    with pytest.raises(StoreError, match="unsupported store"):
        open_store("mysql+nosuchdriver://x/y")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///file:h?mode=memory&uri=true",
                                 "sqlite:///file::memory:?uri=true"])
def test_a_sqlite_store_in_memory_is_refused_asking_for_a_file(url: str) -> None:
    # It once failed in SQLAlchemy on the file pool's arguments; made to open, no other process would see its holds.
    with pytest.raises(StoreError, match=r"names a SQLite database in memory, which no other process sees .*: name "
                       r"a file, e.g. HANDLER_STORE_URL=sqlite:////var/lib/handler/handler.db"):
        open_store(url)


def test_a_failed_statement_is_a_store_error_that_quotes_no_arguments(store: Store) -> None:
    values = {"id": "req_1", "revision": "r1", "profile": "p", "instance": "i", "parent_instance": None,
              "interface": "mail/v1", "tool": "mail_send", "binding": "mail-b", "arguments": {"password": "hunter2"},
              "cost": 0, "approver": None, "reason": "held", "trace": []}
    with store.begin() as tx:
        insert_hold(tx, values)
    with pytest.raises(StoreRefusedError, match="refused a write") as failed, store.begin() as tx:
        insert_hold(tx, values)  # the same id again: the store is up, it refuses the data
    assert "hunter2" not in str(failed.value)
    assert store.url in str(failed.value)


def test_a_failed_read_is_a_store_error(store: Store) -> None:
    with pytest.raises(StoreError, match="no_such_table"), store.read() as conn:
        conn.execute(sa.text("SELECT * FROM no_such_table"))


def test_records_that_cannot_be_committed_are_logged_and_the_decisions_stand(
        store: Store, caplog: pytest.LogCaptureFixture) -> None:
    """Two decisions, so that PostgreSQL's rows go in by COPY through the driver's own connection: what the driver
    raises there is a `StoreError` too, which the flush logs and keeps its rows for."""
    governor = GovernedGate(store, owns_store=False, batch_seconds=3600)
    snapshot = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    assert [governor.admit_now(snapshot, priced_call()).status for _ in range(2)] == ["executed", "executed"]
    with store.begin() as tx:
        tx.execute(sa.text("DROP TABLE audit"))
    with caplog.at_level(logging.WARNING, logger="handler.governance"):
        governor.close()
    assert "could not record 4 audit/spend rows" in caplog.text  # two decisions and their reservations
    assert 'relation "audit" does not exist' in caplog.text or "no such table: audit" in caplog.text


def test_a_burst_of_audit_rows_committed_at_once_lands_whole_and_in_order(store: Store) -> None:
    """More rows than one statement takes on SQLite, as a busy router's flush brings them: every field kept."""
    rows = [audit_row("settled" if n % 3 else "decided", request_id=f"req_{n:06d}", profile="p", instance=f"i{n % 7}",
                      tool=None if n % 2 else "search_query", status="executed",
                      detail={"n": n, "note": "a \"quoted\" value, and ünïcode"})
            for n in range(700)]
    with store.begin() as tx:
        insert_audit(tx, *rows)
    trail = read_audit(store, limit=1000)
    assert [(r["at"], r["event"], r["request_id"], r["profile"], r["instance"], r["tool"], r["actor"], r["status"])
            for r in trail] == [row[:8] for row in rows]
    assert [r["detail"] for r in trail] == [{"n": n, "note": "a \"quoted\" value, and ünïcode"} for n in range(700)]


def test_store_connections_the_server_cuts_are_replaced_and_every_record_lands(pg_admin: str, pg_url: str) -> None:
    """PostgreSQL ends every connection of the router (a failover, an operator's `pg_terminate_backend`) between
    calls: the next calls are decided as before, a hold is stored at once, capped calls are admitted, and every
    flush commits; each call is in the trail and the spend."""
    name = "handler-test-" + secrets.token_hex(4)
    store = open_store(f"{pg_url}&application_name={name}")
    free = make_snapshot({"p": {"template": "permissive"}}, org=dict(OWNERS_ORG))
    capped = cap_snapshot()
    price = to_micros(0.005)  # search_query's

    async def calls(governor: GovernedGate, snapshot: Snapshot, instance: str, count: int) -> None:
        for _ in range(count):
            admission = await governor.admit(snapshot, priced_call(instance))
            assert admission.status == "executed", admission.message
            await governor.settle(admission, None, True)
        await governor.flush()

    def cut() -> int:
        with psycopg.connect(pg_admin, autocommit=True) as admin:
            row = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                "WHERE application_name = %s", (name,)).fetchone()
        assert row is not None
        return int(row[0])

    async def scenario(governor: GovernedGate) -> None:
        await calls(governor, free, "i1", 5)
        await calls(governor, capped, "i2", 5)
        assert await asyncio.to_thread(cut) >= 1
        held = await governor.admit(capped, mail())  # written in a transaction of its own before the agent hears
        assert held.status == "pending", held.message
        await calls(governor, free, "i1", 5)
        await calls(governor, capped, "i2", 5)
        settled = [r for r in await asyncio.to_thread(read_audit, store, limit=1000) if r["event"] == "settled"]
        assert sum(r["detail"].get("calls", 1) for r in settled) == 20  # the flushes after the cut committed

    try:
        run(scenario, store)
        trail = read_audit(store, limit=1000)
        counted: dict[str, int] = {}
        for row in trail:
            if row["event"] == "settled":
                counted[row["instance"]] = counted.get(row["instance"], 0) + row["detail"].get("calls", 1)
        assert counted == {"i1": 10, "i2": 10}
        assert {r["scope"]: r["micros"] for r in spend_report(store)}["profile:p"] == 20 * price
    finally:
        store.close()


def test_a_postgresql_server_that_never_answers_fails_the_start_in_seconds_naming_it() -> None:
    """A store whose host takes the connection and says nothing (a hung server, a black-holed port) is a
    `StoreError` after the connection timeout, not a start that hangs for the system's minutes of retries."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreError, match="timeout") as failed:
            open_store(f"postgresql+psycopg://handler@127.0.0.1:{port}/store?connect_timeout=1")
        assert time.monotonic() - started < 10
    assert f"127.0.0.1:{port}" in str(failed.value)


def test_every_postgresql_connection_has_a_connect_timeout_and_keepalives_unless_the_url_says(pg_url: str) -> None:
    store = open_store(pg_url)
    try:
        with store.engine.connect() as conn:
            driver = conn.connection.driver_connection
            assert driver is not None
            settings = {o.keyword.decode(): o.val for o in driver.pgconn.info}
        shown = (settings["connect_timeout"], settings["keepalives"], settings["keepalives_idle"])
        assert shown == (b"10", b"1", b"30")
        assert "connect_timeout=10" in store.driver_dsn  # the listener's and the loop's commits' connections
    finally:
        store.close()
    said = open_store(f"{pg_url}&connect_timeout=3", migrate=False)
    try:
        assert "connect_timeout=3" in said.driver_dsn
        assert "connect_timeout=10" not in said.driver_dsn
    finally:
        said.close()
