"""The pool's lifecycle through the real router: shared processes, idle stop, crash restart, drain, shutdown."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reconciler.config import FolderSource, Loader
from reconciler.connectors.cgroups import sweep_stale
from reconciler.connectors.pool import ConnectorPool, pool_key
from reconciler.router.server import Router
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, load, run, serving

DEADLINE = 15.0


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    """Wait for `predicate` under a deadline, checking as the loop turns (no fixed sleep)."""
    end = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def live_in_sessions(sids: set[int]) -> list[int]:
    """Every process (zombies aside) whose session is one of `sids`: what a connector left behind."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state != "Z" and os.getsid(int(entry.name)) in sids:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_one_process_per_binding_with_settings_and_secrets_in_its_env(echo_root: Path, echo_secret: str) -> None:
    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False)
        try:
            snapshot = load(echo_root)
            first = await pool.connector(snapshot, "echo-local")
            assert await pool.connector(snapshot, "echo-local") is first
            assert len(pool.processes()) == 1
            spec = pool.launch_spec("echo-local")
            assert spec is not None
            env = spec.env
            assert env["ECHO_TOKEN"] == echo_secret
            assert env["ECHO_GREETING"] == "hi"
            assert TOKEN_ENV not in env  # the router's own variables stay the router's
            # PYTHONPATH and HANDLER_INTERFACES: the connector kit, and the interfaces it reads
            assert set(env) <= {"ECHO_TOKEN", "ECHO_GREETING", "PATH", "LANG", "LC_ALL", "TZ", "HOME", "TMPDIR",
                                "PYTHONPYCACHEPREFIX", "PYTHONPATH", "HANDLER_INTERFACES"}
            assert env["PYTHONPYCACHEPREFIX"].startswith(env["TMPDIR"] + "/")  # its own: never its folder's __pycache__
            assert Path(env["HOME"]).parent == echo_root / ".handler/connectors"  # its private folder
            assert spec.cwd == env["HOME"]
            assert echo_secret not in repr(spec)
            assert spec.start_timeout == 20.0  # [run] startSeconds left out
        finally:
            await pool.close()
        assert not Path(env["HOME"]).exists()  # the private folder goes with the process

    run(scenario())


def test_a_connector_declares_how_long_its_start_may_take(echo_root: Path) -> None:
    manifest = echo_root / "catalog/connectors/echo/connector.toml"
    declared = manifest.read_text().replace('transport = "stdio"\n', 'transport = "stdio"\nstartSeconds = 90\n')
    manifest.write_text(declared)

    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False)
        try:
            await pool.connector(load(echo_root), "echo-local")
            spec = pool.launch_spec("echo-local")
            assert spec is not None
            assert spec.start_timeout == 90.0
        finally:
            await pool.close()

    run(scenario())
    manifest.write_text(manifest.read_text().replace("startSeconds = 90", "startSeconds = 0"))
    found = [f.render_text() for f in Loader().load(FolderSource(echo_root)).findings]
    assert any("'run.startSeconds' is invalid: Input should be greater than 0" in text for text in found), found


def test_sessions_share_one_process_and_shutdown_leaves_none(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            clients = [await RawClient.connect(router.socket_path("tester")) for _ in range(4)]
            for i, c in enumerate(clients):
                assert (await c.call("echo_say", {"text": str(i)}))["structuredContent"] == {"text": str(i)}
            pids = router.services.pool.processes()
            assert len(pids) == 1
            assert live_in_sessions(set(pids))  # the connector (and its sandbox helpers) run now
            for c in clients:
                await c.close()
        # Killed at shutdown, the last ones may take a moment to die; none may be left running.
        await wait_until(lambda: not live_in_sessions(set(pids)), "every connector process to end")

    run(scenario())


def test_an_idle_process_stops_and_the_next_call_starts_another(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir, idle_seconds=0.2) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.call("echo_say", {"text": "a"})
            first = router.services.pool.processes()
            assert len(first) == 1
            await wait_until(lambda: not router.services.pool.processes(), "the idle stop")
            await wait_until(lambda: not live_in_sessions(set(first)), "every process of the stopped connector to end")
            assert router.services.pool.statuses["echo-local"].state == "stopped"
            assert (await c.call("echo_say", {"text": "b"}))["structuredContent"] == {"text": "b"}
            assert router.services.pool.processes() != first
            await c.close()

    run(scenario())


def test_a_crash_fails_the_calls_that_hit_it_and_later_calls_get_a_new_process(echo_root: Path,
                                                                               run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.call("echo_say", {"text": "a"})
            before = router.services.pool.processes()
            crashed = await c.call("echo_misbehave", {"mode": "die"})
            assert body(crashed)["error"] == "unavailable"
            assert crashed["_meta"]["handler/cause"] == "crashed"
            assert (await c.call("echo_say", {"text": "b"}))["structuredContent"] == {"text": "b"}
            after = router.services.pool.processes()
            assert len(after) == 1
            assert after != before
            await c.close()

    run(scenario())


def test_a_changed_binding_drains_when_its_last_session_ends(echo_root: Path, run_dir: Path, tmp_path: Path) -> None:
    changed = tmp_path / "t2"
    shutil.copytree(echo_root, changed)
    binding = changed / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace('greeting = "hi"', 'greeting = "bonjour"'))

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            pool = router.services.pool
            old = await RawClient.connect(router.socket_path("tester"))
            await old.call("echo_say", {"text": "a"})
            (old_pid,) = pool.processes()
            await router.swap(load(changed))
            new = await RawClient.connect(router.socket_path("tester"))
            await new.call("echo_say", {"text": "b"})
            assert len(pool.processes()) == 2  # the old session keeps its process
            await old.call("echo_say", {"text": "c"})
            assert old_pid in pool.processes()
            await old.close()
            await wait_until(lambda: old_pid not in pool.processes(), "the drain of the old process")
            assert len(pool.processes()) == 1
            assert (await new.call("echo_say", {"text": "d"}))["structuredContent"] == {"text": "d"}
            await new.close()

    run(scenario())


def test_a_failing_secret_command_is_unavailable_with_a_status_naming_binding_and_slot(
        echo_root: Path, run_dir: Path) -> None:
    binding = echo_root / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace(f'{{ env = "{TOKEN_ENV}" }}',
                                                   '{ command = ["sh", "-c", "echo s3cr3t-out; exit 3"] }'))

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            result = await c.call("echo_say", {"text": "a"})
            assert body(result)["error"] == "unavailable"
            assert result["_meta"]["handler/cause"] == "start_failed"
            status = router.services.pool.statuses["echo-local"]
            assert status.state == "failed"
            assert "binding 'echo-local'" in status.message
            assert "secret slot 'token'" in status.message
            assert "s3cr3t-out" not in status.message
            assert not router.services.pool.processes()
            await c.close()

    run(scenario())


