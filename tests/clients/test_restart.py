"""The router is stopped and started again under an open stdio session of each client: the session goes on.

Each client (the TypeScript SDK, the Python SDK 1.x, 2.x in both eras, and openai-agents with every server
`handler mcp-config` writes for the profile) runs `handler-service` as its MCP server. The service (`handler up`
on the governed tree: the router, the reconciler following the tree, the dashboard) is stopped with SIGTERM, as a
service manager stops it for an upgrade, while the client waits on a call the connector holds; then started
again. A short call finishes across the stop, and its client sees nothing of it (docs/router.md "Stopping"); one
the stop cuts off (a second SIGTERM) gets one error, which names the restart. Either way the client's next call
succeeds in the same session: no client reconnects or initializes again (docs/router.md "Restarts"). Over
Streamable HTTP (the TypeScript SDK and the Python SDK 2.x in 2025-11-25 sessions) the service comes back on the
same address, and the client's resume of a cut-off call's stream gets that call's error from the new router
(docs/router.md "A stream the client lost"). A client started during a stop, or over HTTP between two routers on a port
the service manager holds (docs/scaling.md), is served by the next router.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.clients.test_matrix import STDIO_KINDS, client_command, logged
from tests.fixtures.http_service import waiting_connections
from tests.fixtures.matrix import (
    ClientProcess,
    GovernedService,
    HostProcess,
    governed_service,
    host_command,
    profile_config,
    wait_until,
)

RESTARTED = "the router restarted while this call was running, so it may or may not have run"
HELD = {"mode": "sleep", "seconds": 60}
SHORT = {"mode": "sleep", "seconds": 2}  # well within the stop's grace (5 s)
LONGER = {"mode": "sleep", "seconds": 4}  # still within it, long enough for a client to start meanwhile
STOPPED_WAIT = "handler-service: the router is stopping (a restart or an upgrade); waiting up to"
REACHED_SECONDS = 2.0  # ample for the call to reach the connector: the router is stopped while it runs there
LOST = "the router that was running this call restarted (or this request reached another router)"
STREAMED_SECONDS = 6.5  # past the 5 s after which a call over HTTP answers as a stream, with an event to resume from


@pytest.fixture(scope="module")
def service() -> Iterator[GovernedService]:
    with governed_service(command="up") as running:
        yield running


def the_restart_error(answer: dict[str, Any], told: str = RESTARTED) -> None:
    """The client raised on the call in flight, with the error `told` begins (the bridge's, by default): what
    happened and what to do."""
    assert told in answer.get("raised", ""), answer
    assert "handler_status" in answer["raised"], answer


def cut_off_and_on(client: ClientProcess, service: GovernedService, instance: str, *, wait: float = REACHED_SECONDS,
                   kill: bool = False, told: str = RESTARTED) -> None:
    """A call, then one the service's restart cuts off `wait` seconds in (a second SIGTERM; SIGKILL with `kill`),
    answered with `told`; then the next call of the same session runs, and is logged, on the service started again."""
    assert client.call("echo_say", {"text": "before"})["structuredContent"] == {"text": "before"}
    client.send(op="call", name="echo_misbehave", arguments=HELD)
    time.sleep(wait)
    service.restart(kill=kill, now=True)
    the_restart_error(client.answer(), told)
    after = client.call("echo_say", {"text": "after the restart"})
    assert after["structuredContent"] == {"text": "after the restart"}
    assert logged(service, instance, "echo_say")["outcome"] == "executed"


@pytest.mark.parametrize("kind", STDIO_KINDS)
def test_a_restart_under_an_open_session_answers_the_call_in_flight_once_and_the_session_goes_on(
        service: GovernedService, kind: str) -> None:
    client = ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": f"restart-{kind}"})
    try:
        cut_off_and_on(client, service, f"restart-{kind}")
        assert client.listed()["tools"]  # what it listed at the start is still what it uses: no new session
    finally:
        err = client.close()
    assert "Traceback" not in err, err
    assert "handler-service: the router is back; the session goes on" in err


@pytest.mark.parametrize("kind", [*STDIO_KINDS, "typescript-http", "python-sdk-2-legacy-http"])
def test_a_call_in_flight_at_a_restart_finishes_and_the_client_sees_nothing_of_the_restart(
        service: GovernedService, kind: str) -> None:
    """SIGTERM half a second into a call of 2 s: the service lets it finish before it stops, so the client gets the
    call's result, then its next call runs on the service started again, in the same session."""
    http = kind.endswith("-http")
    instance = f"finish-{kind}"
    client = (ClientProcess(client_command(kind), service, target=service.url,
                            env={"HANDLER_TEST_BEARER": service.token(instance=instance)}) if http
              else ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": instance}))
    try:
        client.send(op="call", name="echo_misbehave", arguments=SHORT)
        time.sleep(0.5)
        service.restart()
        answer = client.answer()
        assert "raised" not in answer, answer
        assert answer["result"]["structuredContent"] == {"text": "slept"}, answer
        assert client.call("echo_say", {"text": "after"})["structuredContent"] == {"text": "after"}
        assert logged(service, instance, "echo_misbehave")["outcome"] == "executed"
    finally:
        err = client.close()
    assert "Traceback" not in err, err


@pytest.mark.parametrize("kind", STDIO_KINDS)
def test_a_client_started_while_the_service_stops_gets_its_session_from_the_next_router(
        service: GovernedService, kind: str) -> None:
    """A host starts its MCP server while the service stops (a call of 4 s still finishing): the bridge is told to
    wait for the next router, and the client's initialize and first call are served there, with its defaults."""
    busy = ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": f"busy-{kind}"})
    late: list[ClientProcess] = []

    def start_late() -> None:
        late.append(ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": f"late-{kind}"},
                                  listing=False))
        wait_until(lambda: STOPPED_WAIT in "".join(late[0].said), "the late client's bridge waiting")

    busy.send(op="call", name="echo_misbehave", arguments=LONGER)
    time.sleep(0.5)
    service.restart(during=start_late)
    client = late[0]
    try:
        assert busy.answer()["result"]["structuredContent"] == {"text": "slept"}
        assert client.listed()["tools"]
        assert client.call("echo_say", {"text": "late"})["structuredContent"] == {"text": "late"}
        assert logged(service, f"late-{kind}", "echo_say")["outcome"] == "executed"
    finally:
        err = client.close()
        busy.close()
    assert "Traceback" not in err, err
    assert "handler-service: the router is back; the session begins" in err, err


@pytest.fixture(scope="module")
def held_service() -> Iterator[GovernedService]:
    """`handler up` on a port held across its restarts, as systemd's socket activation holds it (docs/scaling.md)."""
    with governed_service(command="up", held_port=True) as running:
        yield running


@pytest.mark.parametrize("kind", ["typescript-http", "python-sdk-2-legacy-http", "python-sdk-2-auto-http"])
def test_an_http_client_started_while_no_router_runs_on_a_held_port_is_served_by_the_next(
        held_service: GovernedService, kind: str) -> None:
    """A client over HTTP starts between two routers, its port held by the service manager: its first request waits in
    the kernel's queue (seen there before the next router starts), and the next router serves it and the calls after,
    with the client's default settings. On a port of the router's own, that request would meet a closed port."""
    token = held_service.token(instance=f"gap-{kind}")
    late: list[ClientProcess] = []

    def start_late() -> None:
        late.append(ClientProcess(client_command(kind), held_service, target=held_service.url,
                                  env={"HANDLER_TEST_BEARER": token}, listing=False))
        wait_until(lambda: waiting_connections(held_service.port) > 0, "the late client's connection in the queue")

    held_service.restart(between=start_late)
    client = late[0]
    try:
        assert client.listed()["tools"]
        assert client.call("echo_say", {"text": "from the gap"})["structuredContent"] == {"text": "from the gap"}
        assert logged(held_service, f"gap-{kind}", "echo_say")["outcome"] == "executed"
    finally:
        err = client.close()
    assert "Traceback" not in err, err


def test_openai_agents_with_every_server_of_the_profile_goes_on_after_a_restart(service: GovernedService,
                                                                               tmp_path: Path) -> None:
    host = HostProcess(host_command("openai-agents"), profile_config(service, tmp_path), service.env)
    try:
        assert host.call("parrot", "parrot_say", {"text": "before"})["structuredContent"] == {"text": "before"}
        host.send(op="call", server="echo", name="echo_misbehave", arguments=HELD)
        time.sleep(REACHED_SECONDS)
        service.restart(now=True)
        the_restart_error(host.answer())
        # Every server's session goes on: the one whose call was cut, and those that were idle.
        assert host.call("echo", "echo_say", {"text": "after"})["structuredContent"] == {"text": "after"}
        assert host.call("parrot", "parrot_say", {"text": "after"})["structuredContent"] == {"text": "after"}
        status = host.call("handler", "handler_status", {"request_id": "req_nothing"})
        assert status["structuredContent"]["status"] == "unknown"
    finally:
        said = host.close()
    assert "Traceback" not in said, said
    assert said.count("handler-service: the router is back; the session goes on") == 3, said


@pytest.mark.parametrize("kind", ["typescript-http", "python-sdk-2-legacy-http"])
def test_a_restart_under_a_call_over_http_answers_it_when_the_client_resumes_and_the_session_goes_on(
        service: GovernedService, kind: str) -> None:
    """Over Streamable HTTP (2025-11-25 sessions: a call's stream opens with an event the client resumes from), the
    service stopped and started again on the same address while the client waits on a call: the client resumes the
    call's stream from the new router, which never held it, and the call ends with the error naming the lost call
    and what to do; the next call of the same session runs there."""
    client = ClientProcess(client_command(kind), service, target=service.url,
                           env={"HANDLER_TEST_BEARER": service.token(instance=f"restart-{kind}")})
    try:
        cut_off_and_on(client, service, f"restart-{kind}", wait=STREAMED_SECONDS, told=LOST)
    finally:
        err = client.close()
    assert "Traceback" not in err, err


@pytest.mark.parametrize("kind", ["typescript", "python-sdk-2-auto"])
def test_a_crash_under_an_open_session_answers_the_call_in_flight_once_and_the_session_goes_on(
        service: GovernedService, kind: str) -> None:
    """`handler up` killed (SIGKILL: a crash, nothing of it runs after) while the client waits on a call: the bridge
    answers that call once, and the next call of the same session runs on the service started again."""
    client = ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": f"crash-{kind}"})
    try:
        cut_off_and_on(client, service, f"crash-{kind}", kill=True)
    finally:
        err = client.close()
    assert "Traceback" not in err, err
    assert "handler-service: the router is back; the session goes on" in err
