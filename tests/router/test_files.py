"""S4: file arguments resolved inside the profile's scope, every escape refused, copies in and out."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import stat
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.router import pipeline
from reconciler.router.errors import ToolError
from reconciler.router.files import (
    ANY,
    CallFolder,
    FileArg,
    FileField,
    Scope,
    clear_leftovers,
    find_file_fields,
    restore_paths,
)
from reconciler.router.server import Router
from tests.fixtures.harness import DEADLINE, RawClient, body, exchange


@pytest.fixture
def scope(echo_root: Path) -> Path:
    work = echo_root / "work/tester"
    (work / "doc.txt").write_text("inside the scope")
    (work / "sub").mkdir()
    (work / "big.bin").write_bytes(b"x" * 1001)  # maxFileBytes is 1000
    (echo_root / "secret.txt").write_text("outside the scope")
    outside = echo_root / "elsewhere"
    outside.mkdir()
    (outside / "x.txt").write_text("outside too")
    (work / "link-out").symlink_to(echo_root / "secret.txt")
    (work / "dir-out").symlink_to(outside)
    (work / "link-in").symlink_to(work / "doc.txt")
    return work


ESCAPES_IN = [
    ("../secret.txt", "contains '..'"),
    ("sub/../../secret.txt", "contains '..'"),
    ("/etc/passwd", "outside the work folder"),
    ("link-out", "through a symbolic link"),
    ("dir-out/x.txt", "through a symbolic link"),
    ("missing.txt", "there is no file"),
    ("sub", "not a regular file"),
    ("", "empty"),
    ("doc.txt/", "ends in '/', so it names a folder"),
    ("doc.txt/.", "ends in '/.', so it names a folder"),
]


@pytest.mark.parametrize(("path", "why"), ESCAPES_IN)
def test_every_input_escape_is_refused(echo_root: Path, scope: Path, run_dir: Path, path: str, why: str) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": path})
        assert body(result)["error"] == "invalid_arguments", result
        assert why in body(result)["message"]
        assert body(result)["message"].startswith("/path: ")
        assert router.services.pool.processes() == []  # refused before any connector started
        assert "echo-local" not in router.services.pool.statuses

    exchange(echo_root, run_dir, script)


def test_an_absolute_path_outside_the_scope_is_refused_even_when_it_exists(echo_root: Path, scope: Path,
                                                                         run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": str(echo_root / "secret.txt")})
        assert "outside the work folder" in body(result)["message"]

    exchange(echo_root, run_dir, script)


def test_an_input_over_max_file_bytes_is_too_large(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": "big.bin"})
        assert body(result)["error"] == "too_large"
        assert "1001 bytes" in body(result)["message"]

    exchange(echo_root, run_dir, script)


@pytest.mark.parametrize("path", ["doc.txt", "link-in", "./doc.txt", "ABS"])
def test_the_connector_reads_a_copy_in_its_call_space_and_the_agent_sees_its_own_path(
        echo_root: Path, scope: Path, run_dir: Path, path: str) -> None:
    given = str(scope / "doc.txt") if path == "ABS" else path

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": given})
        assert result["isError"] is False, result
        out = body(result)
        assert out == {"bytes": 16, "sha256": hashlib.sha256(b"inside the scope").hexdigest(), "path": given}
        seen = (router.state_dir / "connectors/echo-local.stderr.log").read_text().splitlines()[-1]
        # A copy in the call space of its sandbox (a tmpfs the host does not mount), never the agent's file: what the
        # agent writes to it later reaches no descriptor the connector keeps.
        assert seen.startswith("echo_read got /calls/"), seen
        assert "; not writable: " in seen, seen  # the router's file, 0644, to a connector of its own uid (root)
        agents = (scope / "doc.txt").stat()
        assert not seen.endswith(f"; file {agents.st_dev}:{agents.st_ino}"), seen
        assert not (run_dir / "inbox/echo-local").exists()
        assert (scope / "doc.txt").read_bytes() == b"inside the scope"

    exchange(echo_root, run_dir, script)


ESCAPES_OUT = [
    ("../x.txt", "contains '..'"),
    ("/tmp/x.txt", "outside the work folder"),
    ("dir-out/new.txt", "through a symbolic link"),
    ("link-out", "through a symbolic link"),
    ("doc.txt/inner.txt", "goes through a file"),
    ("sub", "is a folder"),
    (".", "names the work folder itself"),
    ("new.txt/", "ends in '/', so it names a folder"),
    ("doc.txt/", "ends in '/', so it names a folder"),
]


@pytest.mark.parametrize(("path", "why"), ESCAPES_OUT)
def test_every_output_escape_is_refused(echo_root: Path, scope: Path, run_dir: Path, path: str, why: str) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "hi", "outputPath": path})
        assert body(result)["error"] == "invalid_arguments", result
        assert why in body(result)["message"]
        assert (echo_root / "secret.txt").read_text() == "outside the scope"
        assert (scope / "doc.txt").read_text() == "inside the scope"
        assert not (scope / "new.txt").exists()

    exchange(echo_root, run_dir, script)


def test_an_output_is_moved_into_the_scope_at_the_agents_path(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "written by the connector", "outputPath": "out/new/reply.txt"})
        assert result["isError"] is False, result
        assert body(result) == {"path": "out/new/reply.txt", "bytes": 24}
        assert (scope / "out/new/reply.txt").read_text() == "written by the connector"
        again = await c.call("echo_write", {"text": "replaced", "outputPath": "out/new/reply.txt"})
        assert again["isError"] is False
        assert (scope / "out/new/reply.txt").read_text() == "replaced"
        assert not [p for p in (scope / "out/new").iterdir() if p.name.startswith(".handler-")]

    exchange(echo_root, run_dir, script)


def test_an_output_over_max_file_bytes_is_unavailable(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "y" * 2000, "outputPath": "huge.txt"})
        assert result["_meta"]["handler/cause"] == "output_too_large"
        assert not (scope / "huge.txt").exists()

    exchange(echo_root, run_dir, script)


def test_file_fields_are_found_once_through_refs_and_arrays() -> None:
    schema = {
        "type": "object",
        "properties": {
            "single": {"type": "string", "format": "handler-file"},
            "many": {"type": "array", "items": {"$ref": "#/$defs/doc"}},
            "nested": {"type": "object", "properties": {"out": {"type": "string", "format": "handler-output-file"}}},
            "plain": {"type": "string"},
        },
        "$defs": {"doc": {"type": "object", "properties": {"path": {"type": "string", "format": "handler-file"}}}},
    }
    assert find_file_fields(schema) == (
        FileField(("single",), output=False),
        FileField(("many", ANY, "path"), output=False),
        FileField(("nested", "out"), output=True),
    )


def test_restoring_paths_touches_only_exact_matches() -> None:
    back = {"/run/calls/1/in/0-a.pdf": "a.pdf"}
    value = {"path": "/run/calls/1/in/0-a.pdf", "items": ["/run/calls/1/in/0-a.pdf", "other"], "n": 3}
    assert restore_paths(value, back) == {"path": "a.pdf", "items": ["a.pdf", "other"], "n": 3}


# Race-free files: only regular files cross, and no symlink is followed below the scope (docs/architecture.md §6).

@pytest.fixture
def specials(scope: Path) -> Iterator[dict[str, str]]:
    """A FIFO, a unix socket file and (as root) a character device inside the scope: name → what the router says."""
    os.mkfifo(scope / "pipe")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(scope / "sock"))
    found = {"pipe": "a named pipe (FIFO)", "sock": "a socket"}
    try:
        yield found
    finally:
        listener.close()


def make_device(scope: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a device node inside the scope needs root (os.mknod); CI runs the tests as root")
    try:
        os.mknod(scope / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("this root may not make device nodes (no CAP_MKNOD in this container)")


async def call_all(c: RawClient, calls: list[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Send every call at once on one connection, then read every reply: results in the order sent."""
    for index, (tool, arguments) in enumerate(calls):
        await c.send({"jsonrpc": "2.0", "id": 1000 + index, "method": "tools/call",
                      "params": {"name": tool, "arguments": arguments}})
    replies: dict[int, dict[str, Any]] = {}
    async with asyncio.timeout(DEADLINE * 3):  # generous: a call that blocked would never answer at all
        while len(replies) < len(calls):
            reply = await c.recv()
            replies[reply["id"]] = reply["result"]
    return [replies[1000 + index] for index in range(len(calls))]