def test_a_restart_after_a_crash_resolves_the_secrets_again(echo_root: Path, run_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "token-before")

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            assert (await c.call("echo_token", {}))["structuredContent"] == {"token": "token-before"}
            monkeypatch.setenv(TOKEN_ENV, "token-rotated")  # the secret's source changed while it ran
            await c.call("echo_misbehave", {"mode": "die"})
            assert (await c.call("echo_token", {}))["structuredContent"] == {"token": "token-rotated"}
            await c.call("echo_misbehave", {"mode": "stderr"})  # it prints its token: the new one is masked too
            log = router.state_dir / "connectors/echo-local.stderr.log"
            await wait_until(lambda: log.exists() and "***" in log.read_text(), "the masked stderr line")
            assert "token-rotated" not in log.read_text()
            await c.close()

    run(scenario())


def never_lists_its_tools(root: Path, start_seconds: float) -> None:
    """The echo connector of `root` made one that answers `initialize` and then never `tools/list`."""
    main = root / "catalog/connectors/echo/main.py"
    listing = 'send({"jsonrpc": "2.0", "id": msg_id, "result": {"tools": tools}})'
    assert listing in main.read_text()
    main.write_text(main.read_text().replace(listing, "pass"))
    manifest = root / "catalog/connectors/echo/connector.toml"
    manifest.write_text(manifest.read_text().replace('transport = "stdio"\n',
                                                     f'transport = "stdio"\nstartSeconds = {start_seconds}\n'))


