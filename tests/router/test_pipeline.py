"""The call's steps 2-10 against a real connector process: validation, error mapping, the governance seam."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import pytest

from reconciler.config.snapshot import Snapshot
from reconciler.governance.gate import Admission, CallRequest, HoldStatus, OpenGate, Settlement
from reconciler.router.server import Router
from tests.fixtures.echo_tree import TOKEN_ENV, add_other_binding
from tests.fixtures.harness import RawClient, body, exchange, log_lines, log_text


def test_invalid_arguments_say_where_and_why(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_say", {"text": 5, "colour": "red"})
        assert result["isError"] is True
        told = body(result)
        assert told["error"] == "invalid_arguments"
        assert "at /text: 5 is not of type \"string\"" in told["message"]
        assert "'colour' was unexpected" in told["message"]
        missing = body(await c.call("echo_say", {}))["message"]
        assert "\"text\" is a required property" in missing
        assert log_lines(router)[-1]["error"] == "invalid_arguments"

    exchange(echo_root, run_dir, script)


def _deep_call(depth: int) -> bytes:
    """A tools/call whose argument nests `depth` arrays (built by hand: serializers stop at 255 levels)."""
    return (b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_say","arguments":{"text":'
            + b"[" * depth + b"]" * depth + b"}}}\n")


@pytest.mark.parametrize("depth", [300, 1000])
def test_arguments_nested_too_deep_are_invalid_arguments_not_an_internal_error(echo_root: Path, run_dir: Path,
                                                                             depth: int) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.send_bytes(_deep_call(depth))
        reply = await c.recv()
        assert "error" not in reply, reply  # a tool error the model can read, never a protocol failure
        told = body(reply["result"])
        assert told["error"] == "invalid_arguments"
        assert "nested too deeply" in told["message"]
        assert body(await c.call("echo_say", {"text": "still here"})) == {"text": "still here"}

    exchange(echo_root, run_dir, script)


def test_a_message_nested_past_the_parser_limit_is_a_parse_error_and_the_session_lives_on(echo_root: Path,
                                                                                          run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.send_bytes(_deep_call(5000))
        reply = await c.recv()
        assert reply["error"]["code"] == -32700
        assert "deeper than 1024 levels" in reply["error"]["message"]
        assert body(await c.call("echo_say", {"text": "still here"})) == {"text": "still here"}

    exchange(echo_root, run_dir, script)


@pytest.mark.parametrize("number", [b"1e400", b"-1e400", b"1" + b"0" * 400])
def test_a_number_past_a_double_is_a_parse_error_that_says_so(echo_root: Path, run_dir: Path, number: bytes) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.send_bytes(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"echo_say",'
                           b'"arguments":{"text":' + number + b"}}}\n")
        reply = await c.recv()
        assert reply["error"]["code"] == -32700
        message = reply["error"]["message"]
        assert "not valid JSON" not in message
        assert "a number out of range at column 95" in message
        assert "send it as a string" in message
        assert body(await c.call("echo_say", {"text": "still here"})) == {"text": "still here"}

    exchange(echo_root, run_dir, script)


def test_an_unknown_tool_is_an_error_result_that_lists_the_tools(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("ocr_extract", {})
        assert result["isError"] is True
        assert "structuredContent" not in result
        told = body(result)
        assert told["error"] == "invalid_arguments"
        assert told["message"].startswith("unknown tool 'ocr_extract'; this session serves: echo_say, ")
        assert log_lines(router)[-1]["outcome"] == "refused"
        assert log_lines(router)[-1]["error"] == "unknown_tool"

    exchange(echo_root, run_dir, script)


@pytest.mark.parametrize(("mode", "code", "cause"), [
    ("extra", "unavailable", "output_invalid"),
    ("wrong_type", "unavailable", "output_invalid"),
    ("no_structured", "unavailable", "output_invalid"),
    ("die", "unavailable", "crashed"),
    ("rpc_error", "unavailable", "connector_error"),
    ("bad_code", "unavailable", "undeclared_error"),
    ("error", "empty_text", None),
])
def test_connector_failures_map_onto_the_closed_list(echo_root: Path, run_dir: Path, mode: str, code: str,
                                                     cause: str | None) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_misbehave", {"mode": mode})
        assert result["isError"] is True
        assert body(result)["error"] == code
        assert result["_meta"].get("handler/cause") == cause
        line = log_lines(router)[-1]
        assert (line["outcome"], line["error"], line.get("cause")) == ("error", code, cause)
        # The connector process is restarted after a crash; the session goes on either way.
        assert body(await c.call("echo_say", {"text": "next"})) == {"text": "next"}

    exchange(echo_root, run_dir, script)


def test_a_declared_error_s_message_reaches_the_model_cut_at_2000_characters_saying_so(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        told = body(await c.call("echo_misbehave", {"mode": "long_error"}))
        assert told["error"] == "empty_text"
        assert told["message"] == "M" * 2000 + f"… (cut: the service's message was {4 << 20} characters long)"

    exchange(echo_root, run_dir, script)


def test_an_output_mismatch_logs_the_field_never_the_value(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        await c.call("echo_misbehave", {"mode": "extra"})
        await c.call("echo_misbehave", {"mode": "wrong_type"})
        extra, wrong = log_lines(router)[-2:]
        assert (extra["field"], extra["keyword"]) == ("/secretExtra", "additionalProperties")
        assert (wrong["field"], wrong["keyword"]) == ("/text", "type")
        text = log_text(router)
        assert "VALUE-NEVER-LOGGED" not in text
        assert "12345" not in text

    exchange(echo_root, run_dir, script)


def test_unexpected_output_names_are_logged_as_the_first_cut_short_and_how_many_more(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    """The log names the field, never the value, and stays a line: a thousand names of 300 characters each joined
    made a line of 300 kB (the names are the connector's to choose, and may carry what the output holds)."""
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_misbehave", {"mode": "many_extra"})
        assert result["_meta"]["handler/cause"] == "output_invalid"
        line = log_lines(router)[-1]
        assert line["keyword"] == "additionalProperties"
        assert line["field"] == "/unexpected-0000-" + "k" * 83 + "… and 999 more"
        assert len(log_text(router).splitlines()[-1]) < 1000

    exchange(echo_root, run_dir, script)


_NODE = {"type": "object", "additionalProperties": False,
         "properties": {"text": {"type": "string"}, "n": {"type": "number"}, "c": {"$ref": "#/$defs/node"}}}
DEEP_TOOL = {
    "name": "echo_deep",
    "description": "Answer an output nested as deep as asked.",
    "inputSchema": {"type": "object", "additionalProperties": False, "required": ["depth"],
                    "properties": {"depth": {"type": "integer", "minimum": 1},
                                   "leaf": {"enum": ["text", "nan", "huge"]}}},
    "outputSchema": {"$defs": {"node": _NODE}, **_NODE},
    "annotations": {"readOnlyHint": True},
}


@pytest.mark.parametrize(("args", "field"), [
    ({"depth": 129}, "(nested deeper than 128 levels)"),  # a recursive outputSchema allows it
    ({"depth": 300}, "(nested deeper than 128 levels)"),  # orjson serializes no deeper than 254: an internal error
    ({"depth": 1100}, "(a reply nested deeper than 1024 levels)"),  # past the parser: the call waited its timeout
    ({"depth": 1, "leaf": "nan"}, "(a reply that is not JSON)"),  # what Python's json.dumps writes
    ({"depth": 1, "leaf": "huge"}, "(a reply holding a number past a 64-bit float)"),
])
def test_an_output_too_deep_or_not_json_is_output_invalid_at_once_and_never_logged(
        echo_root: Path, run_dir: Path, caplog: pytest.LogCaptureFixture, args: dict[str, Any], field: str) -> None:
    tools_json = echo_root / "catalog/interfaces/echo/v1/tools.json"
    tools_json.write_text(json.dumps([*json.loads(tools_json.read_text()), DEEP_TOOL]))

    async def script(c: RawClient, router: Router) -> None:
        assert body(await c.call("echo_deep", {"depth": 128})) is not None  # as deep as an output may be
        started = time.monotonic()
        result = await c.call("echo_deep", args)
        assert time.monotonic() - started < 5  # not the interface's timeout of 10 s
        assert (body(result)["error"], result["_meta"]["handler/cause"]) == ("unavailable", "output_invalid")
        assert "does not match the interface" in body(result)["message"]
        line = log_lines(router)[-1]
        assert (line["cause"], line["field"]) == ("output_invalid", field)
        assert body(await c.call("echo_say", {"text": "next"})) == {"text": "next"}  # the process lives on

    exchange(echo_root, run_dir, script)
    assert "REPLY-CONTENT" not in caplog.text
    assert "Traceback" not in caplog.text


def test_the_connector_reported_cost_is_settled(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_misbehave", {"mode": "cost"})
        assert result["_meta"]["handler/cost"] == 0.25
        assert log_lines(router)[-1]["cost"] == 0.25

    exchange(echo_root, run_dir, script)


class RecordingGate(OpenGate):
    """A gate that answers with a chosen status and records what the pipeline asked of it."""

    def __init__(self, status: Literal["executed", "pending", "blocked"]) -> None:
        self.status_to_give = status
        self.admitted: list[CallRequest] = []
        self.settled: list[tuple[Admission, float | None, bool]] = []
        self.asked: list[tuple[str, str]] = []

    async def admit(self, snapshot: Snapshot, call: CallRequest) -> Admission:
        self.admitted.append(call)
        return Admission(self.status_to_give, f"test gate says {self.status_to_give}",
                         request_id="req-1" if self.status_to_give == "pending" else None)

    async def settle(self, admission: Admission, actual_cost: float | None, ok: bool) -> Settlement:
        self.settled.append((admission, actual_cost, ok))
        return Settlement(charged=actual_cost or 0.0, remaining=9.5)

    async def status(self, request_id: str, caller: CallRequest) -> HoldStatus:
        self.asked.append(("status", request_id))
        return HoldStatus("executed", "ran", {"text": "held result"})

    async def decide(self, request_id: str, decision: Literal["approve", "reject"], caller: CallRequest,
                     reason: str | None = None) -> HoldStatus:
        self.asked.append((decision, request_id))
        return HoldStatus("blocked", "only the parent instance may decide")

    async def waiting(self, caller: CallRequest) -> list[Mapping[str, Any]]:
        return []

    def report_unready(self, snapshot: Snapshot, binding: str, cause: str, message: str) -> None:
        self.asked.append((cause, binding))


def test_the_governance_seam_admits_then_settles(echo_root: Path, run_dir: Path) -> None:
    gate = RecordingGate("executed")

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_say", {"text": "t"}, _meta={"handler/instance": "i-9",
                                                                "handler/parentInstance": "p-1"})
        assert result["_meta"] == {"handler/status": "executed", "handler/cost": 0.001, "handler/budget": 9.5}
        call = gate.admitted[0]
        assert (call.profile, call.instance, call.parent_instance) == ("tester", "i-9", "p-1")
        assert (call.interface, call.tool, call.binding, call.estimated_cost) == ("echo/v1", "echo_say",
                                                                                  "echo-local", 0.001)
        assert call.arguments == {"text": "t"}
        assert gate.settled == [(gate.settled[0][0], 0.001, True)]
        await c.call("echo_misbehave", {"mode": "error"})
        assert gate.settled[-1][1:] == (None, False)  # a call its connector answered with an error: released
        await c.call("echo_misbehave", {"mode": "die"})
        assert gate.settled[-1][1:] == (0.0, False)  # gone mid-call: failed, charged its price (none here)
        await c.call("echo_say", {"text": 1})
        assert len(gate.admitted) == 3  # invalid arguments end the call before governance

    exchange(echo_root, run_dir, script, gate=gate)


