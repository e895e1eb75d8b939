"""Reading a fast connector's reply as it comes (`connectors.polling`): only the router's one call in flight waits
so, a connector that keeps missing the window is left alone, and every reply arrives whole and once, whether the
window caught it or the event loop did."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from reconciler.connectors.client import ConnectorProcess
from reconciler.connectors.errors import ConnectorCrashedError, ConnectorOutputTooLargeError
from reconciler.connectors.polling import DEFAULT_WINDOW_US, Polling, ReplyPoll, window_from_env
from tests.connectors.test_client import _chatty, spec
from tests.fixtures.harness import run

REPLY = b'{"jsonrpc":"2.0","id":1,"result":{}}\n'


class _Pipe:
    """A connector's output as a real pipe, read by a `ReplyPoll` that hands what it reads to `got`."""

    def __init__(self, polling: Polling) -> None:
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        self.got: list[bytes] = []
        self.future: asyncio.Future[None] | None = None
        self.poll = ReplyPoll(polling, self.read_fd, self._feed)

    def _feed(self, data: bytes) -> None:
        self.got.append(data)
        if self.future is not None and b"\n" in data:
            self.future.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        self.future = asyncio.get_running_loop().create_future()
        self.poll.wait(self.future)
        return self.future

    def left(self) -> bytes:
        try:
            return os.read(self.read_fd, 1 << 16)
        except BlockingIOError:
            return b""

    def close(self) -> None:
        for fd in (self.read_fd, self.write_fd):
            os.close(fd)


def _one_call_in_flight() -> Polling:
    polling = Polling(DEFAULT_WINDOW_US)
    if not polling.on:
        pytest.fail("reply polling is off on a machine with several CPUs")
    polling.calls = 1
    return polling


def test_a_reply_written_within_the_window_is_handled_before_the_call_awaits() -> None:
    async def scenario() -> None:
        pipe = _Pipe(_one_call_in_flight())
        try:
            os.write(pipe.write_fd, REPLY)
            assert pipe.wait().done()
            assert b"".join(pipe.got) == REPLY
        finally:
            pipe.close()

    run(scenario())


def test_with_another_call_in_flight_the_reply_is_left_to_the_event_loop() -> None:
    async def scenario() -> None:
        polling = _one_call_in_flight()
        polling.calls = 2
        pipe = _Pipe(polling)
        try:
            os.write(pipe.write_fd, REPLY)
            assert not pipe.wait().done()
            assert pipe.left() == REPLY  # untouched: the loop's transport reads it
        finally:
            pipe.close()

    run(scenario())


def test_a_connector_that_misses_the_window_is_left_alone_for_the_next_calls() -> None:
    async def scenario() -> None:
        pipe = _Pipe(_one_call_in_flight())
        try:
            assert not pipe.wait().done()  # nothing came within the window: a miss
            os.write(pipe.write_fd, REPLY)
            for _ in range(16):  # the next 16 calls are not polled: their replies wait for the loop
                assert not pipe.wait().done()
            assert pipe.left() == REPLY
            os.write(pipe.write_fd, REPLY)
            assert pipe.wait().done()  # then it is polled again
        finally:
            pipe.close()

    run(scenario())


def test_the_end_of_the_output_is_left_for_the_transport() -> None:
    async def scenario() -> None:
        pipe = _Pipe(_one_call_in_flight())
        os.close(pipe.write_fd)
        try:
            assert not pipe.wait().done()
            assert pipe.got == []
            assert os.read(pipe.read_fd, 10) == b""  # the end is still there to read
        finally:
            os.close(pipe.read_fd)

    run(scenario())


def test_a_router_on_one_cpu_does_not_poll() -> None:
    """The connector would wait for the CPU the router spins on."""
    everywhere = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(everywhere)})
    try:
        assert not Polling(DEFAULT_WINDOW_US).on
    finally:
        os.sched_setaffinity(0, everywhere)


def test_calls_to_a_real_connector_with_polling_answer_whole_and_once(tmp_path: Path) -> None:
    """Sequential calls (polled), concurrent ones (not), a slow reply (a miss), a crash and an oversize reply."""
    async def scenario() -> None:
        polling = Polling(DEFAULT_WINDOW_US)
        conn = ConnectorProcess(spec(), polling=polling)
        chatty = ConnectorProcess(_chatty(tmp_path), polling=polling)
        try:
            for n in range(200):
                assert (await conn.call_tool("echo_say", {"text": str(n)}))["structuredContent"] == {"text": str(n)}
            together = await asyncio.gather(*(conn.call_tool("echo_say", {"text": str(n)}) for n in range(20)))
            assert [r["structuredContent"]["text"] for r in together] == [str(n) for n in range(20)]
            slept = await conn.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 0.05})
            assert slept["structuredContent"] == {"text": "slept"}
            with pytest.raises(ConnectorOutputTooLargeError):
                await chatty.call_tool("x", {"big": True})
            assert (await chatty.call_tool("x", {}))["structuredContent"] == {"text": "ok"}
            with pytest.raises(ConnectorCrashedError):
                await conn.call_tool("echo_misbehave", {"mode": "die"})
            assert (await conn.call_tool("echo_say", {"text": "back"}))["structuredContent"] == {"text": "back"}
            await asyncio.sleep(0)
            assert polling.calls == 0  # every call counted out again
        finally:
            await conn.stop()
            await chatty.stop()

    run(scenario())


# The last: a fullwidth five, which str.isdigit() takes.
@pytest.mark.parametrize("value", ["abc", "-5", "1e3", "99999999", "\uff15"])
def test_a_window_that_is_not_microseconds_is_refused_saying_what_to_write(value: str) -> None:
    with pytest.raises(ValueError, match=r"HANDLER_REPLY_POLL_US=.* is not a number of microseconds from 0 to"):
        window_from_env({"HANDLER_REPLY_POLL_US": value})


def test_the_window_is_the_default_unless_set_and_zero_turns_polling_off() -> None:
    assert window_from_env({}) == DEFAULT_WINDOW_US
    assert window_from_env({"HANDLER_REPLY_POLL_US": " 250 "}) == 250
    assert not Polling(window_from_env({"HANDLER_REPLY_POLL_US": "0"})).on
