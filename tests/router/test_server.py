"""The router's sockets: one per profile, mode 0600, never two routers on a profile, short paths only."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.places import default_run_dir, default_state_dir
from reconciler.router.server import Router, RouterError
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.harness import RawClient, load, log_lines, run, serving, short_dir


@pytest.fixture
def two_profiles() -> Iterator[Path]:
    with short_dir() as root:
        yield write_echo_tree(root / "t", profiles=("alpha", "beta"))


def test_each_profile_has_its_own_private_socket(two_profiles: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(two_profiles, run_dir) as router:
            for profile in ("alpha", "beta"):
                path = run_dir / "profiles" / f"{profile}.sock"
                assert router.socket_path(profile) == path
                mode = path.stat().st_mode
                assert stat.S_ISSOCK(mode)
                assert mode & 0o777 == 0o600
            assert (run_dir / "profiles").stat().st_mode & 0o777 == 0o700
            # Which socket a caller reached is who it is: the log says so.
            for profile in ("alpha", "beta"):
                client = await RawClient.connect(router.socket_path(profile))
                await client.call("echo_say", {"text": profile})
                await client.close()
            assert [line["profile"] for line in log_lines(router)] == ["alpha", "beta"]
        assert not (run_dir / "profiles" / "alpha.sock").exists()

    run(scenario())


def test_a_second_router_on_the_same_run_folder_is_refused(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir):
            second = Router(load(echo_root), root=echo_root, run_dir=run_dir)
            with pytest.raises(RouterError, match="already serves profile 'tester'"):
                await second.start()
            await second.aclose()

    run(scenario())


def test_a_stale_socket_file_is_replaced(echo_root: Path, run_dir: Path) -> None:
    (run_dir / "profiles").mkdir(parents=True)
    (run_dir / "profiles/tester.sock").write_text("left over")

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            assert (await client.request("ping"))["result"] == {}
            await client.close()

    run(scenario())


def test_a_socket_path_over_the_limit_is_refused_with_advice(echo_root: Path, run_dir: Path) -> None:
    deep = run_dir / ("d" * 120)

    async def scenario() -> None:
        router = Router(load(echo_root), root=echo_root, run_dir=deep)
        with pytest.raises(RouterError, match="HANDLER_RUN_DIR"):
            await router.start()
        await router.aclose()

    run(scenario())


def test_a_run_folder_of_ours_others_may_write_to_is_made_private(echo_root: Path, run_dir: Path) -> None:
    shared = run_dir / "shared"
    shared.mkdir()
    shared.chmod(0o777)

    async def scenario() -> None:
        router = Router(load(echo_root), root=echo_root, run_dir=shared)
        await router.start()
        await router.aclose()

    run(scenario())
    assert shared.stat().st_mode & 0o777 == 0o700


def test_default_places(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("HANDLER_RUN_DIR", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    assert default_run_dir() == Path("/run/user/1000/handler")
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert str(default_run_dir()).startswith("/tmp/handler-")
    monkeypatch.setenv("HANDLER_RUN_DIR", "/x")
    assert default_run_dir() == Path("/x")
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    assert default_state_dir(tmp_path) == tmp_path / ".handler"
