"""The service (`reconciler.app`) end to end: real git, the real router on real sockets, real connector processes.

With `handler up`'s settings, a pushed commit (or a saved file) that swaps a binding reaches new
sessions while open sessions keep theirs; a broken revision changes nothing and shows in the
status; a steady load of calls across many reloads loses and fails none; a tree with nothing good
to serve does not start. With `handler serve`'s, the service starts on the snapshot it is given,
listens on no port, and reloads only when asked.
"""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.app import Reports, Service, ServiceError, ServiceOptions, UpOptions, run_service
from reconciler.gitops.status import Attempt, read_status
from reconciler.gitops.webhook import sign_body
from reconciler.governance.gate import OpenGate
from tests.fixtures.echo_tree import TOKEN_ENV, add_other_binding, write_echo_tree
from tests.fixtures.echo_tree import select_binding as _select
from tests.fixtures.harness import RawClient, load, short_dir
from tests.fixtures.service import Service as Running
from tests.fixtures.service import running

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


def _git_up_options(short: Path) -> tuple[Path, UpOptions]:
    """A bare repository holding the echo tree on binding A, the clone that pushes to it, and options to serve it."""
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
    return clone, options


async def _push_hook(service: Running, sha: str) -> None:
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


async def _push_broken_revision(service: Running, clone: Path, swap_sha: str) -> RawClient:
    _select(clone, "echo-missing")
    broken_sha = _push(clone, "a typo")
    await _push_hook(service, broken_sha)
    assert service.reconciler is not None
    status = service.reconciler.status.to_dict()
    assert status["ready"] is False
    assert status["lastAttempt"]["result"] == "invalid"
    assert [f["code"] for f in status["lastAttempt"]["findings"]] == ["P001"]
    assert status["applied"]["revision"] == swap_sha
    third = await service.session()
    assert await _token(third) == "token-B"  # nothing changed
    return third


async def _push_fixed_revision(service: Running, clone: Path) -> RawClient:
    _select(clone, "echo-local")
    fixed_sha = _push(clone, "fix the typo")
    await _push_hook(service, fixed_sha)
    assert service.reconciler is not None
    assert service.reconciler.status.to_dict()["ready"] is True
    fourth = await service.session()
    assert await _token(fourth) == "token-A"
    return fourth


def test_pushed_commits_reach_new_sessions_only(short: Path) -> None:
    clone, options = _git_up_options(short)

    async def scenario() -> None:
        async with running(options) as service:
            old = await service.session()
            assert await _token(old) == "token-A"

            _select(clone, "echo-other")
            swap_sha = _push(clone, "echo on binding B")
            await _push_hook(service, swap_sha)
            assert service.generation == 2
            assert await _token(old) == "token-A"  # the open session keeps its binding
            new = await service.session()
            assert await _token(new) == "token-B"

            third = await _push_broken_revision(service, clone, swap_sha)
            fourth = await _push_fixed_revision(service, clone)
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


def test_a_profile_whose_socket_cannot_be_opened_changes_nothing_and_the_next_save_applies(short: Path) -> None:
    """A valid revision the router cannot serve (a profile name too long for a socket under this run folder): the
    attempt is an error saying why and how to fix it, every session and socket stays as it was, and the watcher
    goes on: it had died with the error, and no later save was ever applied."""
    root = _echo_tree(short / "tree")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)
    long_name = "p" * 95
    tester = (root / "config/profiles/tester.toml").read_text()

    async def scenario() -> None:
        async with running(options) as service:
            assert service.router is not None
            assert service.reconciler is not None
            reconciler = service.reconciler
            (root / f"config/profiles/{long_name}.toml").write_text(tester.replace('"tester"', f'"{long_name}"'))
            await service.until(lambda: reconciler.status.last_attempt is not None
                                and reconciler.status.last_attempt.result == "error")
            said = reconciler.status.last_attempt.message  # type: ignore[union-attr]
            assert f"profile '{long_name}' cannot be served" in said
            assert "give the profile a shorter name, or set HANDLER_RUN_DIR to a shorter folder" in said
            assert service.generation == 1
            assert service.router.live.number == 1  # the router swapped nothing
            client = await service.session()  # the old profile's socket serves on
            assert await _token(client) == "token-A"
            (root / f"config/profiles/{long_name}.toml").unlink()
            (root / "config/profiles/second.toml").write_text(tester.replace('"tester"', '"second"'))
            await service.until(lambda: service.generation == 2)
            assert service.router.socket_path("second").exists()
            await client.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))


def test_a_steady_load_across_twenty_reloads_loses_no_call(short: Path) -> None:
    root = _echo_tree(short / "tree")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)
    counts = {"sent": 0, "ok": 0, "failed": 0}

    async def load_calls(service: Running, stop: asyncio.Event) -> None:
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
            workers = [asyncio.create_task(load_calls(service, stop)) for _ in range(4)]
            for i in range(20):
                _select(root, "echo-other" if i % 2 == 0 else "echo-local")
                await service.until(lambda i=i: service.generation == i + 2)
            stop.set()
            await asyncio.gather(*workers)

    asyncio.run(asyncio.wait_for(scenario(), 180))
    assert counts["failed"] == 0
    assert counts["ok"] == counts["sent"] > 20


def test_a_tree_with_nothing_good_to_serve_does_not_start(short: Path) -> None:
    root = _echo_tree(short / "tree")
    _select(root, "echo-missing")
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0)
    heard: list[Attempt] = []

    code = asyncio.run(run_service(options, reports=Reports(not_started=heard.append)))
    assert code == 1
    (attempt,) = heard
    assert attempt.result == "invalid"
    assert [f["code"] for f in attempt.findings] == ["P001"]
    assert not (short / "run/profiles").exists()


def test_a_service_asked_for_its_router_before_it_serves_says_so(short: Path) -> None:
    root = _echo_tree(short / "tree")
    service = Service(UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state"), gate=OpenGate())
    with pytest.raises(ServiceError, match="has not started"):
        _ = service.router


def test_serve_settings_start_on_the_given_snapshot_and_reload_when_asked(short: Path) -> None:
    root = _echo_tree(short / "tree")
    options = ServiceOptions(str(root), run_dir=short / "run", state_dir=short / "state", listen=False,
                             follow=False)
    reloads: list[Attempt] = []

    async def scenario() -> None:
        async with Service(options, first=load(root), reports=Reports(reloaded=reloads.append)) as service:
            assert service.listener is None
            assert service.reconciler.status.applied is not None
            assert service.reconciler.status.applied.generation == 1
            client = await RawClient.connect(service.router.socket_path("tester"))
            assert await _token(client) == "token-A"
            _select(root, "echo-other")  # no watcher: nothing changes until a reload
            assert (await service.reload()).result == "applied"
            assert await _token(client) == "token-A"  # the open session keeps its binding
            await client.close()
            new = await RawClient.connect(service.router.socket_path("tester"))
            assert await _token(new) == "token-B"
            await new.close()
        assert [a.message for a in reloads] == ["generation 2"]
        status = read_status(short / "state/status.json")
        assert status is not None
        assert status["lastAttempt"]["reason"] == "signal"

    asyncio.run(asyncio.wait_for(scenario(), 120))
    assert not (short / "run/profiles/tester.sock").exists()
