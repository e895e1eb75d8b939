"""A session handed to the router outlives the router: the bridge answers what was open, waits, and hands it over again.

Every test runs the installed `handler-service` and `handler serve` as real subprocesses on the echo tree; the
router is killed (SIGKILL, nothing said) or stopped (SIGTERM) under an open session, then started again or not. A
stopped router lets the calls in flight finish first, for its `--stop-grace` (docs/router.md "Stopping"), and what
the agent sends meanwhile waits for the next router.
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
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.router.handoff import ACCEPTED, attach_line
from reconciler.wire.meta import INTERFACE
from tests.fixtures.harness import BRIDGE, DEADLINE
from tests.fixtures.matrix import HANDLER
from tests.router.test_handoff import INIT, call, line

PING: dict[str, Any] = {"jsonrpc": "2.0", "method": "ping"}


@pytest.fixture(params=["relay", "handover"])
def mode(request: pytest.FixtureRequest) -> str:
    """How the bridge carries the session: relaying its lines (the default), or handing its stdio to the router."""
    return f"--{request.param}"


@contextlib.contextmanager
def router(root: Path, run_dir: Path, *options: str, said: Path | None = None,
           profile: str = "tester") -> Iterator[subprocess.Popen[str]]:
    """`handler serve` on `root` (the echo tree), serving once `profile`'s socket is there; what it says on stderr
    goes to `said`."""
    sock = run_dir / f"profiles/{profile}.sock"
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()  # a killed router's, which nobody listens on
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(said.open("w")) if said is not None else subprocess.DEVNULL
        proc = subprocess.Popen([HANDLER, "serve", str(root), *options],
                                env={**os.environ, "HANDLER_RUN_DIR": str(run_dir)}, stderr=err, text=True)
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


def wait_until_said(path: Path, text: str) -> None:
    """Until the router's stderr, written to `path`, holds `text`."""
    deadline = time.monotonic() + DEADLINE
    while text not in path.read_text():
        assert time.monotonic() < deadline, f"the router never said {text!r}: {path.read_text()}"
        time.sleep(0.02)


STOPPING = "stopping; 1 call(s) in flight may finish for up to 5 s"


class Agent:
    """The host's side of `handler-service`: requests in on its stdin, replies read from its stdout."""

    def __init__(self, run_dir: Path, wait_seconds: float, *options: str) -> None:
        # Its stderr goes to a file (appended to), so a test can read what it said so far while it runs; in the run
        # folder, which goes with the test.
        run_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="bridge-", suffix=".err", dir=run_dir)
        os.close(fd)
        self._err = Path(name)
        with self._err.open("ab") as err:
            self.proc = subprocess.Popen([BRIDGE, "echo", "--profile", "tester", *options], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err,
                                         env={**os.environ, "HANDLER_RUN_DIR": str(run_dir),
                                              "HANDLER_REATTACH_SECONDS": str(wait_seconds)})
        self.replies: list[dict[str, Any]] = []
        # Read from the descriptor into a buffer of the test's own: a buffered file could hold a second reply that
        # `select` on its descriptor does not see.
        self._unread = b""

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def replied(self, timeout: float) -> bool:
        """Whether a whole reply is there to read within `timeout` seconds."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while b"\n" not in self._unread:
            ready, _, _ = select.select([self.proc.stdout.fileno()], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            chunk = os.read(self.proc.stdout.fileno(), 1 << 16)
            assert chunk, "the agent's stdout ended"
            self._unread += chunk
        return True

    def reply(self, timeout: float = DEADLINE) -> dict[str, Any]:
        assert self.replied(timeout), "no reply came"
        got, _, self._unread = self._unread.partition(b"\n")
        reply: dict[str, Any] = json.loads(got)
        self.replies.append(reply)
        return reply

    def request(self, data: bytes) -> dict[str, Any]:
        self.send(data)
        return self.reply()

    def said(self) -> str:
        """What the bridge said on its stderr so far."""
        return self._err.read_text()

    def until_said(self, text: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while text not in self.said():
            assert self.proc.poll() is None, f"the bridge exited: {self.said()}"
            assert time.monotonic() < deadline, f"the bridge never said {text!r}: {self.said()}"
            time.sleep(0.02)

    def finish(self) -> tuple[int, str]:
        """Close stdin; the bridge's exit status and stderr, every reply left read into `replies`."""
        out, _ = self.proc.communicate(timeout=DEADLINE)
        self.replies.extend(json.loads(reply) for reply in (self._unread + out).splitlines())
        said = self.said()
        self._err.unlink()
        return self.proc.returncode, said


