"""Progress and cancellation of a long call on a profile's socket, with the real echo connector behind the router.

The connector's own `notifications/progress` reach the client under the client's token; where it sends none, the
router sends its own while the call runs; a client that gave no token hears nothing; a cancelled call is cancelled
at the connector, which stops, and is logged and charged as a call that may have reached the provider.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from reconciler.router import progress
from tests.fixtures.harness import DEADLINE, RawClient, log_lines, log_text, run, serving


async def _until_reply(client: RawClient, msg_id: int | str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every message before the reply to `msg_id`, and that reply."""
    before = []
    while (message := await client.recv()).get("id") != msg_id:
        before.append(message)
    return before, message


def _call(msg_id: int | str, arguments: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
            "params": {"name": "echo_misbehave", "arguments": arguments, "_meta": meta}}


def test_the_connectors_progress_reaches_the_client_under_its_token(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send(_call(1, {"mode": "sleep", "seconds": 0.5, "progress": 0.1}, progressToken="the-clients"))
            notes, reply = await _until_reply(c, 1)
            assert reply["result"]["structuredContent"] == {"text": "slept"}
            assert notes, "no progress reached the client"
            assert {n["method"] for n in notes} == {"notifications/progress"}
            assert {n["params"]["progressToken"] for n in notes} == {"the-clients"}  # never the router's own token
            steps = [n["params"]["progress"] for n in notes]
            assert steps == list(range(1, len(steps) + 1)), steps  # the connector's numbers, in its order
            assert notes[0]["params"]["total"] == 5.0
            assert notes[0]["params"]["message"] == "step 1"
            assert (await c.request("ping"))["result"] == {}  # nothing came after the reply
            await c.close()

    run(scenario())


def test_the_router_sends_its_own_progress_while_a_silent_call_runs(echo_root: Path, run_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "FIRST_BEAT_SECONDS", 0.2)
    monkeypatch.setattr(progress, "BEAT_SECONDS", 0.2)

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            c = await RawClient.connect(router.socket_path("tester"))
            await c.send(_call("asks", {"mode": "sleep", "seconds": 1.2}, progressToken=7))
            notes, reply = await _until_reply(c, "asks")
            assert reply["result"]["structuredContent"] == {"text": "slept"}
            assert len(notes) >= 3, notes
            assert all(n["params"]["progressToken"] == 7 for n in notes)
            assert [n["params"]["progress"] for n in notes] == list(range(1, len(notes) + 1))
            assert notes[0]["params"]["message"].startswith("the call is still running (")

            await c.send(_call("silent", {"mode": "sleep", "seconds": 0.7}))  # no token: no progress
            notes, reply = await _until_reply(c, "silent")
            assert notes == []
            assert reply["result"]["structuredContent"] == {"text": "slept"}
            await c.close()

    run(scenario())


def test_a_cancelled_call_stops_at_the_connector_and_is_charged_and_logged(echo_root: Path, run_dir: Path,
                                                                           tmp_path: Path) -> None:
    binding = echo_root / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace("echo_say = 0.001", "echo_say = 0.001\necho_misbehave = 0.02"))
    seen = tmp_path / "cancelled.txt"

    async def scenario() -> None:
        async with serving(echo_root, run_dir, sandbox=False) as router:  # it writes the test's file
            c = await RawClient.connect(router.socket_path("tester"))
            await c.call("echo_say", {"text": "started"})  # its process runs: a call counted is a call sent
            await c.send(_call(1, {"mode": "sleep", "seconds": 30, "paths": [str(seen)]},
                               **{"progressToken": "t", "handler/instance": "i-cancel"}))
            while not router.services.limits.running(("tester", "i-cancel", "echo/v1")):
                await asyncio.sleep(0.01)
            await c.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}})
            assert (await c.request("ping"))["result"] == {}  # no reply to the cancelled call
            async with asyncio.timeout(DEADLINE):
                while not seen.exists() or '"cancelled"' not in log_text(router):
                    await asyncio.sleep(0.01)
            assert seen.read_text().startswith("echo_misbehave sleep: cancelled ")  # the connector saw it, and stopped
            line = log_lines(router)[-1]
            assert (line["outcome"], line["cause"], line["cost"]) == ("cancelled", "cancelled", 0.02)
            await c.close()

    run(scenario())



def test_a_connectors_progress_message_reaches_the_client_cut_short() -> None:
    """A connector's words go to the client as they are, but one of megabytes is cut (its line holds 16 MiB)."""
    written: list[bytes] = []

    async def scenario() -> None:
        told = progress.Progress("tok", written.append)
        told.relay({"progress": 1, "message": "page 1 of 3"})
        told.relay({"progress": 2, "message": "x" * 100_000})
        told.relay({"progress": "3"})  # not a number: dropped
        await asyncio.sleep(0)  # relayed notes are written on the loop's next turn
        told.end()

    asyncio.run(scenario())
    notes = [orjson.loads(line)["params"] for line in written]
    assert [n["progress"] for n in notes] == [1, 2]
    assert notes[0]["message"] == "page 1 of 3"
    assert len(notes[1]["message"]) == progress.MAX_MESSAGE_CHARS + 1
