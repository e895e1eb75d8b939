"""Governance through the real router, the real bridge and the real `handler` command.

An agent (the official MCP SDK client, through `handler-service`) sees executed (with cost and
budget), blocked, and pending — then executed after a person approves with `handler approvals
approve`. `handler serve` killed with -9 while holds wait loses none of them, and an approval after
the restart runs the call once; two routers sharing a PostgreSQL store run it once between them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client

from reconciler.governance.governed import GovernedGate
from reconciler.router.server import Router
from tests.fixtures.echo_tree import TOKEN_ENV, governed_profile, write_echo_tree
from tests.fixtures.harness import DEADLINE, RawClient, body, bridge_params, load, run, sdk_body, short_dir

HANDLER = str(Path(sys.executable).parent / "handler")

GOVERNED = governed_profile(1.0)


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/profiles/tester.toml").write_text(GOVERNED)
        yield root, base / "run"


def cli(root: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HANDLER, *args, "--root", str(root)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})}, check=False)


def test_an_agent_sees_executed_blocked_and_pending_then_executed_after_approval(places: tuple[Path, Path]) -> None:
    root, run_dir = places

    async def scenario() -> None:
        governor = GovernedGate.from_env(root)
        router = Router(load(root), root=root, run_dir=run_dir, gate=governor)
        await router.start()
        await governor.start(router.execute_held)
        params = bridge_params(run_dir, "tester", "echo", HANDLER_INSTANCE="agent-1", **{TOKEN_ENV: "t"})
        try:
            async with Client(params, mode="legacy") as client:
                done = await client.call_tool("echo_say", {"text": "hi"})
                assert not done.is_error
                assert done.meta is not None
                assert done.meta["handler/status"] == "executed"
                assert done.meta["handler/cost"] == 0.001
                assert done.meta["handler/budget"] == 0.999

                refused = await client.call_tool("echo_token", {})
                assert refused.is_error
                assert refused.structured_content is None  # an error result every client accepts
                assert sdk_body(refused)["status"] == "blocked"
                assert "rule for action echo_token" in sdk_body(refused)["message"]

                held = await client.call_tool("echo_write", {"text": "dear ceo", "outputPath": "mail.txt"})
                assert held.is_error
                told = sdk_body(held)
                assert told["status"] == "pending"
                rid = told["request_id"]
                assert held.meta is not None
                assert held.meta["handler/requestId"] == rid
                assert not (root / "work/tester/mail.txt").exists()

                approved = await asyncio.to_thread(cli, root, "approvals", "approve", rid, "--as", "owner")
                assert approved.returncode == 0, approved.stderr

                outcome = await _poll_until_decided(client, rid)
                assert outcome["status"] == "executed", outcome
                assert outcome["result"]["bytes"] == len("dear ceo")
                assert outcome["charged"] == 0.0  # echo_write has no price
                assert (root / "work/tester/mail.txt").read_text() == "dear ceo"
        finally:
            await governor.aclose()
            await router.aclose()

    run(scenario(), timeout=90)
    trail = cli(root, "audit", "--format", "json", "--limit", "100")
    events = [(r["event"], r["actor"]) for r in json.loads(trail.stdout) if r["tool"] == "echo_write" or
              r["event"] in ("approved", "claimed", "executed")]
    assert ("approved", "owner") in events
    assert [e for e, _ in events].count("claimed") == 1
    assert [e for e, _ in events].count("executed") == 1


async def _poll_until_decided(client: Client, rid: str) -> dict[str, Any]:
    """What `handler_status` says of hold `rid` once it is no longer pending (within the deadline)."""
    deadline = time.monotonic() + DEADLINE
    while True:
        status = await client.call_tool("handler_status", {"request_id": rid})
        assert status.structured_content is not None
        if status.structured_content["status"] != "pending":
            return status.structured_content
        assert time.monotonic() < deadline, "the approved hold did not run"
        await asyncio.sleep(0.05)


def _start(root: Path, run_dir: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    proc = subprocess.Popen([HANDLER, "serve", str(root)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HANDLER_RUN_DIR": str(run_dir), **env})
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "tester on" in line, line + (proc.stderr.read() if proc.poll() is not None else "")
    return proc


def _stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        proc.wait(timeout=30)
    if proc.stderr is not None:
        proc.stderr.close()


async def _call(sock: Path, name: str, arguments: dict[str, Any], instance: str = "agent-1") -> dict[str, Any]:
    client = await RawClient.connect(sock)
    try:
        result = await client.call(name, arguments, _meta={"handler/instance": instance})
    finally:
        await client.close()
    return result


async def _wait_executed(sock: Path, rid: str) -> dict[str, Any]:
    deadline = time.monotonic() + DEADLINE
    while True:
        result = await _call(sock, "handler_status", {"request_id": rid})
        told: dict[str, Any] = body(result)
        if told["status"] not in ("pending", "unknown"):
            return told
        assert time.monotonic() < deadline, f"hold {rid} did not run: {told}"
        await asyncio.sleep(0.05)


def _store_env(backend: str, request: pytest.FixtureRequest) -> dict[str, str]:
    if backend == "sqlite":
        return {}
    url: str = request.getfixturevalue("pg_url")
    return {"HANDLER_STORE_URL": url}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_kill_9_with_holds_pending_loses_none_and_an_approval_runs_once(
        places: tuple[Path, Path], backend: str, request: pytest.FixtureRequest) -> None:
    root, run_dir = places
    env = _store_env(backend, request)
    sock = run_dir / "profiles/tester.sock"
    proc = _start(root, run_dir, env)
    try:
        rids = []
        for i in range(3):
            held = run(_call(sock, "echo_write", {"text": f"letter {i}", "outputPath": f"letter{i}.txt"}))
            assert body(held)["status"] == "pending", held
            rids.append(body(held)["request_id"])
    finally:
        _stop(proc, signal.SIGKILL)
    sock.unlink(missing_ok=True)

    listed = cli(root, "approvals", "list", "--format", "json", env=env)
    assert sorted(h["id"] for h in json.loads(listed.stdout)) == sorted(rids)
    approved = cli(root, "approvals", "approve", rids[1], "--as", "owner", env=env)  # while no router runs
    assert approved.returncode == 0, approved.stderr

    proc = _start(root, run_dir, env)
    try:
        outcome = run(_wait_executed(sock, rids[1]))
        assert outcome["status"] == "executed", outcome
        assert (root / "work/tester/letter1.txt").read_text() == "letter 1"
        for rid in (rids[0], rids[2]):
            still = run(_call(sock, "handler_status", {"request_id": rid}))
            assert body(still)["status"] == "pending"
    finally:
        _stop(proc)
    trail = json.loads(cli(root, "audit", "--request", rids[1], "--format", "json", env=env).stdout)
    assert [r["event"] for r in trail] == ["decided", "approved", "claimed", "settled", "executed"]


def test_two_routers_sharing_postgresql_run_an_approved_hold_once(places: tuple[Path, Path], pg_url: str) -> None:
    root, run_dir = places
    env = {"HANDLER_STORE_URL": pg_url}
    other_run = Path(str(run_dir) + "2")
    # Each router its own run and state folders (a state folder is one service's), one PostgreSQL store.
    first = _start(root, run_dir, env)
    second = _start(root, other_run, {**env, "HANDLER_STATE_DIR": str(other_run) + "-state"})
    try:
        rids = [body(run(_call(run_dir / "profiles/tester.sock", "echo_write",
                               {"text": f"note {i}", "outputPath": f"note{i}.txt"})))["request_id"]
                for i in range(5)]
        for rid in rids:
            assert cli(root, "approvals", "approve", rid, "--as", "owner", env=env).returncode == 0
        for i, rid in enumerate(rids):
            outcome = run(_wait_executed(other_run / "profiles/tester.sock", rid))
            assert outcome["status"] == "executed", outcome
            assert (root / f"work/tester/note{i}.txt").read_text() == f"note {i}"
    finally:
        _stop(first)
        _stop(second)
    for rid in rids:
        trail = json.loads(cli(root, "audit", "--request", rid, "--format", "json", env=env).stdout)
        assert [r["event"] for r in trail].count("claimed") == 1, trail


def test_the_call_log_and_status_carry_no_arguments(places: tuple[Path, Path]) -> None:
    """Holds keep the arguments for the approver in the store, never in the call log or the status."""
    root, run_dir = places
    sock = run_dir / "profiles/tester.sock"
    proc = _start(root, run_dir, {})
    try:
        held = run(_call(sock, "echo_write", {"text": "secret plan", "outputPath": "p"}))
        assert body(held)["status"] == "pending"
        rid = body(held)["request_id"]
        status = run(_call(sock, "handler_status", {"request_id": rid}))
        assert body(status)["status"] == "pending"
        assert "secret plan" not in json.dumps(status)
    finally:
        _stop(proc)
    log = root / ".handler/calls.jsonl"
    assert log.exists(), "handler serve kept no call log"
    text = log.read_bytes()
    assert b"secret plan" not in text
    lines = [orjson.loads(line) for line in text.splitlines()]
    (line,) = [entry for entry in lines if entry["tool"] == "echo_write"]
    assert (line["profile"], line["instance"], line["interface"], line["binding"]) == (
        "tester", "agent-1", "echo/v1", "echo-local")
    assert (line["outcome"], line["request_id"], line["error"]) == ("pending", rid, None)  # joins the store's hold
    assert [entry["outcome"] for entry in lines if entry["tool"] == "handler_status"] == ["executed"]
