"""The service's default places and the event loop it runs on."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from reconciler.config.eventloop import new_event_loop, run_on_uvloop
from reconciler.places import (
    MAX_SOCKET_PATH,
    PrivatePlaceError,
    default_state_dir,
    ensure_private_dir,
    open_private_file,
    socket_path,
)

NOBODY = 65534


@pytest.fixture(params=[0o022, 0o277], ids=["umask-022", "umask-277"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The usual umask, and one that would take the owner's own bits: the modes come out the same."""
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_state_folder_follows_the_environment_it_is_given(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    monkeypatch.setenv("HANDLER_STATE_DIR", "/from/the/process")
    assert default_state_dir(tmp_path) == Path("/from/the/process")
    assert default_state_dir(tmp_path, {"HANDLER_STATE_DIR": "/given"}) == Path("/given")
    assert default_state_dir(tmp_path, {}) == tmp_path / ".handler"


def test_a_profile_socket_lives_under_the_run_folder() -> None:
    path = socket_path(Path("/run/h"), "tester")
    assert path == Path("/run/h/profiles/tester.sock")
    assert len(bytes(path)) < MAX_SOCKET_PATH


def test_the_service_runs_on_uvloop() -> None:
    async def which_loop() -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    assert isinstance(run_on_uvloop(which_loop()), uvloop.Loop)
    loop = new_event_loop()
    try:
        assert isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


@pytest.mark.usefixtures("umask")
def test_a_private_folder_and_the_parents_it_needs_are_made_0700(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b" / "state"
    assert ensure_private_dir(folder) == folder
    assert [_mode(p) for p in (tmp_path / "a", tmp_path / "a" / "b", folder)] == [0o700] * 3


def test_a_folder_of_ours_open_to_others_is_closed(tmp_path: Path) -> None:
    folder = tmp_path / "state"
    folder.mkdir()
    folder.chmod(0o755)
    ensure_private_dir(folder)
    assert _mode(folder) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a folder another user owns")
def test_a_folder_another_user_owns_is_refused_and_left_alone(tmp_path: Path) -> None:
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(PrivatePlaceError) as refused:
        ensure_private_dir(folder, "HANDLER_STATE_DIR")
    message = str(refused.value)
    assert f"{folder} is owned by nobody (uid {NOBODY}, mode 755)" in message
    for words in ("chown", "chmod 700", "HANDLER_STATE_DIR"):
        assert words in message
    assert _mode(folder) == 0o755


@pytest.mark.usefixtures("umask")
def test_a_private_file_is_0600_new_or_found_wider(tmp_path: Path) -> None:
    new, old = tmp_path / "new.log", tmp_path / "old.log"
    old.touch()
    old.chmod(0o644)
    for path in (new, old):
        os.close(open_private_file(path))
        assert _mode(path) == 0o600
