"""Hostile clients of a profile's socket: none can grow the router without bound (docs/architecture.md §6).

Each attack is a named test against one `handler serve` per mode, as root and as an unprivileged
user (nobody), the routers of `tests/fixtures/hostile/routers.py`. The client floods `tools/list`
lines from its first byte for `FLOOD_SECONDS` and never reads a reply, on a line connection and on
the bridge's handoff (the agent's stdin and stdout handed over). The router's resident memory is
sampled throughout: before, at its highest and once the client has gone are printed, and must stay
within `GROWTH_MB` of the start and come back within `LEFT_MB` of it.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

import pytest

from reconciler.router.handoff import attach_line
from tests.fixtures.flood import flood_lines, rss_mb
from tests.fixtures.hostile.routers import HostileRouter

FLOOD_SECONDS = 10.0
GROWTH_MB = 100.0  # the highest the router may grow while flooded
LEFT_MB = 20.0  # how far from where it started it must come back once the client is gone
DEADLINE = 30.0

pytestmark = pytest.mark.timeout(600)


def flood_and_measure(router: HostileRouter, name: str, send: Callable[[bytes], int], close: Callable[[], None]) -> str:
    """Flood with `send` for FLOOD_SECONDS, `close`, wait for the router to let go; asserts the bounds, and returns
    the evidence line (also printed)."""
    before = rss_mb(router.pid)
    peak = [before]
    next_sample = [0.0]

    def sample() -> None:
        if time.monotonic() >= next_sample[0]:
            peak.append(rss_mb(router.pid))
            next_sample[0] = time.monotonic() + 0.1

    try:
        sent = flood_lines(send, FLOOD_SECONDS, sample)
    finally:
        close()
    after = rss_mb(router.pid)
    deadline = time.monotonic() + DEADLINE
    while after > before + LEFT_MB and time.monotonic() < deadline:
        time.sleep(0.1)  # the router sees the close and frees what the connection held
        after = rss_mb(router.pid)
    evidence = (f"{name} as {router.mode}: router RSS before {before:.0f} MB, highest {max(peak):.0f} MB "
                f"(+{max(peak) - before:.0f} MB), after the client went {after:.0f} MB ({after - before:+.0f} MB); "
                f"the router took {sent / 1e6:.2f} MB of requests in {FLOOD_SECONDS:g} s")
    print(evidence)
    assert router.proc.poll() is None, router.log_tail()
    assert max(peak) <= before + GROWTH_MB, evidence
    assert after <= before + LEFT_MB, evidence
    return evidence


def test_a_client_flooding_from_its_first_byte_cannot_grow_the_router(router: HostileRouter) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(router.run_dir / "profiles/attacker.sock"))
    sock.setblocking(False)
    flood_and_measure(router, "flood from the first byte", sock.send, sock.close)


def test_an_attached_agent_flooding_from_its_first_byte_cannot_grow_the_router(router: HostileRouter) -> None:
    """The bridge's handoff: the router reads the agent's stdin and writes its stdout itself."""
    router_in, agent_in = os.pipe()
    agent_out, router_out = os.pipe()
    os.set_blocking(agent_in, False)
    flood_lines(lambda data: os.write(agent_in, data), 0.1)  # the agent writes before the bridge hands its stdin over
    lifeline = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lifeline.connect(str(router.run_dir / "profiles/attacker.sock"))
    socket.send_fds(lifeline, [attach_line({"handler/interface": "hostile"})], [router_in, router_out])
    os.close(router_in)
    os.close(router_out)
    lifeline.settimeout(DEADLINE)
    assert b'"handler/attached":true' in lifeline.recv(4096)

    def close() -> None:
        for fd in (agent_in, agent_out):
            os.close(fd)
        lifeline.close()

    flood_and_measure(router, "attached flood from the first byte", lambda data: os.write(agent_in, data), close)