@pytest.mark.parametrize("device", [False, True], ids=["fifo-and-socket", "char-device"])
def test_64_calls_naming_a_fifo_a_socket_or_a_device_are_refused_and_none_blocks(
        echo_root: Path, scope: Path, run_dir: Path, specials: dict[str, str], device: bool) -> None:
    if device:
        make_device(scope)
        specials = {"null": "a character device"}
    names = list(specials)
    calls = [("echo_read", {"path": names[i % len(names)]}) if i % 2 == 0
             else ("echo_write", {"text": "never", "outputPath": names[i % len(names)]}) for i in range(64)]

    async def script(c: RawClient, router: Router) -> None:
        for (tool, arguments), result in zip(calls, await call_all(c, calls), strict=True):
            named = arguments.get("path") or arguments["outputPath"]
            assert body(result)["error"] == "invalid_arguments", (tool, result)
            message = body(result)["message"]
            assert f"'{named}' is {specials[named]}" in message
            assert "only regular files are accepted" in message
        ordinary = await c.call("echo_read", {"path": "doc.txt"})
        assert ordinary["isError"] is False, ordinary
        assert stat.S_ISFIFO(os.lstat(scope / "pipe").st_mode)  # the output refusals left them all as they were

    exchange(echo_root, run_dir, script)


