"""`handler serve` and `handler up` as a person runs them: what they print, and how signals stop or reload them.

`handler serve` refuses a tree with errors, serves a good one until SIGTERM and reloads on SIGHUP;
`handler up` says what it serves, refuses a tree with nothing good to serve, and Ctrl-C stops it
and every connector process it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fixtures.echo_tree import TOKEN_ENV, select_binding, write_echo_tree
from tests.fixtures.harness import RawClient, short_dir

DEADLINE = 20.0

HANDLER = str(Path(sys.executable).parent / "handler")


@pytest.fixture
def places() -> Iterator[tuple[Path, Path]]:
    with short_dir() as base:
        yield write_echo_tree(base / "t"), base / "run"


def _env(run_dir: Path) -> dict[str, str]:
    return {**os.environ, "HANDLER_RUN_DIR": str(run_dir), TOKEN_ENV: "t"}


def test_serve_refuses_a_tree_with_errors_and_prints_them(places: tuple[Path, Path]) -> None:
    root, run_dir = places
    (root / "config/profiles/tester.toml").write_text('apiVersion = "handler.profile/v1"\nname = "tester"\n')
    done = subprocess.run([HANDLER, "serve", str(root)], capture_output=True, text=True, env=_env(run_dir),
                          timeout=60, check=False)
    assert done.returncode == 1
    assert "config/profiles/tester.toml" in done.stdout
    assert "not starting" in done.stderr
    assert not (run_dir / "profiles").exists()


@pytest.mark.parametrize(("words", "said"), [
    (["serve", "--run-dir", "{file}"], "argument --run-dir: {file} is not a folder"),
    (["serve", "--state-dir", "{file}"], "argument --state-dir: {file} is not a folder"),
    (["up", "--state-dir", "{file}/state"], "argument --state-dir: {file}/state cannot be a folder: {file} is not one"),
    (["status", "--state-dir", "{file}"], "argument --state-dir: {file} is not a folder"),
    (["dashboard", "login", "--member", "owner", "--state-dir", "{file}"],
     "argument --state-dir: {file} is not a folder"),
])
def test_a_file_named_as_the_run_or_state_folder_is_a_usage_error(places: tuple[Path, Path], words: list[str],
                                                                    said: str) -> None:
    # It ended in a traceback (NotADirectoryError from the folder's lock or its mode), the file left as it was.
    root, run_dir = places
    file = root.parent / "notes.txt"
    file.write_text("kept\n")
    done = subprocess.run([HANDLER, *[w.format(file=file) for w in words], "--root", str(root)], capture_output=True,
                          text=True, env=_env(run_dir), timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(f"error: {said.format(file=file)}; name a folder (a missing one is "
                                                  "made)")
    assert file.read_text() == "kept\n"
    assert not run_dir.exists()


@pytest.mark.parametrize(("variable", "words", "said", "code"), [
    ("HANDLER_RUN_DIR", ["serve"], "handler: {file} is not a folder: choose a folder with HANDLER_RUN_DIR, or move "
     "what is there away", 1),
    ("HANDLER_STATE_DIR", ["serve"], "handler: cannot prepare the store's file {file}/handler.db: {file} is not a "
     "folder: choose a folder with HANDLER_STATE_DIR, or move what is there away", 1),
    ("HANDLER_STATE_DIR", ["status"], "handler: {file} is not a folder: give the service's state folder with "
     "--state-dir or HANDLER_STATE_DIR", 2),
])
def test_a_file_named_as_the_run_or_state_folder_by_the_environment_is_one_line(
        places: tuple[Path, Path], variable: str, words: list[str], said: str, code: int) -> None:
    root, run_dir = places
    file = root.parent / "notes.txt"
    file.write_text("kept\n")
    done = subprocess.run([HANDLER, *words, "--root", str(root)], capture_output=True, text=True, timeout=60,
                          check=False, env={**_env(run_dir), "HANDLER_STATE_DIR": str(root.parent / "state"),
                                            variable: str(file)})
    assert (done.returncode, done.stderr.splitlines()) == (code, [said.format(file=file)])
    assert file.read_text() == "kept\n"


def _ask(path: Path, message: dict[str, object]) -> dict[str, object]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(20)
        sock.connect(str(path))
        sock.sendall(orjson.dumps(message) + b"\n")
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    reply: dict[str, object] = orjson.loads(data)
    return reply


def test_serve_runs_until_sigterm_and_reloads_on_sighup(places: tuple[Path, Path]) -> None:
    root, run_dir = places
    proc = subprocess.Popen([HANDLER, "serve", str(root)], stderr=subprocess.PIPE, text=True, env=_env(run_dir))
    try:
        assert proc.stderr is not None
        ready = proc.stderr.readline()
        assert "tester on" in ready, ready
        sock = run_dir / "profiles/tester.sock"
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "echo_say",
                                                                             "arguments": {"text": "up"}}}
        assert _ask(sock, call)["result"]["structuredContent"] == {"text": "up"}  # type: ignore[index]
        (root / "config/profiles/second.toml").write_text(
            (root / "config/profiles/tester.toml").read_text().replace('"tester"', '"second"'))
        proc.send_signal(signal.SIGHUP)
        assert "generation 2" in proc.stderr.readline()
        assert _ask(run_dir / "profiles/second.sock", {"jsonrpc": "2.0", "id": 2, "method": "ping"})["result"] == {}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        assert not sock.exists()
    finally:
        _reap(proc)


def _reap(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` if it still runs, wait for it, close its stderr."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


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


def test_up_says_what_it_serves_and_ctrl_c_stops_everything(places: tuple[Path, Path]) -> None:
    root, run_dir = places
    proc = subprocess.Popen(
        [HANDLER, "up", str(root), "--http", "127.0.0.1:0"], env=_env(run_dir), stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    lines: list[str] = []
    for line in proc.stderr:
        lines.append(line)
        if "Ctrl-C" in line:
            break
    assert lines[0] == f"handler up: worktree {root.resolve()}\n", lines
    assert lines[1].startswith("  serving revision "), lines
    assert lines[1].endswith(" as generation 1\n"), lines
    assert f"  profile tester: {run_dir}/profiles/tester.sock\n" in lines
    assert any("/  the dashboard" in line for line in lines), lines

    async def call() -> Any:
        client = await RawClient.connect(run_dir / "profiles/tester.sock")
        result = await client.call("echo_say", {"text": "hi"})
        await client.close()
        return result

    assert asyncio.run(call())["structuredContent"] == {"text": "hi"}
    assert _processes_under(root), "the connector process should be running"
    # A saved change that applies is one line with its plan in brief; one that cannot, its findings and fixes.
    (root / "config/profiles/second.toml").write_text(
        (root / "config/profiles/tester.toml").read_text().replace('"tester"', '"second"'))
    applied = proc.stderr.readline()
    assert applied.startswith("handler up: applied "), applied
    assert " as generation 2 (watch): second: " in applied
    select_binding(root, "echo-missing", profile="second")
    refused = proc.stderr.readline()
    assert refused.startswith("handler up: revision "), refused
    assert refused.endswith(" not applied (watch): 1 error(s); still serving the last good revision\n")
    assert " P001 binding 'echo-missing' does not exist" in proc.stderr.readline()
    assert proc.stderr.readline().startswith("    fix: ")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=DEADLINE) == 0
    proc.stderr.close()
    assert _processes_under(root) == []
    assert not (run_dir / "profiles/tester.sock").exists()


def test_up_refuses_a_tree_with_nothing_good_to_serve_and_says_why(places: tuple[Path, Path]) -> None:
    root, run_dir = places
    select_binding(root, "echo-missing")
    done = subprocess.run([HANDLER, "up", str(root), "--http", "127.0.0.1:0"], capture_output=True, text=True,
                          env=_env(run_dir), timeout=60, check=False)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    said = [line for line in lines if line.startswith("handler up: not starting: revision ")]
    assert len(said) == 1, done.stderr
    assert " was invalid: 1 error(s); first: config/profiles/tester.toml:" in said[0]
    finding, fix = lines[lines.index(said[0]) + 1: lines.index(said[0]) + 3]
    assert finding.startswith("  config/profiles/tester.toml:")
    assert " P001 binding 'echo-missing' does not exist" in finding
    assert fix.startswith("    fix: ")
    assert lines[-1] == "fix the tree (`handler validate` shows every finding) and start again"
    assert not (run_dir / "profiles").exists()


def test_a_reader_that_goes_away_ends_a_command_quietly() -> None:
    """`handler ... | head -1`: the rest of the output has nowhere to go; no BrokenPipeError traceback."""
    script = ("import sys\nfrom reconciler.cli import _guarded\n"
              "def many():\n    for i in range(200000):\n        print('line', i)\n    return 0\n"
              "sys.exit(_guarded(many))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stderr is not None
    assert proc.stdout.readline() == b"line 0\n"
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(timeout=DEADLINE) == 1
    assert "Traceback" not in err, err
    assert "BrokenPipe" not in err, err


def test_ctrl_c_before_the_service_takes_its_signals_is_a_quiet_exit_130() -> None:
    script = ("import sys\nfrom reconciler.cli import _guarded\ndef stop():\n    raise KeyboardInterrupt\n"
              "sys.exit(_guarded(stop))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=DEADLINE, check=False)
    assert done.returncode == 130
    assert done.stderr == "handler: interrupted\n"


def _serve(root: Path, run_dir: Path) -> tuple[subprocess.Popen[str], str]:
    """`handler serve` started, and what it printed until it served."""
    proc = subprocess.Popen([HANDLER, "serve", str(root)], stderr=subprocess.PIPE, text=True, env=_env(run_dir))
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "tester on" in line:
            return proc, "".join(seen)
    proc.wait()
    raise AssertionError("".join(seen))


def test_a_service_killed_mid_call_leaves_nothing_of_the_call_on_the_host(places: tuple[Path, Path]) -> None:
    """A sandboxed call's input is a copy in its sandbox's call space (a tmpfs only the sandbox mounts), which ends with
    the sandbox when the router is killed: nothing of the call stays on the host, and the agent's file was never
    linked anywhere."""
    root, run_dir = places
    agents = root / "work/tester/slow.txt"
    agents.write_text("sleep:30")
    stderr_log = root / ".handler/connectors/echo-local.stderr.log"
    first, _ = _serve(root, run_dir)
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(run_dir / "profiles/tester.sock"))
            sock.sendall(orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                       "params": {"name": "echo_read", "arguments": {"path": "slow.txt"}}}) + b"\n")
            deadline = time.monotonic() + DEADLINE
            while not (stderr_log.exists() and "/in/0-slow." in stderr_log.read_text()) and time.monotonic() < deadline:
                time.sleep(0.02)
            seen = stderr_log.read_text()  # the token "t" is masked in it
            assert " /calls/" in seen, seen  # the call is at the connector, its input a copy in its call space
            assert agents.stat().st_nlink == 1
            first.kill()
            first.wait()
    finally:
        _reap(first)
    second, told = _serve(root, run_dir)
    try:
        assert "removed" not in told, told
        assert not (run_dir / "inbox").exists()
        assert not any((run_dir / "calls").rglob("*"))
        assert agents.read_text() == "sleep:30"  # the agent's own file is untouched
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=30) == 0
        assert second.stderr is not None
        second.stderr.close()
