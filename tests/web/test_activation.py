"""The HTTP port held by the service manager (systemd's socket activation, `reconciler/web/activation.py`).

`handler serve --http` is started as systemd starts a socket unit's service, on a listening socket the test holds
as systemd would: a restart leaves no moment where a client meets a closed port, and a stopping router leaves new
connections to the next one. A socket passed on another address than `--http` names is refused, naming both.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from reconciler.web.activation import inherited_socket
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.http_service import ACTIVATED, HANDLER, HttpServed, waiting_connections
from tests.fixtures.matrix import wait_until

ACCEPT = {"Accept": "application/json, text/event-stream"}
HELLO = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}


@pytest.fixture
def base() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="h"))  # short: the run folder's sockets must fit
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def tool_call(msg_id: int, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


def result_of(answer: httpx.Response) -> dict[str, Any]:
    """The JSON-RPC message of a POST's answer, a JSON body or the last event of a stream."""
    assert answer.status_code == 200, answer.text
    if answer.headers["content-type"].startswith("application/json"):
        message: dict[str, Any] = answer.json()
        return message
    data = [line.removeprefix("data: ") for line in answer.text.splitlines() if line.startswith("data: {")]
    last: dict[str, Any] = json.loads(data[-1])
    return last


def test_a_restart_on_a_held_socket_leaves_new_connections_to_the_next_router_and_refuses_none(base: Path) -> None:
    """SIGTERM under a call of 2 s: that call's answer comes; a client connecting while the router stops, and while
    none runs, is neither refused nor told the router is stopping: its call waits in the kernel's queue and the next
    router answers it, in the same session. Each call ran once."""
    listening = socket.create_server(("127.0.0.1", 0))
    served = HttpServed(write_echo_tree(base / "t"), base / "run", listening=listening)
    try:
        assert served.port == listening.getsockname()[1]
        token = served.token("tester")
        opened = httpx.post(served.url("tester"), headers={**ACCEPT, "Authorization": f"Bearer {token}"}, json=HELLO)
        assert opened.status_code == 200, opened.text
        headers = {**ACCEPT, "Authorization": f"Bearer {token}", "Mcp-Session-Id": opened.headers["mcp-session-id"]}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            running = pool.submit(httpx.post, served.url("tester"), headers=headers, timeout=30,
                                  json=tool_call(2, "echo_misbehave", {"mode": "sleep", "seconds": 2}))
            time.sleep(0.5)  # the call runs
            assert served.proc is not None
            served.proc.send_signal(signal.SIGTERM)
            wait_until(lambda: any("stopping; 1 call(s) in flight" in line for line in served.said),
                       "the router stopping")
            late = pool.submit(httpx.post, served.url("tester"), headers=headers, timeout=30,
                               json=tool_call(3, "echo_say", {"text": "during the restart"}))
            wait_until(lambda: waiting_connections(served.port) > 0, "the late call's connection in the kernel's queue")
            assert result_of(running.result())["result"]["structuredContent"] == {"text": "slept"}
            assert served.proc.wait(30) == 0
            served.stop()  # its process gone: what is left of it closed
            assert waiting_connections(served.port) == 1, "the late call's connection left the queue, no router running"
            assert not late.done(), "the late call was answered while no router ran"
            served.start(served.port)
            answered = result_of(late.result())
        assert answered["id"] == 3
        assert answered["result"]["structuredContent"] == {"text": "during the restart"}, answered
    finally:
        served.stop()
        listening.close()
    assert [(entry["tool"], entry["outcome"]) for entry in served.log_lines()] == [  # written whole once stopped
        ("echo_misbehave", "executed"), ("echo_say", "executed")]


def test_a_socket_passed_on_another_address_is_refused_naming_both(base: Path) -> None:
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    other = socket.create_server(("127.0.0.1", 0))
    wanted = other.getsockname()[1]
    other.close()  # a port nobody listens on
    fd = listening.fileno()
    try:
        done = subprocess.run([sys.executable, "-c", ACTIVATED, str(fd), HANDLER, "serve",
                               str(write_echo_tree(base / "t")), "--no-sandbox", "--http", f"127.0.0.1:{wanted}"],
                              check=False, pass_fds=[fd], capture_output=True, text=True, timeout=60,
                              env={**os.environ, "HANDLER_RUN_DIR": str(base / "run"), "LISTEN_FDS": "1"})
    finally:
        listening.close()
    assert done.returncode != 0
    assert f"the service manager passed 1 socket(s) (127.0.0.1:{port}) and none listens on --http " \
           f"127.0.0.1:{wanted}; make --http name the socket unit's ListenStream address" in done.stderr, done.stderr


def test_sockets_passed_to_another_process_are_not_taken_and_the_variables_are_cleared_once_read() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        theirs = {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}
        assert inherited_socket("127.0.0.1", port, theirs) is None
        assert theirs == {"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}  # another process's to read
        ours = {"LISTEN_PID": str(os.getpid()), "LISTEN_FDS": "0", "LISTEN_FDNAMES": ""}
        assert inherited_socket("127.0.0.1", port, ours) is None
        assert ours == {}


def test_a_passed_descriptor_that_is_no_listening_tcp_socket_is_named_not_served() -> None:
    """Descriptor 3 holding a file (here, through a child's own): `inherited_socket` finds no TCP listener there."""
    script = ("import os, sys\n"
              "from reconciler.web.activation import ActivationError, inherited_socket\n"
              "fd = os.open(os.devnull, os.O_RDONLY)\n"
              "os.dup2(fd, 3)\n"
              "env = {'LISTEN_PID': str(os.getpid()), 'LISTEN_FDS': '1'}\n"
              "try:\n"
              "    inherited_socket('127.0.0.1', 8765, env)\n"
              "except ActivationError as exc:\n"
              "    print(exc)\n")
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == (
        "the service manager passed 1 socket(s) (none listening over TCP) and none listens on --http 127.0.0.1:8765; "
        "make --http name the socket unit's ListenStream address"), done.stdout + done.stderr