def swap_after_step_4(monkeypatch: pytest.MonkeyPatch, folder: Path, to: Path) -> None:
    """Between the check (step 4) and the copy, `folder` becomes a symlink to `to`: the race, made certain."""
    resolve = pipeline.resolve_files

    def resolve_then_swap(*args: Any) -> Any:
        files = resolve(*args)
        folder.rename(folder.with_name(folder.name + "-moved"))
        folder.symlink_to(to, target_is_directory=True)
        return files

    monkeypatch.setattr(pipeline, "resolve_files", resolve_then_swap)


def test_an_input_folder_swapped_for_a_symlink_after_the_check_is_never_followed(
        echo_root: Path, scope: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (scope / "sub/inner.txt").write_text("inside")
    (echo_root / "elsewhere/inner.txt").write_text("outside the scope")
    swap_after_step_4(monkeypatch, scope / "sub", echo_root / "elsewhere")

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_read", {"path": "sub/inner.txt"})
        assert body(result)["error"] == "invalid_arguments", result
        assert "goes through a symbolic link, which is never followed" in body(result)["message"]

    exchange(echo_root, run_dir, script)


def test_an_output_folder_swapped_for_a_symlink_after_the_check_is_never_followed(
        echo_root: Path, scope: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (scope / "out").mkdir()
    (scope / "also").mkdir()
    swap_after_step_4(monkeypatch, scope / "out", scope / "also")  # even a symlink that stays inside

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "hi", "outputPath": "out/reply.txt"})
        assert body(result)["error"] == "invalid_arguments", result
        assert "goes through a symbolic link, which is never followed" in body(result)["message"]
        assert not (scope / "also/reply.txt").exists()

    exchange(echo_root, run_dir, script)