def calls_logged(root: Path) -> list[dict[str, Any]]:
    path = root / ".handler/calls.jsonl"
    return [json.loads(entry) for entry in path.read_text().splitlines()] if path.exists() else []


def open_call(agent: Agent) -> None:
    """An initialized session with call 2 in flight (held 30 s by the connector), known to the bridge."""
    assert agent.request(line(INIT))["id"] == 1
    agent.send(call(2, "echo_misbehave", {"mode": "sleep", "seconds": 30}))
    # Answered after call 2 began: the router told the bridge of it at the end of that event-loop turn.
    assert agent.request(call(3, "echo_say", {"text": "before"}))["result"]["structuredContent"] == {"text": "before"}


def stopped_under_a_call(router: subprocess.Popen[str], run_dir: Path, mode: str, said: Path,
                         seconds: float = 2) -> Agent:
    """An initialized session with call 2 in flight (`seconds`, within the stop's grace), answered 1 and 3; then
    SIGTERM to `router`, which says (on `said`) it lets that call finish."""
    agent = Agent(run_dir, 30, mode)
    assert agent.request(line(INIT))["id"] == 1
    agent.send(call(2, "echo_misbehave", {"mode": "sleep", "seconds": seconds}))
    assert agent.request(call(3, "echo_say", {"text": "before"}))["id"] == 3  # call 2 runs by now
    router.send_signal(signal.SIGTERM)
    wait_until_said(said, STOPPING)
    return agent


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
    with router(echo_root, run_dir, "--stop-grace", "0") as first:  # 0: the call in flight is cut off at once
        agent = Agent(run_dir, 30, mode)
        open_call(agent)
        first.send_signal(signal.SIGTERM)
        first.wait(DEADLINE)
        told = agent.reply()
        assert told["id"] == 2
        assert "the router restarted while this call was running" in told["error"]["message"]
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


def test_a_stopping_router_lets_the_call_in_flight_finish_and_the_next_serves_what_came_meanwhile(
        echo_root: Path, run_dir: Path, mode: str, tmp_path: Path) -> None:
    """SIGTERM under a call of 2 s: the call finishes and its result reaches the agent; a call the agent sends while
    the router stops is not cut off, nor run by the stopping router, but waits (in the pipe, or in a relaying bridge
    told to keep it) for the next router, which answers it. No request gets an error."""
    said = tmp_path / "first.err"
    with router(echo_root, run_dir, said=said) as first:
        agent = stopped_under_a_call(first, run_dir, mode, said)
        time.sleep(0.2)  # a relaying bridge has heard so
        agent.send(call(4, "echo_say", {"text": "while it stops"}))
        finished = agent.reply()
        assert finished["id"] == 2
        assert finished["result"]["structuredContent"] == {"text": "slept"}, finished
        assert first.wait(DEADLINE) == 0
    assert "cut off" not in said.read_text()
    assert not agent.replied(0.5), "a call was answered while no router ran"
    with router(echo_root, run_dir):
        waited = agent.reply()
        assert waited["id"] == 4
        assert waited["result"]["structuredContent"] == {"text": "while it stops"}, waited
        status, err = agent.finish()
    assert status == 0, err
    assert [reply["id"] for reply in agent.replies] == [1, 3, 2, 4]
    assert not any("error" in reply for reply in agent.replies), agent.replies
    logged = calls_logged(echo_root)
    assert [(entry["tool"], entry["outcome"]) for entry in logged] == [
        ("echo_say", "executed"), ("echo_misbehave", "executed"), ("echo_say", "executed")]


