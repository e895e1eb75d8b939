"""`handler status` as an operator reads it: asked of the living service, "not running" once it stopped (with
the last record as history), a second start that stops before writing anything, a busy port that names
`--http`, and the pricing violations of this month."""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.governance.store import open_store, store_url
from reconciler.governance.store.audit import record
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.governance.store.test_set_aside import refuse_a_row

HANDLER = str(Path(sys.executable).with_name("handler"))
DEADLINE = 30.0


@pytest.fixture
def tree() -> Iterator[Path]:
    with short_dir() as base:
        yield write_echo_tree(base / "t")


def _env(run_dir: Path) -> dict[str, str]:
    return {**os.environ, "HANDLER_RUN_DIR": str(run_dir), TOKEN_ENV: "t"}


def _status(root: Path, *more: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HANDLER, "status", str(root), *more], capture_output=True, text=True,
                          timeout=60, check=False)


def _up(root: Path, run_dir: Path, http: str = "127.0.0.1:0") -> subprocess.Popen[str]:
    proc = subprocess.Popen([HANDLER, "up", str(root), "--http", http], env=_env(run_dir), stderr=subprocess.PIPE,
                            text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # up to its banner's last line: it serves
        seen.append(line)
        if "Ctrl-C" in line:
            return proc
    raise AssertionError("".join(seen))


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=DEADLINE) == 0
    assert proc.stderr is not None
    proc.stderr.close()


def test_status_asks_the_running_service_and_says_not_running_once_it_stopped(tree: Path) -> None:
    run_dir = tree.parent / "run"
    proc = _up(tree, run_dir)
    try:
        live = _status(tree)
        assert live.returncode == 0, live.stderr
        assert f"running: pid {proc.pid}, run folder {run_dir}" in live.stdout
        assert "ready:   yes" in live.stdout
        doc = json.loads(_status(tree, "--format", "json").stdout)
        assert doc["running"]["pid"] == proc.pid
        assert doc["applied"]["generation"] == 1
    finally:
        _stop(proc)
    after = _status(tree)
    assert after.returncode == 3, after
    assert after.stdout.startswith("not running: no handler service runs on the state folder")
    assert "last recorded (history, not now):" in after.stdout
    assert json.loads(_status(tree, "--format", "json").stdout)["running"] is False


def test_a_second_start_on_the_same_state_stops_before_writing_anything(tree: Path) -> None:
    first = _up(tree, tree.parent / "run")
    try:
        status_file = tree / ".handler/status.json"
        before = status_file.read_bytes()
        second = subprocess.run([HANDLER, "up", str(tree), "--http", "127.0.0.1:0"], capture_output=True, text=True,
                                env=_env(tree.parent / "run2"), timeout=DEADLINE, check=False)
        assert second.returncode != 0
        assert f"already runs on the state folder {tree / '.handler'} (pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        assert status_file.read_bytes() == before  # the first service's status, untouched
        assert not (tree.parent / "run2/profiles").exists()  # no socket left behind
        assert _status(tree).returncode == 0  # the first still answers
    finally:
        _stop(first)


def test_a_second_service_on_the_same_run_folder_is_refused_and_the_first_keeps_its_sockets(tree: Path) -> None:
    """Another tree, so another state folder, but the same run folder: the second would take the first's control
    socket and clear its connectors' inboxes, so it stops and names the option that separates them."""
    run_dir = tree.parent / "run"
    first = _up(tree, run_dir)
    try:
        other = write_echo_tree(tree.parent / "t2")
        second = subprocess.run([HANDLER, "up", str(other), "--http", "127.0.0.1:0"], capture_output=True, text=True,
                                env=_env(run_dir), timeout=DEADLINE, check=False)
        assert second.returncode != 0
        assert f"already runs on the run folder {run_dir} (pid {first.pid}" in second.stderr, second.stderr
        assert "--run-dir" in second.stderr
        assert "Traceback" not in second.stderr
        assert not (other / ".handler/status.json").exists()
        live = _status(tree)  # the first still answers on its own control socket
        assert live.returncode == 0, live.stderr
        assert f"running: pid {first.pid}, run folder {run_dir}" in live.stdout
    finally:
        _stop(first)


def test_a_busy_port_is_named_with_the_option_that_changes_it(tree: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = subprocess.run([HANDLER, "up", str(tree), "--http", f"127.0.0.1:{port}"], capture_output=True,
                              text=True, env=_env(tree.parent / "run"), timeout=DEADLINE, check=False)
    assert done.returncode != 0
    assert f"127.0.0.1:{port} is already in use" in done.stderr
    assert "--http HOST:PORT" in done.stderr
    assert "Errno" not in done.stderr
    assert not (tree / ".handler/status.json").exists()  # stopped before writing anything


def test_status_counts_the_pricing_violations_and_the_rows_set_aside_of_this_month(tree: Path) -> None:
    proc = _up(tree, tree.parent / "run")
    try:
        quiet = _status(tree)
        assert quiet.returncode == 0, quiet.stderr
        assert "pricing violations" not in quiet.stdout  # none yet: nothing to say
        assert "refused" not in quiet.stdout
        store = open_store(store_url(tree))
        try:
            for _ in range(2):
                with store.begin() as tx:
                    record(tx, "pricing_violation", profile="tester", tool="echo_say",
                           detail={"binding": "echo-local", "reported": 1_000_000, "reserved": 10_000})
            refuse_a_row(store)
        finally:
            store.close()
        told = _status(tree)
        assert "pricing violations this month: 2" in told.stdout, told.stdout
        assert "rows the store refused this month: 1" in told.stdout
        assert "`handler audit --event set_aside` lists them" in told.stdout
        shown = json.loads(_status(tree, "--format", "json").stdout)
        assert (shown["pricingViolations"], shown["setAside"]) == (2, 1)
    finally:
        _stop(proc)


def test_a_store_that_cannot_be_read_is_one_line_of_the_status_not_its_end(tree: Path) -> None:
    proc = _up(tree, tree.parent / "run")
    database = tree / ".handler/handler.db"
    try:
        with sqlite3.connect(database) as db:  # a migration gone wrong, say
            db.execute("ALTER TABLE audit RENAME TO audit_aside")
        told = _status(tree)
        assert told.returncode == 0, told.stderr
        assert "running: pid" in told.stdout  # the rest of the status, as ever
        assert "profile tester: echo → echo-local" in told.stdout
        assert "store: cannot be read now: the store sqlite:" in told.stdout
        assert "no such table: audit" in told.stdout
        shown = json.loads(_status(tree, "--format", "json").stdout)
        assert "no such table: audit" in shown["storeProblem"]
        assert shown["setAside"] is None
    finally:
        with sqlite3.connect(database) as db:
            db.execute("ALTER TABLE audit_aside RENAME TO audit")
        _stop(proc)
