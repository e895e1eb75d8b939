"""Agent runs across a restart of the router (`reconciler/router/runjournal.py`, docs/agents.md "Runs across a
restart"): the agent that started them asks the next router, which says how each ended and what to do next.

`handler serve` on the agents tree, as a real process; the profile `boss` starts runs of `worker` over its socket,
the way a host's session does. The router is stopped (SIGTERM) or killed (SIGKILL) under a running run, then started
again on the same state folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from reconciler.governance.holds import get_hold
from reconciler.governance.store import open_store
from reconciler.governance.store.engine import store_url
from reconciler.router.runs import LOST, RESULT_LOST, STOPPED
from tests.fixtures.agents_tree import processes_of, write_agents_tree
from tests.fixtures.harness import DEADLINE
from tests.fixtures.matrix import HANDLER
from tests.router.test_handoff import INIT, call, line
from tests.router.test_restart import router

pytestmark = pytest.mark.usefixtures("echo_secret")


def ask(run_dir: Path, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """One call of boss's, in a session of its own, as a host's agent makes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client, client.makefile("rb") as reader:
        client.connect(str(run_dir / "profiles/boss.sock"))
        client.sendall(line(INIT))
        assert orjson.loads(reader.readline())["id"] == 1
        client.sendall(call(2, tool, arguments))
        reply = orjson.loads(reader.readline())
    assert "result" in reply, reply
    body: dict[str, Any] = reply["result"]["structuredContent"]
    return body


def until_ended(run_dir: Path, run: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE
    while (status := ask(run_dir, "agent_status", {"run": run}))["status"] == "running":
        assert time.monotonic() < deadline, f"run {run} never ended"
        time.sleep(0.1)
    return status


def test_after_a_stop_the_next_router_says_how_each_run_ended_and_what_to_do(tmp_path: Path, run_dir: Path) -> None:
    root = write_agents_tree(tmp_path / "t", timeout=60)
    with router(root, run_dir, profile="boss") as first:
        done = ask(run_dir, "agent_run", {"agent": "worker", "input": "hello"})["run"]
        assert "result" in until_ended(run_dir, done)
        crashing = ask(run_dir, "agent_run", {"agent": "worker", "input": "crash"})["run"]
        assert until_ended(run_dir, crashing)["status"] == "failed"
        sleeping = ask(run_dir, "agent_run", {"agent": "worker", "input": "sleep"})["run"]
        time.sleep(0.5)
        first.send_signal(signal.SIGTERM)
        assert first.wait(DEADLINE) == 0
    assert not processes_of(sleeping)
    with router(root, run_dir, profile="boss"):
        assert ask(run_dir, "agent_status", {"run": done}) == {
            "run": done, "agent": "worker", "status": "succeeded", "error": RESULT_LOST}
        assert ask(run_dir, "agent_status", {"run": crashing}) == {
            "run": crashing, "agent": "worker", "status": "failed", "error": "its runner exited with status 3"}
        assert ask(run_dir, "agent_status", {"run": sleeping}) == {
            "run": sleeping, "agent": "worker", "status": "cancelled", "error": STOPPED}
        listed = subprocess.run([HANDLER, "agent", "list", "--root", str(root)], capture_output=True, text=True,
                                env={**os.environ, "HANDLER_RUN_DIR": str(run_dir)}, timeout=60, check=False)
        assert listed.returncode == 0, listed.stderr
        assert all(run in listed.stdout for run in (done, crashing, sleeping)), listed.stdout
    journal = (root / ".handler/runs/journal.jsonl").read_text()
    assert "hello" not in journal  # no run's input, nor any result
    assert "sleep" not in journal
    assert oct((root / ".handler/runs/journal.jsonl").stat().st_mode & 0o777) == "0o600"


def test_a_run_its_router_was_killed_under_is_cut_short_and_its_held_call_withdrawn(tmp_path: Path,
                                                                                   run_dir: Path) -> None:
    """SIGKILL while a run waits on a held call: nothing of that router ran after; the next router ends the run as
    cut short, saying so, and rejects its pending hold, since a held call never runs after its run."""
    root = write_agents_tree(tmp_path / "t", timeout=60, worker_template="balanced")
    with router(root, run_dir, profile="boss") as first:
        run = ask(run_dir, "agent_run", {"agent": "worker", "input": "write"})["run"]
        marker = root / "work/worker/held"
        deadline = time.monotonic() + DEADLINE
        while not marker.exists():
            assert time.monotonic() < deadline, "the run's call was never held"
            time.sleep(0.1)
        request_id = marker.read_text()
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
    with router(root, run_dir, profile="boss"):
        assert ask(run_dir, "agent_status", {"run": run}) == {
            "run": run, "agent": "worker", "status": "cancelled", "error": LOST}
        with contextlib.closing(open_store(store_url(root, {}, state_dir=root / ".handler"))) as store:
            deadline = time.monotonic() + DEADLINE
            while (hold := get_hold(store, request_id)).state == "pending":
                assert time.monotonic() < deadline, "the hold of the run cut short was never withdrawn"
                time.sleep(0.1)
    assert hold.state == "rejected", hold
    assert f"its run ended: cancelled, {LOST}" in json.dumps(hold.decision_reason), hold


def test_a_journal_cut_short_by_a_crash_or_written_by_hand_loses_only_its_bad_lines(tmp_path: Path,
                                                                                   run_dir: Path) -> None:
    root = write_agents_tree(tmp_path / "t", timeout=60)
    journal = root / ".handler/runs/journal.jsonl"
    journal.parent.mkdir(parents=True, mode=0o700)
    good = {"run": "run-00000000000000aa", "agent": "worker", "status": "failed", "error": "its runner exited with "
            "status 3", "starter": "run:boss-1", "parent": "boss-1", "profileOfStarter": "boss", "started": 1.0,
            "ended": 2.0}
    odd = {**good, "run": "run-00000000000000bb", "started": "yesterday", "status": "timed_out", "error": None}
    outside = {**good, "run": "../../outside", "status": "running"}  # ended as cut short, its files removed: none
    (root / "outside.mcp.json").write_text("{}")
    journal.write_text("\n".join(["not json", json.dumps([1, 2]), json.dumps({"run": "run-c", "status": "exploded"}),
                                  json.dumps(good), json.dumps(odd), json.dumps(outside), '{"run": "run-0']))
    journal.chmod(0o600)
    with router(root, run_dir, profile="boss"):
        assert ask(run_dir, "agent_status", {"run": good["run"]}) == {
            "run": good["run"], "agent": "worker", "status": "failed", "error": "its runner exited with status 3"}
        assert ask(run_dir, "agent_status", {"run": odd["run"]}) == {
            "run": odd["run"], "agent": "worker", "status": "timed_out"}
    kept = [json.loads(entry)["run"] for entry in journal.read_text().splitlines()]
    assert sorted(kept) == sorted(["run-c", good["run"], odd["run"], outside["run"]])  # whole records only, each once
    assert (root / "outside.mcp.json").exists()  # a record's id is no path the router removes
