"""`handler up` end to end: real git, the real router on real sockets, real connector processes.

A pushed commit (or a saved file) that swaps a binding reaches new sessions while open sessions
keep theirs; a broken revision changes nothing and shows in the status; a steady load of calls
across many reloads loses and fails none.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.echo_tree import TOKEN_ENV, add_other_binding, write_echo_tree
from fixtures.echo_tree import select_binding as _select
from fixtures.harness import RawClient, short_dir
from fixtures.service import DEADLINE, Service, running

from reconciler.app import UpOptions
from reconciler.gitops.webhook import sign_body

OTHER_ENV = "HANDLER_TEST_ECHO_TOKEN_B"
SECRET = b"push-secret"


@pytest.fixture(autouse=True)
def tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "token-A")
    monkeypatch.setenv(OTHER_ENV, "token-B")


@pytest.fixture
def short() -> Iterator[Path]:
    with short_dir() as path:
        yield path


def _echo_tree(root: Path) -> Path:
    return add_other_binding(write_echo_tree(root), OTHER_ENV)


async def _token(client: RawClient) -> str:
    result = await client.call("echo_token", {})
    assert not result.get("isError"), result
    token: str = result["structuredContent"]["token"]
    return token


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.org", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def _push(clone: Path, message: str) -> str:
    _git(clone, "commit", "-qam", message)
    _git(clone, "push", "-q", "origin", "HEAD:main")
    return _git(clone, "rev-parse", "HEAD")


def test_pushed_commits_reach_new_sessions_only(short: Path) -> None:
    bare, clone = short / "cfg.git", short / "clone"
    _git(short, "init", "-q", "--bare", "-b", "main", str(bare))
    _git(short, "clone", "-q", str(bare), str(clone))
    _echo_tree(clone)
    _git(clone, "add", "-A")
    _push(clone, "echo on binding A")
    options = UpOptions(
        root=str(bare),
        source="git",
        ref="main",
        interval=3600,
        run_dir=short / "run",
        state_dir=short / "state",
        http_port=0,
        webhook_secret=SECRET,
    )

    async def push_hook(service: Service, sha: str) -> None:
        assert service.listener is not None
        body = b'{"ref": "refs/heads/main"}'
        async with httpx.AsyncClient() as http:
            reply = await http.post(
                f"http://127.0.0.1:{service.listener.port}/hooks/git",
                content=body,
                headers={"X-Hub-Signature-256": sign_body(SECRET, body), "X-GitHub-Event": "push"},
            )
        assert reply.status_code == 202
        assert service.reconciler is not None
        await service.until(lambda: any(a.revision == sha for a in service.reconciler.status.history))  # type: ignore[union-attr]

    async def scenario() -> None:
        async with running(options) as service:
            old = await service.session()
            assert await _token(old) == "token-A"

            _select(clone, "echo-other")
            swap_sha = _push(clone, "echo on binding B")
            await push_hook(service, swap_sha)
            assert service.generation == 2
            assert await _token(old) == "token-A"  # the open session keeps its binding
            new = await service.session()
            assert await _token(new) == "token-B"

            _select(clone, "echo-missing")
            broken_sha = _push(clone, "a typo")
            await push_hook(service, broken_sha)
            assert service.reconciler is not None
            status = service.reconciler.status.to_dict()
            assert status["ready"] is False
            assert status["lastAttempt"]["result"] == "invalid"
            assert [f["code"] for f in status["lastAttempt"]["findings"]] == ["P001"]
            assert status["applied"]["revision"] == swap_sha
            third = await service.session()
            assert await _token(third) == "token-B"  # nothing changed

            _select(clone, "echo-local")
            fixed_sha = _push(clone, "fix the typo")
            await push_hook(service, fixed_sha)
            assert service.reconciler.status.to_dict()["ready"] is True
            fourth = await service.session()
            assert await _token(fourth) == "token-A"
            for client in (old, new, third, fourth):
                await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_saved_files_reach_new_sessions_and_bad_saves_change_nothing(short: Path) -> None:
    root = _echo_tree(short / "tree")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)

    async def scenario() -> None:
        async with running(options) as service:
            old = await service.session()
            assert await _token(old) == "token-A"
            assert service.reconciler is not None
            assert service.reconciler.status.to_dict()["connectors"]["echo-local"]["state"] == "running"
            _select(root, "echo-other")
            await service.until(lambda: service.generation == 2)
            assert await _token(old) == "token-A"
            new = await service.session()
            assert await _token(new) == "token-B"
            _select(root, "echo-missing")
            assert service.reconciler is not None
            await service.until(lambda: service.reconciler.status.last_attempt.result == "invalid")  # type: ignore[union-attr]
            assert service.generation == 2
            for client in (old, new):
                await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_steady_load_across_twenty_reloads_loses_no_call(short: Path) -> None:
    root = _echo_tree(short / "tree")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)
    counts = {"sent": 0, "ok": 0, "failed": 0}

    async def load(service: Service, stop: asyncio.Event) -> None:
        while not stop.is_set():
            client = await service.session()  # a new session every few calls: some start after each swap
            for _ in range(5):
                counts["sent"] += 1
                result = await client.call("echo_say", {"text": "steady"})
                ok = not result.get("isError") and result["structuredContent"] == {"text": "steady"}
                counts["ok" if ok else "failed"] += 1
            await client.close()

    async def scenario() -> None:
        async with running(options) as service:
            stop = asyncio.Event()
            workers = [asyncio.create_task(load(service, stop)) for _ in range(4)]
            for i in range(20):
                _select(root, "echo-other" if i % 2 == 0 else "echo-local")
                await service.until(lambda i=i: service.generation == i + 2)
            stop.set()
            await asyncio.gather(*workers)

    asyncio.run(asyncio.wait_for(scenario(), 180))
    assert counts["failed"] == 0
    assert counts["ok"] == counts["sent"] > 20


def _processes_under(folder: Path) -> list[int]:
    """Processes whose working folder is inside `folder` (connector processes run in theirs)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if str((entry / "cwd").readlink()).startswith(str(folder)):
                found.append(int(entry.name))
    return found


def test_ctrl_c_stops_everything(short: Path) -> None:
    root = _echo_tree(short / "tree")
    handler = str(Path(sys.executable).parent / "handler")
    env = {**os.environ, "HANDLER_RUN_DIR": str(short / "run")}
    proc = subprocess.Popen(
        [handler, "up", str(root), "--http", "127.0.0.1:0"], env=env, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if "Ctrl-C" in line:
            break
    assert any("profile tester:" in line for line in lines), lines

    async def call() -> Any:
        client = await RawClient.connect(short / "run/profiles/tester.sock")
        result = await client.call("echo_say", {"text": "hi"})
        await client.close()
        return result

    assert asyncio.run(call())["structuredContent"] == {"text": "hi"}
    assert _processes_under(root), "the connector process should be running"
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=DEADLINE) == 0
    proc.stderr.close()
    assert _processes_under(root) == []
    assert not (short / "run/profiles/tester.sock").exists()