@pytest.mark.parametrize("status", ["pending", "blocked"])
def test_a_hold_or_a_block_never_reaches_the_connector(echo_root: Path, run_dir: Path, status: Any) -> None:
    gate = RecordingGate(status)

    async def script(c: RawClient, router: Router) -> None:
        result = await c.call("echo_token", {})
        assert result["isError"] is True
        told = body(result)
        assert told["status"] == status
        assert told["message"] == f"test gate says {status}"
        assert ("request_id" in told) == (status == "pending")
        assert result["_meta"]["handler/status"] == status
        assert gate.settled == []
        assert log_lines(router)[-1]["outcome"] == status
        assert router.services.pool.processes() == []  # no connector process was started
        assert router.services.pool.statuses == {}  # nor tried

    exchange(echo_root, run_dir, script, gate=gate)


def test_builtin_tools_ask_the_gate(echo_root: Path, run_dir: Path) -> None:
    gate = RecordingGate("executed")

    async def script(c: RawClient, router: Router) -> None:
        status = await c.call("handler_status", {"request_id": "req-1"})
        assert status["isError"] is False
        assert body(status) == {"status": "executed", "message": "ran",
                                               "result": {"text": "held result"}}
        decided = await c.call("handler_decide", {"request_id": "req-1", "decision": "approve"})
        assert decided["isError"] is True
        assert body(decided)["status"] == "blocked"
        bad = await c.call("handler_decide", {"request_id": "req-1", "decision": "maybe"})
        assert body(bad)["error"] == "invalid_arguments"
        assert gate.asked == [("status", "req-1"), ("approve", "req-1")]

    exchange(echo_root, run_dir, script, gate=gate)