def test_a_bridge_started_while_the_router_stops_gets_its_session_from_the_next_router(
        echo_root: Path, run_dir: Path, mode: str, tmp_path: Path) -> None:
    """An agent's MCP server started during a stop (a call of 4 s still finishing) is turned away as one to attach to
    the next router: it waits, says so, and its initialize is answered by the next router; a plain connection made
    meanwhile is told the router is stopping, for each request it sent, and closed."""
    said = tmp_path / "first.err"
    with router(echo_root, run_dir, said=said) as first:
        running = stopped_under_a_call(first, run_dir, mode, said, seconds=4)
        late = Agent(run_dir, 30, mode)
        late.send(line(INIT))
        late.until_said("handler-service: the router is stopping (a restart or an upgrade); waiting up to 30 s")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as plain:
            plain.connect(str(run_dir / "profiles/tester.sock"))
            plain.sendall(line(INIT) + line({**PING, "id": "p"}))
            told = b""
            while chunk := plain.recv(1 << 16):  # then closed
                told += chunk
        answers = [json.loads(answer) for answer in told.splitlines()]
        assert [answer["id"] for answer in answers] == [1, "p"]
        for answer in answers:
            assert answer["error"]["data"] == {"handler/retry": "later"}
            assert answer["error"]["message"].startswith(
                "the router is stopping (a restart or an upgrade) and takes no new connection, so this request was not "
                "run"), answer
        assert running.reply()["id"] == 2  # the call in flight finished
        assert first.wait(DEADLINE) == 0
    assert not late.replied(0.3), "the stopping router answered the late agent"
    with router(echo_root, run_dir):
        assert late.reply()["result"]["serverInfo"]  # its initialize, answered by the next router
        assert late.request(call(2, "echo_say", {"text": "late"}))["result"]["structuredContent"] == {"text": "late"}
        status, err = late.finish()
        assert running.finish()[0] == 0
    assert status == 0, err
    assert "handler-service: the router is stopping (a restart or an upgrade); waiting up to 30 s" in err
    assert "the router is back; the session begins" in err


# A service between its sockets: it holds the run folder's lock as a service does from its start to its end, and
# serves no profile's socket (yet, or any more).
HOLDS_THE_RUN_FOLDER = """
import sys
from pathlib import Path
from reconciler.liveness import ServiceLock
ServiceLock(Path(sys.argv[1])).acquire(Path(sys.argv[2]))
print("held", flush=True)
sys.stdin.read()
"""


