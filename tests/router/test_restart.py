"""A session handed to the router outlives the router: the bridge answers what was open, waits, and hands it over again.

Every test runs the installed `handler-service` and `handler serve` as real subprocesses on the echo tree; the
router is killed (SIGKILL, nothing said) or stopped (SIGTERM) under an open session, then started again or not.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import os
import random
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.harness import BRIDGE, DEADLINE
from tests.fixtures.matrix import HANDLER
from tests.router.test_handoff import INIT, call, line

PING: dict[str, Any] = {"jsonrpc": "2.0", "method": "ping"}


@pytest.fixture(params=["relay", "handover"])
def mode(request: pytest.FixtureRequest) -> str:
    """How the bridge carries the session: relaying its lines (the default), or handing its stdio to the router."""
    return f"--{request.param}"


@contextlib.contextmanager
def router(root: Path, run_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """`handler serve` on the echo tree, serving once its socket is there."""
    sock = run_dir / "profiles/tester.sock"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()  # a killed router's, which nobody listens on
    proc = subprocess.Popen([HANDLER, "serve", str(root)], env={**os.environ, "HANDLER_RUN_DIR": str(run_dir)},
                            stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + DEADLINE
        while not sock.exists():
            assert proc.poll() is None, "handler serve exited"
            assert time.monotonic() < deadline, "handler serve did not open its socket"
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(DEADLINE)


class Agent:
    """The host's side of `handler-service`: requests in on its stdin, replies read from its stdout."""

    def __init__(self, run_dir: Path, wait_seconds: float, *options: str) -> None:
        self.proc = subprocess.Popen([BRIDGE, "echo", "--profile", "tester", *options], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env={**os.environ, "HANDLER_RUN_DIR": str(run_dir),
                                          "HANDLER_REATTACH_SECONDS": str(wait_seconds)})
        self.replies: list[dict[str, Any]] = []

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def reply(self, timeout: float = DEADLINE) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no reply came"
        got = self.proc.stdout.readline()
        assert got, "the agent's stdout ended"
        reply: dict[str, Any] = json.loads(got)
        self.replies.append(reply)
        return reply

    def request(self, data: bytes) -> dict[str, Any]:
        self.send(data)
        return self.reply()

    def finish(self) -> tuple[int, str]:
        """Close stdin; the bridge's exit status and stderr, every reply left read into `replies`."""
        out, err = self.proc.communicate(timeout=DEADLINE)
        self.replies.extend(json.loads(reply) for reply in out.splitlines())
        return self.proc.returncode, err.decode()


def calls_logged(root: Path) -> list[dict[str, Any]]:
    path = root / ".handler/calls.jsonl"
    return [json.loads(entry) for entry in path.read_text().splitlines()] if path.exists() else []


def open_call(agent: Agent) -> None:
    """An initialized session with call 2 in flight (held 30 s by the connector), known to the bridge."""
    assert agent.request(line(INIT))["id"] == 1
    agent.send(call(2, "echo_misbehave", {"mode": "sleep", "seconds": 30}))
    # Answered after call 2 began: the router told the bridge of it at the end of that event-loop turn.
    assert agent.request(call(3, "echo_say", {"text": "before"}))["result"]["structuredContent"] == {"text": "before"}


def test_a_router_killed_mid_call_answers_it_once_and_the_session_goes_on_at_the_next(echo_root: Path,
                                                                                      run_dir: Path, mode: str) -> None:
    with router(echo_root, run_dir) as first:
        agent = Agent(run_dir, 30, mode)
        open_call(agent)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
        told = agent.reply()
    assert told["id"] == 2
    assert told["error"]["data"] == {"handler/retry": "later"}
    assert "the router restarted while this call was running, so it may or may not have run" in \
        told["error"]["message"]
    with router(echo_root, run_dir):
        # No initialize: the same session, resumed from the record the bridge kept.
        answer = agent.request(call(4, "echo_say", {"text": "after the restart"}))
        assert answer["result"]["structuredContent"] == {"text": "after the restart"}
        status, err = agent.finish()
    assert status == 0, err
    assert [reply["id"] for reply in agent.replies] == [1, 3, 2, 4]  # one reply each, call 2's the error
    assert "the router went away; waiting up to 30 s" in err
    assert "the router is back; the session goes on" in err


def test_a_router_stopped_and_started_again_resumes_the_session(echo_root: Path, run_dir: Path, mode: str) -> None:
    with router(echo_root, run_dir) as first:
        agent = Agent(run_dir, 30, mode)
        open_call(agent)
        first.send_signal(signal.SIGTERM)
        first.wait(DEADLINE)
        assert agent.reply()["id"] == 2
    with router(echo_root, run_dir):
        assert agent.request(line({**PING, "id": 5}))["result"] == {}
        assert agent.request(call(6, "echo_say", {"text": "after"}))["result"]["structuredContent"] == {"text": "after"}
        status, err = agent.finish()
    assert status == 0, err
    assert [reply["id"] for reply in agent.replies] == [1, 3, 2, 5, 6]
    # One agent run on both routers, though the bridge named none: the session's record carried it.
    logged = {entry["tool"]: entry for entry in calls_logged(echo_root)}
    assert logged["echo_misbehave"]["outcome"] == "cancelled"  # the stopping router cancelled it, and logged it
    assert logged["echo_say"]["instance"] == logged["echo_misbehave"]["instance"]