def test_a_held_call_runs_through_the_executor_on_its_binding(echo_root: Path, run_dir: Path) -> None:
    async def script(c: RawClient, router: Router) -> None:
        call = CallRequest("tester", "i-1", None, "echo/v1", "echo_say", "echo-local", {"text": "later"})
        done = await router.execute_held(call)
        assert (done.ok, dict(done.output), done.settlement) == (True, {"text": "later"}, None)  # the gate settles
        gone = CallRequest("tester", "i-1", None, "echo/v1", "echo_say", "removed-binding", {"text": "later"})
        failed = await router.execute_held(gone)
        assert not failed.ok
        assert "removed-binding" in str(failed.output["message"])
        bad: Mapping[str, Any] = {"text": 3}
        call = CallRequest("tester", "i-1", None, "echo/v1", "echo_say", "echo-local", bad)
        refused = await router.execute_held(call)
        assert (refused.ok, refused.output["error"]) == (False, "invalid_arguments")

    exchange(echo_root, run_dir, script)


def test_a_held_call_runs_on_its_binding_while_the_tools_binding_runs(echo_root: Path, run_dir: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A hold recorded on another binding than the tool's now runs there, not on the tool's running process."""
    monkeypatch.setenv(TOKEN_ENV, "token-local")
    monkeypatch.setenv("HANDLER_TEST_OTHER_TOKEN", "token-other")
    add_other_binding(echo_root, "HANDLER_TEST_OTHER_TOKEN")

    async def script(c: RawClient, router: Router) -> None:
        live = await c.call("echo_token", {})  # the tool's own binding, echo-local, starts and runs
        assert live["structuredContent"] == {"token": "token-local"}
        call = CallRequest("tester", "i-1", None, "echo/v1", "echo_token", "echo-other", {})
        done = await router.execute_held(call)
        assert (done.ok, dict(done.output)) == (True, {"token": "token-other"})
        assert len(router.services.pool.processes()) == 2

    exchange(echo_root, run_dir, script)


def test_a_held_call_brings_back_the_cost_its_connector_reported(echo_root: Path, run_dir: Path) -> None:
    """The gate settles an approved hold itself, at the connector's cost: the result carries it."""
    async def script(c: RawClient, router: Router) -> None:
        call = CallRequest("tester", "i-1", None, "echo/v1", "echo_misbehave", "echo-local", {"mode": "cost"})
        done = await router.execute_held(call)
        assert (done.ok, done.cost, done.settlement) == (True, 0.25, None)
        assert log_lines(router)[-1]["cost"] == 0.25

    exchange(echo_root, run_dir, script)
