"""The state and run folders are private whatever the umask (docs/architecture.md §6 and §7).

The store holds held calls' arguments, the call log and connectors' stderr say who called what, the
link key signs decisions: after a real service starts with umask 022, every file under the state
folder is 0600 and every folder 0700. A folder of ours left open to others is closed; one another
user owns is refused, never used.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.app import Service, ServiceOptions
from reconciler.governance.store.engine import open_store, store_url
from reconciler.router.server import Router, RouterError
from reconciler.web.links import load_link_secret
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, load, run, short_dir

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a folder another user owns")


@pytest.fixture
def short() -> Iterator[Path]:
    with short_dir() as path:
        yield path


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The usual umask, 022: files 0644 and folders 0755 unless the service asks for less."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


@pytest.fixture(autouse=True)
def local_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)  # the SQLite store in the state folder
    monkeypatch.delenv("HANDLER_LINK_SECRET", raising=False)  # the key file in the state folder
    monkeypatch.setenv(TOKEN_ENV, "token-A")


def _modes(folder: Path) -> dict[str, str]:
    """Every entry under `folder` (itself included) whose mode is not the private one, with its mode."""
    wrong = {}
    for path in [folder, *folder.rglob("*")]:
        info = path.lstat()
        mode = stat.S_IMODE(info.st_mode)
        private = 0o700 if stat.S_ISDIR(info.st_mode) else 0o600
        if (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)) and mode != private:
            wrong[str(path.relative_to(folder.parent))] = f"{mode:o}"
    return wrong


def _owned_by_nobody(folder: Path, mode: int = 0o755) -> Path:
    folder.mkdir(parents=True)
    os.chown(folder, NOBODY, NOBODY)
    folder.chmod(mode)
    return folder


@pytest.mark.usefixtures("open_umask")
def test_a_served_service_keeps_every_state_file_0600_and_folder_0700(short: Path) -> None:
    root = write_echo_tree(short / "tree")
    state, run_dir = short / "state", short / "run"
    options = ServiceOptions(str(root), run_dir=run_dir, state_dir=state, listen=False, follow=False)

    async def scenario() -> dict[str, str]:
        async with Service(options, first=load(root)) as service:
            client = await RawClient.connect(service.router.socket_path("tester"))
            result = await client.call("echo_say", {"text": "hello"})
            assert not result.get("isError"), result
            await client.close()
            await service.reload()  # an attempt: writes status.json
            load_link_secret(state)
            service.router.services.log.flush()
            names = {p.name for p in state.rglob("*")}
            assert {"handler.db", "handler.db-wal", "handler.db-shm", "calls.jsonl", "status.json", "link.key",
                    "connectors"} <= names
            return _modes(state) | _modes(run_dir)

    wrong = asyncio.run(asyncio.wait_for(scenario(), 120))
    # What a connector running as its own uid must read (the router is root): its sandbox's /etc files, the parent
    # of its call folders and its inbox, each inside a 0700 folder of ours, so no other user reaches them.
    shared = {k: v for k, v in wrong.items() if re.fullmatch(r"state/connectors/echo-local\.[^/]+/etc(/\w+)?", k)
              or k in ("run/calls/echo-local", "run/inbox/echo-local")}
    assert wrong == shared
    assert set(shared.values()) <= ({"755", "644", "711"} if os.geteuid() == 0 else {"755", "644"})
    assert _modes(state) == {}  # the connector's folder goes with its process


@pytest.mark.usefixtures("open_umask")
def test_state_files_an_older_release_left_readable_are_made_private(short: Path) -> None:
    state = short / "state"
    state.mkdir(mode=0o755)
    for name in ("handler.db", "calls.jsonl", "status.json", "link.key"):
        (state / name).touch(mode=0o644)
    (state / "link.key").write_bytes(b"k" * 64)
    open_store(store_url(short, {}, state_dir=state)).close()
    load_link_secret(state)
    router = Router(load(write_echo_tree(short / "tree")), root=short / "tree", run_dir=short / "run", state_dir=state)
    run(router.aclose())
    assert _modes(state) == {"state/status.json": "644"}  # the reconciler rewrites it 0600 on its next attempt


@pytest.mark.usefixtures("open_umask")
def test_an_existing_run_folder_open_to_others_becomes_0700(short: Path) -> None:
    run_dir = short / "run"
    run_dir.mkdir(mode=0o755)
    root = write_echo_tree(short / "tree")

    async def scenario() -> None:
        router = Router(load(root), root=root, run_dir=run_dir, state_dir=short / "state")
        await router.start()
        await router.aclose()

    run(scenario())
    assert _modes(run_dir) == {}


@needs_root
def test_a_run_folder_another_user_owns_is_refused_with_what_to_do(short: Path) -> None:
    run_dir = _owned_by_nobody(short / "run")
    root = write_echo_tree(short / "tree")

    async def scenario() -> None:
        router = Router(load(root), root=root, run_dir=run_dir, state_dir=short / "state")
        with pytest.raises(RouterError) as refused:
            await router.start()
        await router.aclose()
        message = str(refused.value)
        for words in (str(run_dir), "nobody", "mode 755", "chown", "HANDLER_RUN_DIR"):
            assert words in message

    run(scenario())
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o755  # refused, never changed


@needs_root
def test_a_state_folder_another_user_owns_is_refused(short: Path) -> None:
    state = _owned_by_nobody(short / "state")
    root = write_echo_tree(short / "tree")
    with pytest.raises(RouterError, match="HANDLER_STATE_DIR"):
        Router(load(root), root=root, run_dir=short / "run", state_dir=state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o755


@needs_root
def test_a_link_another_user_made_in_place_of_the_run_folder_is_never_followed(short: Path) -> None:
    target = short / "mine"
    target.mkdir(mode=0o755)
    link = short / "run"
    link.symlink_to(target)
    os.lchown(link, NOBODY, NOBODY)
    root = write_echo_tree(short / "tree")

    async def scenario() -> None:
        router = Router(load(root), root=root, run_dir=link, state_dir=short / "state")
        with pytest.raises(RouterError, match="a link made by"):
            await router.start()
        await router.aclose()

    run(scenario())
    assert stat.S_IMODE(target.stat().st_mode) == 0o755


@pytest.mark.usefixtures("open_umask")
def test_the_store_creates_its_folder_private(short: Path) -> None:
    state = short / "new" / "state"
    open_store(store_url(short, {}, state_dir=state)).close()
    assert _modes(short / "new") == {}