def test_when_no_router_comes_back_the_bridge_answers_what_waits_and_exits(echo_root: Path, run_dir: Path,
                                                                          mode: str) -> None:
    with router(echo_root, run_dir) as first:
        agent = Agent(run_dir, 1.5, mode)
        open_call(agent)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
    assert agent.reply()["id"] == 2
    began = time.monotonic()
    agent.send(call(6, "echo_say", {"text": "anyone?"}))
    assert agent.proc.wait(DEADLINE) == 1
    assert time.monotonic() - began < 1.5 + 5
    status, err = agent.finish()
    assert status == 1
    told = agent.replies[-1]
    assert told["id"] == 6
    assert told["error"]["message"].startswith(f"no router came back at {run_dir / 'profiles/tester.sock'} within "
                                               "1.5 s; this MCP server has stopped: restart it in your host")
    assert [reply["id"] for reply in agent.replies] == [1, 3, 2, 6]
    assert "handler-service: no router came back" in err


def test_a_session_whose_revision_is_gone_is_told_on_its_next_call(echo_root: Path, run_dir: Path, mode: str) -> None:
    with router(echo_root, run_dir) as first:
        agent = Agent(run_dir, 30, mode)
        open_call(agent)
        first.send_signal(signal.SIGKILL)
        first.wait(DEADLINE)
        assert agent.reply()["id"] == 2
    profile = echo_root / "config/profiles/tester.toml"
    profile.write_text(profile.read_text() + "\n# changed while the router was down\n")
    with router(echo_root, run_dir):
        told = agent.request(call(7, "echo_say", {"text": "still pinned?"}))
        status, _ = agent.finish()
    assert told["error"]["code"] == -32600, told
    assert "this session was pinned to config revision" in told["error"]["message"]
    assert "restart this MCP server in your host" in told["error"]["message"]
    assert status == 0


def test_a_relaying_bridge_answers_every_request_exactly_once_through_repeated_crashes(echo_root: Path,
                                                                                        run_dir: Path) -> None:
    """Requests sent without pause, short and long calls, while the router is killed (SIGKILL) again and again at
    random moments and started again: each request gets exactly one reply, each a whole line, and none is lost
    (docs/router.md "Exactly one reply")."""
    chance = random.Random(20261204)  # noqa: S311 - the moments of the crashes, not a secret
    lines: list[bytes] = []
    sent: list[int] = []
    stop = threading.Event()

    def send_all() -> None:
        for call_id in itertools.count(2):
            if stop.is_set():
                return
            seconds = chance.choice([0, 0, 0.05, 0.3])
            agent.send(call(call_id, "echo_misbehave", {"mode": "sleep", "seconds": seconds}) if seconds
                       else call(call_id, "echo_say", {"text": str(call_id)}))
            sent.append(call_id)
            time.sleep(0.002)

    sending = threading.Thread(target=send_all, daemon=True)
    for cycle in range(6):
        with router(echo_root, run_dir) as serving_now:
            if cycle == 0:
                agent = Agent(run_dir, 60)  # relaying, as by default
                out = agent.proc.stdout
                assert out is not None
                threading.Thread(target=lines.extend, args=(iter(out.readline, b""),), daemon=True).start()
                agent.send(line(INIT))
                # The session is up before the first crash: a bridge that has not connected yet (a slow start on a
                # busy host) would find no router at all, which is a start that fails, not a restart.
                deadline = time.monotonic() + DEADLINE
                while not lines and time.monotonic() < deadline:
                    time.sleep(0.01)
                sending.start()
            time.sleep(chance.uniform(0.1, 0.6))
            if cycle < 5:
                serving_now.send_signal(signal.SIGKILL)
                serving_now.wait(DEADLINE)
                continue
            stop.set()
            sending.join(DEADLINE)
            deadline = time.monotonic() + DEADLINE
            while len(lines) < len(sent) + 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            status, err = agent.finish()
    assert status == 0, err
    replies = [json.loads(reply) for reply in lines]  # each a whole line, or this raises
    answered = collections.Counter(reply["id"] for reply in replies)
    assert {call_id: n for call_id, n in answered.items() if n != 1} == {}, "answered more than once"
    assert sorted(answered) == [1, *sent], "some requests got no reply"
    cut = [r for r in replies if "error" in r]
    assert cut, "no call was in flight at any crash: the test proved nothing"
    assert all("the router restarted while this call was running" in r["error"]["message"] for r in cut)


def test_a_relaying_bridge_sent_thousands_of_requests_at_once_answers_every_one(echo_root: Path,
                                                                               run_dir: Path) -> None:
    """3,000 requests written in one go, their replies (6 MB) far past what the socket and the router buffer: the
    bridge keeps reading the replies while the router is not taking its requests, so neither waits on the other."""
    with router(echo_root, run_dir):
        agent = Agent(run_dir, 30)
        data = line(INIT) + b"".join(call(i, "echo_say", {"text": "x" * 2000}) for i in range(2, 3002))
        threading.Thread(target=agent.send, args=(data,), daemon=True).start()
        out = agent.proc.stdout
        assert out is not None
        ids = [json.loads(out.readline())["id"] for _ in range(3001)]
        status, err = agent.finish()
    assert status == 0, err
    assert sorted(ids) == list(range(1, 3002))
