"""The service's default places and the event loop it runs on."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
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
    not_a_folder,
    open_private_file,
    remove_tree,
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


def test_a_file_where_a_private_folder_goes_is_refused_and_left_alone(tmp_path: Path) -> None:
    file = tmp_path / "notes.txt"
    file.write_text("kept\n")
    assert not_a_folder(file) == f"{file} is not a folder"
    assert not_a_folder(file / "a" / "b") == f"{file / 'a' / 'b'} cannot be a folder: {file} is not one"
    assert not_a_folder(tmp_path / "new" / "a") is None
    assert not_a_folder(tmp_path) is None
    for path in (file, file / "state"):
        with pytest.raises(PrivatePlaceError, match=f"^{path} .*: choose a folder with HANDLER_STATE_DIR, or move what "
                           "is there away$"):
            ensure_private_dir(path, "HANDLER_STATE_DIR")
    assert file.read_text() == "kept\n"


@pytest.mark.usefixtures("umask")
def test_a_private_file_is_0600_new_or_found_wider(tmp_path: Path) -> None:
    new, old = tmp_path / "new.log", tmp_path / "old.log"
    old.touch()
    old.chmod(0o644)
    for path in (new, old):
        os.close(open_private_file(path))
        assert _mode(path) == 0o600


def deep_tree(top: Path, depth: int) -> None:
    """`top` holding folders nested `depth` deep, a file at every hundredth level (made through descriptors: its
    paths are longer than a path may be)."""
    top.mkdir()
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for level in range(depth):
            if level % 100 == 0:
                os.close(os.open(f"f{level}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
            os.mkdir("d", dir_fd=fd)
            fd, parent = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
    finally:
        os.close(fd)


def test_a_tree_nested_deeper_than_the_interpreter_recurses_is_removed(tmp_path: Path) -> None:
    deep_tree(tmp_path / "out", 3000)
    with pytest.raises(RecursionError):  # what a connector's tree like this did to `shutil.rmtree`
        shutil.rmtree(tmp_path / "out")
    assert (tmp_path / "out").is_dir()
    remove_tree(tmp_path / "out")
    assert list(tmp_path.iterdir()) == []
    remove_tree(tmp_path / "out")  # nothing there: not an error


def test_removing_a_tree_follows_no_link_in_it_nor_at_its_top(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "keep.txt").write_text("not the connector's")
    tree = tmp_path / "out"
    (tree / "a/b").mkdir(parents=True)
    (tree / "a/b/to-folder").symlink_to(outside, target_is_directory=True)
    (tree / "a/to-file").symlink_to(outside / "keep.txt")
    (tree / "a/b/file.txt").write_text("written by a call")
    os.link(outside / "keep.txt", tree / "hard-link")
    remove_tree(tree)
    assert not tree.exists()
    (tmp_path / "link").symlink_to(outside, target_is_directory=True)
    remove_tree(tmp_path / "link")
    assert not (tmp_path / "link").is_symlink()
    assert (outside / "keep.txt").read_text() == "not the connector's"
    assert (outside / "inner").is_dir()
    assert (outside / "keep.txt").stat().st_nlink == 1


def _lock_up_and_remove(home: Path) -> bool:
    """Make a tree and take its folders' permissions away from their owner, then remove it: whether it is gone."""
    tree = home / "out"
    (tree / "locked/inner").mkdir(parents=True)
    (tree / "locked/inner/file").write_text("x")
    (tree / "read-only").mkdir()
    (tree / "read-only/file").write_text("x")
    for folder, mode in (("read-only", 0o500), ("locked/inner", 0o000), ("locked", 0o000), ("", 0o500)):
        (tree / folder).chmod(mode)
    remove_tree(tree)
    return not os.path.lexists(tree)


def test_folders_whose_owner_took_their_permissions_away_are_removed(tmp_path: Path) -> None:
    """As a connector running as the router's own user can leave them. Root needs no permission to remove anything,
    so as root this runs in a child process that is an ordinary user."""
    if os.geteuid() != 0:
        assert _lock_up_and_remove(tmp_path)
        return
    home = Path(tempfile.mkdtemp(prefix="remove-tree-"))
    try:
        os.chown(home, NOBODY, NOBODY)
        child = os.fork()
        if child == 0:  # pragma: no cover - the child's result is its exit status
            code = 1
            try:
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                code = 0 if _lock_up_and_remove(home) else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert list(home.iterdir()) == []
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_removing_stops_and_says_so_after_its_bound(tmp_path: Path) -> None:
    tree = tmp_path / "out"
    tree.mkdir()
    for n in range(10):
        (tree / f"f{n}").write_text("x")
    with pytest.raises(OSError, match="still filling after 5 entries"):
        remove_tree(tree, most=5)
    assert len(list(tree.iterdir())) == 5
    remove_tree(tree)
    assert not tree.exists()
