"""The service's default places and the event loop it runs on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import uvloop

from reconciler.config.eventloop import new_event_loop, run_on_uvloop
from reconciler.places import MAX_SOCKET_PATH, default_state_dir, socket_path


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
