"""Long calls in the TypeScript SDK as hosts make them: kept alive by progress, and cancelled all the way down.

The SDK gives up on a request after 60 s unless progress arrives; it sends a `progressToken` only when the call
passes `onprogress`, and with `resetTimeoutOnProgress` each progress notification starts the 60 s again. The echo
connector holds the call 75 s and sends no progress of its own, so what keeps the call alive is the router's
(docs/router.md "Progress and cancellation"). Aborted at 5 s, the call is cancelled at the connector, which says
so on its stderr (the binding's stderr log), and the call log names the cause. Through the bridge (stdio) and
over Streamable HTTP (SSE).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clients.test_matrix import client_command, logged
from tests.fixtures.matrix import ClientProcess, GovernedService, governed_service, wait_until

HELD_SECONDS = 75  # past the SDK's default request timeout of 60 s
KINDS = ("typescript", "typescript-http")


@pytest.fixture(scope="module")
def service() -> Iterator[GovernedService]:
    with governed_service(limits={"timeoutSeconds": 120}) as running:
        yield running


def start(service: GovernedService, kind: str, instance: str) -> ClientProcess:
    if kind.endswith("-http"):
        return ClientProcess(client_command(kind), service, target=service.url,
                             env={"HANDLER_TEST_BEARER": service.token(instance=instance)})
    return ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": instance})


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_held_past_the_sdks_timeout_completes_kept_alive_by_progress(service: GovernedService,
                                                                           kind: str) -> None:
    client = start(service, kind, f"long-{kind}")
    try:
        began = time.monotonic()
        answer = client.step(op="long", name="echo_misbehave", arguments={"mode": "sleep", "seconds": HELD_SECONDS})
        took = time.monotonic() - began
    finally:
        assert "Traceback" not in client.close()
    assert "raised" not in answer, answer
    assert answer["result"]["structuredContent"] == {"text": "slept"}
    assert took >= HELD_SECONDS
    progress: list[dict[str, Any]] = answer["progress"]
    assert len(progress) >= HELD_SECONDS // 15, progress  # none more than 15 s apart
    assert [p["progress"] for p in progress] == list(range(1, len(progress) + 1))
    assert all(p["message"].startswith("the call is still running (") for p in progress), progress
    assert logged(service, f"long-{kind}", "echo_misbehave")["outcome"] == "executed"


@pytest.mark.parametrize("kind", KINDS)
def test_a_long_call_aborted_at_5_s_is_cancelled_at_the_connector_and_logged(service: GovernedService,
                                                                             kind: str) -> None:
    stderr_log = service.root / ".handler/connectors/echo-local.stderr.log"
    before = stderr_log.read_text().count("echo_misbehave sleep: cancelled") if stderr_log.exists() else 0
    client = start(service, kind, f"cancel-{kind}")
    try:
        answer = client.step(op="long", name="echo_misbehave", arguments={"mode": "sleep", "seconds": HELD_SECONDS},
                             cancelAfter=5000)
        assert "cancelled by the test" in answer.get("raised", ""), answer
        # The connector stopped the call's work: it said so, about 5 s in, long before the call would have ended.
        said = wait_until(lambda: stderr_log.exists() and stderr_log.read_text().count(
            "echo_misbehave sleep: cancelled") > before and stderr_log.read_text(), "the connector's cancellation")
        seconds = float(said.rsplit("echo_misbehave sleep: cancelled ", 1)[1].split(" after ")[1].split(" s")[0])
        assert 4.0 <= seconds < 20.0, said
        line = logged(service, f"cancel-{kind}", "echo_misbehave")
        assert (line["outcome"], line["cause"]) == ("cancelled", "cancelled"), line
        # The client goes on: its next call is answered.
        assert client.call("echo_say", {"text": "after"})["structuredContent"] == {"text": "after"}
    finally:
        assert "Traceback" not in client.close()