def test_a_bridge_started_while_a_service_starts_waits_for_its_router(echo_root: Path, run_dir: Path, mode: str,
                                                                     tmp_path: Path) -> None:
    """A host starts its MCP server while the service holds the run folder but has no socket open (starting, or
    between a stop and the next start): the bridge waits for the router rather than stopping at once, through the
    moment no service holds it, and the agent's initialize is answered by the router that comes."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / "state").mkdir(mode=0o700)
    with subprocess.Popen([sys.executable, "-c", HOLDS_THE_RUN_FOLDER, str(tmp_path / "state"), str(run_dir)],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        agent = Agent(run_dir, 30, mode)
        agent.send(line(INIT))
        agent.until_said(f"handler-service: the service on {run_dir} is starting (or restarting); waiting up to 30 s")
        holder.communicate("")  # the service is gone: a moment with none
    assert holder.returncode == 0
    time.sleep(0.3)
    with router(echo_root, run_dir):
        assert agent.reply()["result"]["serverInfo"]
        assert agent.request(call(2, "echo_say", {"text": "came"}))["result"]["structuredContent"] == {"text": "came"}
        status, err = agent.finish()
    assert status == 0, err
    assert f"handler-service: the service on {run_dir} is starting (or restarting); waiting up to 30 s" in err


def test_a_line_half_sent_when_the_router_stops_is_served_whole_and_the_next_left_for_the_next_router(
        echo_root: Path, run_dir: Path, mode: str, tmp_path: Path) -> None:
    """The agent has written half of a request when the router begins to stop, and the rest after: the request is
    read to its end (a byte at a time, so nothing after it is taken) and answered; the one after it, sent in the same
    write as that rest, is answered by the next router. Nothing is lost or garbled."""
    said = tmp_path / "first.err"
    with router(echo_root, run_dir, said=said) as first:
        agent = Agent(run_dir, 30, mode)
        assert agent.request(line(INIT))["id"] == 1
        agent.send(call(2, "echo_misbehave", {"mode": "sleep", "seconds": 2}))
        assert agent.request(call(3, "echo_say", {"text": "before"}))["id"] == 3
        halved = call(4, "echo_say", {"text": "in two halves"})
        agent.send(halved[:20])
        time.sleep(0.3)  # the router has read the half
        first.send_signal(signal.SIGTERM)
        wait_until_said(said, STOPPING)
        time.sleep(0.2)  # a relaying bridge has heard so
        agent.send(halved[20:] + call(5, "echo_say", {"text": "after it"}))
        assert agent.reply()["id"] in (2, 4)
        assert first.wait(DEADLINE) == 0
    while agent.replied(0.5):
        agent.reply()  # what the stopping router answered
    stopping_answered = {reply["id"] for reply in agent.replies[2:]}
    with router(echo_root, run_dir):
        while len(agent.replies) < 5:
            agent.reply()
        status, err = agent.finish()
    assert status == 0, err
    by_id = {reply["id"]: reply for reply in agent.replies}
    assert sorted(by_id) == [1, 2, 3, 4, 5]
    assert not any("error" in reply for reply in agent.replies), agent.replies
    assert by_id[4]["result"]["structuredContent"] == {"text": "in two halves"}
    assert by_id[5]["result"]["structuredContent"] == {"text": "after it"}
    # Call 4 is read from the pipe by the stopping router; a relaying bridge, which frames lines itself, keeps it for
    # the next router whole. Call 5 is the next router's either way.
    assert stopping_answered == ({2, 4} if mode == "--handover" else {2})


def test_a_client_that_never_ends_its_line_holds_a_stop_for_its_grace_only(echo_root: Path, run_dir: Path) -> None:
    """A client of the profile's socket writes half a request and nothing more: the stopping router waits for the
    rest for its grace (1 s here), then stops cleanly."""
    with router(echo_root, run_dir, "--stop-grace", "1") as first, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(run_dir / "profiles/tester.sock"))
        client.sendall(line(INIT))
        assert json.loads(client.recv(1 << 16))["id"] == 1
        client.sendall(call(2, "echo_say", {"text": "never ended"})[:25])
        time.sleep(0.3)  # the router has read the half
        began = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(DEADLINE) == 0
        assert 1 <= time.monotonic() - began < 1 + 4
        assert client.recv(1 << 16) == b""  # closed, with nothing said of the half request


def test_a_relaying_bridge_of_an_earlier_version_does_not_hold_a_stop(echo_root: Path, run_dir: Path) -> None:
    """A relaying bridge that never said it pauses (`{"handler/pauses": true}`: one started before an upgrade) is not
    asked to, nor waited for: with no call in flight, the router stops at once rather than after its grace."""
    with router(echo_root, run_dir, "--stop-grace", "5") as first, \
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bridge:
        bridge.connect(str(run_dir / "profiles/tester.sock"))
        bridge.sendall(attach_line({INTERFACE: "echo"}, relay=True))
        assert bridge.recv(1 << 16) == ACCEPTED
        bridge.sendall(line(INIT))
        assert b'"id":1' in bridge.recv(1 << 16)
        began = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(DEADLINE) == 0
        assert time.monotonic() - began < 2.5
        said = b""
        while chunk := bridge.recv(1 << 16):
            said += chunk
    assert b"handler/stopping" not in said
    assert b"handler/ended" not in said  # gone, not over: such a bridge waits for the next router


def test_a_second_signal_stops_at_once_and_the_call_cut_off_is_told_so(echo_root: Path, run_dir: Path,
                                                                       tmp_path: Path) -> None:
    said = tmp_path / "first.err"
    with router(echo_root, run_dir, said=said) as first:
        agent = Agent(run_dir, 30, "--handover")
        open_call(agent)  # call 2 sleeps 30 s, past any grace
        first.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        began = time.monotonic()
        first.send_signal(signal.SIGTERM)
        assert first.wait(DEADLINE) == 0
        assert time.monotonic() - began < 4  # not the 5 s grace
        told = agent.reply()
    assert told["id"] == 2
    assert "the router restarted while this call was running, so it may or may not have run" in \
        told["error"]["message"]
    assert "stopped with 1 call(s) still running: cut off" in said.read_text()
    agent.proc.kill()  # no router comes back: the bridge would wait for one
    agent.proc.communicate(timeout=DEADLINE)


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