def test_a_connector_that_never_answers_tools_list_fails_its_start_and_is_tried_again(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    never_lists_its_tools(echo_root, 0.5)

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            for _ in range(2):  # the second call, after the backoff, starts it again
                result = await c.call("echo_say", {"text": "a"})
                assert body(result)["error"] == "unavailable"
                assert result["_meta"]["handler/cause"] == "start_failed"
                status = router.services.pool.statuses["echo-local"]
                assert status.state == "failed"
                assert status.message == "connector of binding 'echo-local' did not answer tools/list within 0.5 s"
                assert not router.services.pool.processes()
                await asyncio.sleep(0.2)  # the first start failure's backoff: 0.1 s
            await c.close()

    run(scenario())


def test_shutdown_gives_up_a_start_under_way(echo_root: Path, run_dir: Path) -> None:
    never_lists_its_tools(echo_root, 600)

    async def scenario() -> None:
        router = Router(load(echo_root), root=echo_root, run_dir=run_dir)
        await router.start()
        c = await RawClient.connect(router.socket_path("tester"))
        calling = asyncio.create_task(c.call("echo_say", {"text": "a"}))
        pool = router.services.pool
        await wait_until(lambda: pool.launch_spec("echo-local") is not None, "the start to spawn the process")
        await asyncio.wait_for(router.aclose(), DEADLINE)  # not the 600 s its start may take
        calling.cancel()
        await c.close()

    run(scenario())


def test_a_start_longer_than_the_calls_time_limit_is_waited_for_as_a_start(tmp_path: Path, run_dir: Path) -> None:
    root = write_echo_tree(tmp_path / "t", limits={"timeoutSeconds": 1})
    main = root / "catalog/connectors/echo/main.py"
    main.write_text(main.read_text().replace("def main() -> None:\n", "def main() -> None:\n    time.sleep(2)\n"))
    manifest = root / "catalog/connectors/echo/connector.toml"
    manifest.write_text(manifest.read_text().replace('transport = "stdio"\n',
                                                     'transport = "stdio"\nstartSeconds = 10\n'))

    async def scenario() -> None:
        async with serving(root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            first = await c.call("echo_say", {"text": "a"})  # 2 s of start, then its 1 s to answer
            assert first.get("structuredContent") == {"text": "a"}, first
            (pid,) = router.services.pool.processes()
            assert (await c.call("echo_say", {"text": "b"}))["structuredContent"] == {"text": "b"}
            assert router.services.pool.processes() == [pid]  # never killed as a connector that hangs
            await c.close()

    run(scenario())


def test_a_process_still_starting_is_never_killed_as_one_that_hangs(echo_root: Path) -> None:
    main = echo_root / "catalog/connectors/echo/main.py"
    main.write_text(main.read_text().replace("def main() -> None:\n", "def main() -> None:\n    time.sleep(1)\n"))

    async def scenario() -> None:
        pool = ConnectorPool(echo_root, echo_root / ".handler", sandbox=False)
        try:
            snapshot = load(echo_root)
            starting = asyncio.create_task(pool.connector(snapshot, "echo-local"))
            await wait_until(lambda: pool.launch_spec("echo-local") is not None, "the start to spawn the process")
            pool.suspect(pool_key(snapshot, "echo-local"))  # a call timed out meanwhile
            connector = await starting
            assert (await connector.call_tool("echo_say", {"text": "a"}))["structuredContent"] == {"text": "a"}
        finally:
            await pool.close()

    run(scenario())


def test_a_restart_after_a_crash_checks_the_tools_again(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            assert (await c.call("echo_say", {"text": "a"}))["structuredContent"] == {"text": "a"}
            main = echo_root / "catalog/connectors/echo/main.py"  # its code changed in place while it ran
            listing = '"result": {"tools": tools}'
            main.write_text(main.read_text().replace(
                listing, '"result": {"tools": [t for t in tools if t["name"] != "echo_token"]}'))
            await c.call("echo_misbehave", {"mode": "die"})
            result = await c.call("echo_say", {"text": "b"})
            assert result["_meta"]["handler/cause"] == "start_failed", result
            status = router.services.pool.statuses["echo-local"]
            assert status.state == "failed"
            assert "does not offer echo/v1 echo_token" in status.message
            await c.close()

    run(scenario())


def own_leaves(pid: int) -> list[Path]:
    """The `pids` and `memory` cgroups (v1) or the one cgroup (v2) `pid` is in, where the router made them."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in ("pids", "memory") if controllers else ("",):
            if controller in controllers.split(",") and "/handler/" in path:
                found.append(Path("/sys/fs/cgroup", controller, path.lstrip("/")))
    return found


def test_a_restart_after_a_crash_makes_again_the_cgroups_a_sweep_took(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.call("echo_say", {"text": "a"})
            (pid,) = router.services.pool.processes()
            leaves = own_leaves(pid)
            if not leaves:
                pytest.skip("connectors get no cgroups here (the router is not root, or /sys/fs/cgroup is read-only)")
            await c.call("echo_misbehave", {"mode": "die"})
            await wait_until(lambda: not any((leaf / "cgroup.procs").read_text().strip() for leaf in leaves),
                             "the crashed connector's cgroups to empty")
            sweep_stale(min_age=0)  # another router starting while this one waits to restart its connector
            assert not any(leaf.exists() for leaf in leaves)
            assert (await c.call("echo_say", {"text": "b"})).get("structuredContent") == {"text": "b"}
            await c.close()

    run(scenario())


def test_a_call_during_a_crash_loops_backoff_is_told_the_connector_waits_to_restart(
        tmp_path: Path, run_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_echo_tree(tmp_path / "t", limits={"timeoutSeconds": 1})

    async def scenario() -> None:
        async with serving(root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            for _ in range(5):  # each crash in a row doubles the backoff: 0.1 s before the 2nd, 0.8 s before the 5th
                crashed = await c.call("echo_misbehave", {"mode": "die"})
                assert crashed["_meta"]["handler/cause"] == "crashed", crashed
            started = time.monotonic()
            waiting = await c.call("echo_say", {"text": "a"})  # 1.6 s of backoff: more than its 1 s
            assert time.monotonic() - started < 1, "told at once, not after its time limit"
            assert waiting["_meta"]["handler/cause"] == "crashed", waiting
            assert body(waiting)["message"] == ("the service crashed and waits 1.6 s before it starts again; "
                                                "retrying then may work")
            assert "binding 'echo-local' crashed (5 in a row) and waits 1.6 s before it starts again" in caplog.text
            assert "did not answer a ping" not in caplog.text
            await c.close()

    run(scenario())
