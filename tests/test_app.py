"""`handler serve`: refuses a tree with errors, serves a good one until SIGTERM, reloads on SIGHUP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from fixtures.harness import short_dir

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
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()