def test_an_output_over_a_symlink_inside_the_scope_is_refused(echo_root: Path, scope: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_write", {"text": "hi", "outputPath": "link-in"})
        assert "'link-in' is a symbolic link, not a regular file" in body(result)["message"]
        assert (scope / "doc.txt").read_text() == "inside the scope"

    exchange(echo_root, run_dir, script)


def test_a_path_with_a_doubled_leading_slash_inside_the_scope_is_accepted(echo_root: Path, scope: Path,
                                                                         run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        read = await c.call("echo_read", {"path": "/" + str(scope / "doc.txt")})
        assert read["isError"] is False, read
        assert body(read)["bytes"] == 16
        written = await c.call("echo_write", {"text": "doubled", "outputPath": "/" + str(scope / "out2.txt")})
        assert written["isError"] is False, written
        assert (scope / "out2.txt").read_text() == "doubled"
        outside = await c.call("echo_read", {"path": "/" + str(echo_root / "secret.txt")})
        assert "outside the work folder" in body(outside)["message"]

    exchange(echo_root, run_dir, script)


def deliver_in_a_thread(folder: CallFolder, file: FileArg, scope: Scope) -> BaseException | None:
    """`folder.deliver` on a daemon thread joined under a generous deadline: a blocked open fails the test."""
    caught: list[BaseException] = []

    def run() -> None:
        try:
            folder.deliver((file,), scope, 1000)
        except BaseException as exc:
            caught.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(DEADLINE)
    assert not worker.is_alive(), "delivering the output blocked"
    return caught[0] if caught else None


@pytest.mark.parametrize("made", ["fifo", "socket", "out-symlink"])
def test_what_a_connector_leaves_that_is_no_regular_file_is_refused_without_blocking(scope: Path, run_dir: Path,
                                                                                     made: str) -> None:
    work = Scope(str(scope), str(scope.resolve()))
    file = FileArg(("outputPath",), "reply.txt", str(scope.resolve() / "reply.txt"), output=True, root=work.real)
    folder = CallFolder(run_dir, "call-1")
    (folder.path / "out").mkdir(parents=True)
    staged = folder.path / "out/0-reply.txt"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if made == "fifo":
        os.mkfifo(staged)
    elif made == "socket":
        listener.bind(str(staged))
    else:  # the connector swaps its out folder for a link to a folder holding a secret
        (folder.path / "out").rmdir()
        (folder.path / "out").symlink_to(scope.parent.parent / "elsewhere")
        (scope.parent.parent / "elsewhere/0-reply.txt").write_text("outside the scope")
    with listener:
        error = deliver_in_a_thread(folder, file, work)
    assert isinstance(error, ToolError), error
    assert error.cause == "output_invalid"
    assert not (scope / "reply.txt").exists()


def test_clearing_a_run_folder_removes_what_calls_left_and_follows_no_link(tmp_path: Path) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the run folder's")
    (run / "inbox/b").mkdir(parents=True)
    (run / "calls/b/123-1/in").mkdir(parents=True)
    (run / "calls/b/123-1/in/0-doc.txt").write_text("a call's copy")
    (run / "inbox/b/123-1-0-doc.txt").write_text("a call's input")
    (run / "inbox/b/link").symlink_to(outside / "keep.txt")
    (run / "calls/elsewhere").symlink_to(outside, target_is_directory=True)  # a binding folder that is a link
    (outside / "inner").mkdir()
    assert clear_leftovers(run) == 3
    assert list((run / "inbox/b").iterdir()) == []
    assert list((run / "calls/b").iterdir()) == []
    assert (outside / "keep.txt").read_text() == "not the run folder's"
    assert (outside / "inner").is_dir()  # not reached through the link
    assert clear_leftovers(run) == 0
    assert clear_leftovers(tmp_path / "never-made") == 0


def test_a_copied_input_is_cut_at_the_size_it_was_checked_at(tmp_path: Path) -> None:
    # The agent may grow its file between the check against maxFileBytes and the copy: the copy stops there.
    from reconciler.router.files import _copy_into

    grown = tmp_path / "grown"
    grown.write_bytes(b"x" * 900 + b"y" * 5_000_000)
    dest = tmp_path / "copied"
    src = os.open(grown, os.O_RDONLY)
    try:
        _copy_into(src, os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), 900, shared=False)
    finally:
        os.close(src)
    assert dest.read_bytes() == b"x" * 900


def _an_input(tmp_path: Path, content: bytes) -> tuple[FileArg, Path]:
    """The agent's file `doc.bin`, checked as an input of its scope."""
    scope = tmp_path / "scope"
    scope.mkdir()
    (scope / "doc.bin").write_bytes(content)
    real = os.path.realpath(scope)
    checked = FileArg(("path",), "doc.bin", f"{real}/doc.bin", output=False, size=len(content), root=real)
    return checked, scope / "doc.bin"


@pytest.mark.parametrize("shm", [False, True], ids=["same-filesystem", "tmpfs"])
def test_an_input_kept_open_reads_as_it_was_when_the_call_began(tmp_path: Path, shm: bool) -> None:
    """A connector that keeps its input's descriptor past the call reads the file as it was checked, whatever the agent
    writes to its own file afterwards; on the scope's filesystem or on a tmpfs (as a sandbox's call space is)."""
    file, agents = _an_input(tmp_path, b"x" * 900)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if shm else tmp_path) as base:
        folder = CallFolder(Path(base), "c1")
        args, back = folder.stage((file,), {"path": "doc.bin"}, 1000, frozenset({"too_large"}))
        kept = os.open(args["path"], os.O_RDONLY)
        try:
            assert os.fstat(kept).st_ino != agents.stat().st_ino  # a copy, not the agent's file
            folder.remove()
            with agents.open("ab") as grow:
                grow.write(b"AGENT WROTE THIS AFTER THE CALL")
            assert os.pread(kept, 10_000, 0) == b"x" * 900
        finally:
            os.close(kept)
    assert back == {args["path"]: "doc.bin"}


def test_a_call_folder_placed_in_a_call_space_names_the_connectors_paths(tmp_path: Path) -> None:
    """Placed in a call space, the folder is made there through a descriptor of its own (the space's path may name
    a descriptor a connector's stop closes), and the connector is given its own path of it."""
    file, _ = _an_input(tmp_path, b"x" * 900)
    space = tmp_path / "space"
    space.mkdir()
    folder = CallFolder(tmp_path / "calls", "c1")
    folder.place((space, Path("/calls")))
    out = FileArg(("out",), "reply.txt", str(tmp_path / "scope/reply.txt"), output=True, root=file.root)
    args, back = folder.stage((file, out), {"path": "doc.bin", "out": "reply.txt"}, 1000, frozenset())
    assert args == {"path": "/calls/c1/in/0-doc.bin", "out": "/calls/c1/out/1-reply.txt"}
    assert back == {"/calls/c1/in/0-doc.bin": "doc.bin", "/calls/c1/out/1-reply.txt": "reply.txt"}
    assert (space / "c1/in/0-doc.bin").read_bytes() == b"x" * 900
    (space / "c1/out/1-reply.txt").write_text("done")
    folder.deliver((file, out), Scope(str(tmp_path / "scope"), file.root), 1000)
    assert (tmp_path / "scope/reply.txt").read_text() == "done"
    opened = len(list(Path("/proc/self/fd").iterdir()))
    folder.remove()
    assert list(space.iterdir()) == []
    assert len(list(Path("/proc/self/fd").iterdir())) == opened - 1  # its descriptor of the space, closed
    assert not (tmp_path / "calls").exists()
