"""The client matrix: MCP clients nobody on the team wrote, through `handler-service`, against one governed router.

The TypeScript SDK 1.x (`StdioClientTransport`; it validates every `structuredContent` against the
tool's `outputSchema` with Ajv and ajv-formats, and throws on a mismatch), the Python SDK 1.x in a
virtualenv of its own, and the Python SDK 2.x this project uses, in its "auto" mode (discovers the
stateless 2026-07-28 era) and its "legacy" mode (the initialize handshake). Each lists, calls, sends
invalid arguments, names an unknown tool, is held then polls `handler_status` once a person approved,
is blocked, and gets an output whose `format` is wrong: no client raises, and the model can read
every outcome from the text (docs/router.md "Tool results"). Each client does so twice: through the bridge, and
over Streamable HTTP (`-http`: the TypeScript SDK's `StreamableHTTPClientTransport`, the Python SDKs'
Streamable HTTP clients) with a bearer token of the profile; without one, or with one that is revoked, expired
or another profile's, it is refused 401 and nothing reaches the connector.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.fixtures import format_cases
from tests.fixtures.matrix import (
    CLIENTS,
    ClientProcess,
    GovernedService,
    governed_service,
    python_sdk_1,
    typescript_sdk,
    wait_until,
)

STDIO_KINDS = ("typescript", "python-sdk-1", "python-sdk-2-auto", "python-sdk-2-legacy")
KINDS = (*STDIO_KINDS, *(f"{kind}-http" for kind in STDIO_KINDS))
ERAS = {"python-sdk-2-auto": "2026-07-28", "python-sdk-2-legacy": "2025-11-25",
        "python-sdk-2-auto-http": "2026-07-28", "python-sdk-2-legacy-http": "2025-11-25"}


@pytest.fixture(scope="module")
def service() -> Iterator[GovernedService]:
    with governed_service() as running:
        yield running


def client_command(kind: str) -> list[str]:
    kind = kind.removesuffix("-http")
    if kind == "typescript":
        typescript_sdk()
        return ["node", str(CLIENTS / "ts_client.mjs")]
    if kind == "python-sdk-1":
        return [str(python_sdk_1()), str(CLIENTS / "py_client.py"), "sdk1"]
    return [sys.executable, str(CLIENTS / "py_client.py"), kind.rsplit("-", 1)[1]]


@pytest.fixture
def client(service: GovernedService, request: pytest.FixtureRequest) -> Iterator[ClientProcess]:
    kind: str = request.param
    if kind.endswith("-http"):  # the token names the agent run, as HANDLER_INSTANCE does for the bridge
        started = ClientProcess(client_command(kind), service, target=service.url,
                                env={"HANDLER_TEST_BEARER": service.token(instance=f"matrix-{kind}")})
    else:
        started = ClientProcess(client_command(kind), service, env={"HANDLER_INSTANCE": f"matrix-{kind}"})
    try:
        yield started
    finally:
        err = started.close()
        assert "Traceback" not in err, err


def body(result: dict[str, Any]) -> dict[str, Any]:
    """What the model reads of an error result: the JSON of its one text block (never structuredContent)."""
    assert result["isError"] is True, result
    assert "structuredContent" not in result, result
    assert len(result["content"]) == 1
    told: dict[str, Any] = json.loads(result["content"][0]["text"])
    return told


def logged(service: GovernedService, instance: str, tool: str) -> dict[str, Any]:
    """The last call-log line of `instance` for `tool`, once written."""
    def find() -> dict[str, Any] | None:
        lines = [x for x in service.log_lines() if x["instance"] == instance and x["tool"] == tool]
        return lines[-1] if lines else None

    found: dict[str, Any] = wait_until(find, f"the log line of {tool}")
    return found


@pytest.mark.parametrize("client", KINDS, indirect=True)
def test_lists_and_calls_and_reads_errors_without_raising(client: ClientProcess,
                                                          request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["client"]
    listed = client.listed()
    # Through the bridge a session serves one interface (echo) and the built-ins; over HTTP the profile's endpoint
    # serves every interface of the profile, its second one (parrot) included, and the built-ins once.
    everything = ["parrot_say"] if kind.endswith("-http") else []
    assert listed["tools"] == ["echo_say", "echo_token", "echo_read", "echo_write", "echo_misbehave", "echo_formats",
                               *everything, "handler_status", "handler_decide"]
    if kind in ERAS:
        assert listed["protocol"] == ERAS[kind]

    done = client.call("echo_say", {"text": "hello", "upper": True})
    assert done.get("isError") is False
    assert done["structuredContent"] == {"text": "HELLO"}
    first, second = (block["text"] for block in done["content"])
    assert json.loads(first) == {"text": "HELLO"}
    assert second.startswith("handler: executed; charged $0.001; budget left: $"), second
    assert done["_meta"]["handler/status"] == "executed"
    assert done["_meta"]["handler/cost"] == 0.001

    invalid = body(client.call("echo_say", {"text": 3}))
    assert invalid["error"] == "invalid_arguments"
    assert invalid["message"].startswith("the arguments do not match the tool's inputSchema: at /text: 3 is not")

    unknown = body(client.call("echo_shout", {"text": "x"}))
    assert unknown["error"] == "invalid_arguments"
    assert "unknown tool 'echo_shout'; this session serves: echo_say, echo_token" in unknown["message"]


@pytest.mark.parametrize("client", KINDS, indirect=True)
def test_a_held_call_then_its_status_a_blocked_call_and_a_bad_format(
        client: ClientProcess, service: GovernedService, request: pytest.FixtureRequest) -> None:
    kind = request.node.callspec.params["client"]
    held_result = client.call("echo_write", {"text": f"from {kind}", "outputPath": f"{kind}.txt"})
    held = body(held_result)
    assert held["status"] == "pending"
    assert "approval" in held["message"] or "approve" in held["message"], held
    rid = held["request_id"]
    assert held_result["_meta"] == {"handler/status": "pending", "handler/requestId": rid,
                                    "handler/retry": "after_decision"}
    assert not (service.root / f"work/tester/{kind}.txt").exists()

    service.approve(rid)

    def decided() -> dict[str, Any] | None:
        status = client.call("handler_status", {"request_id": rid})
        assert status.get("isError") is False, status
        return None if status["structuredContent"]["status"] == "pending" else status["structuredContent"]

    outcome = wait_until(decided, f"hold {rid} to run")
    assert outcome["status"] == "executed", outcome
    assert outcome["result"] == {"path": f"{kind}.txt", "bytes": len(f"from {kind}")}
    assert (service.root / f"work/tester/{kind}.txt").read_text() == f"from {kind}"

    blocked_result = client.call("echo_token", {})
    blocked = body(blocked_result)
    assert blocked["status"] == "blocked"
    assert "rule for action echo_token" in blocked["message"]
    assert blocked_result["_meta"] == {"handler/status": "blocked", "handler/retry": "never"}

    broken = client.call("echo_formats", {"reply": {"uri": "not a uri"}})
    assert body(broken) == {"error": "unavailable",
                            "message": "the service returned a result that does not match the interface; retrying "
                                       "later may work"}
    assert (broken["_meta"]["handler/cause"], broken["_meta"]["handler/retry"]) == ("output_invalid", "later")
    line = logged(service, f"matrix-{kind}", "echo_formats")
    assert (line["outcome"], line["cause"], line["field"], line["keyword"]) == ("error", "output_invalid", "/uri",
                                                                                 "format")
    assert line["cost"] == 0.002  # its price: an answer the interface refuses still reached the provider


def test_the_typescript_client_accepts_every_format_the_router_lets_out(service: GovernedService) -> None:
    """Each value both ways through the TypeScript SDK: a good one is executed (and Ajv accepts the
    output), a bad one as input is `invalid_arguments`, as output `unavailable` (`output_invalid`)."""
    client = ClientProcess(client_command("typescript"), service, env={"HANDLER_INSTANCE": "matrix-formats"})
    try:
        for name, values in format_cases.GOOD.items():
            for value in values:
                done = client.call("echo_formats", {"check": {name: value}, "reply": {name: value}})
                assert done.get("isError") is False, (name, value, done)
                assert done["structuredContent"] == {name: value}
        for name, value in format_cases.refused():
            refused_in = body(client.call("echo_formats", {"check": {name: value}}))
            assert refused_in["error"] == "invalid_arguments", (name, value, refused_in)
            assert f'is not a "{name}"' in refused_in["message"], refused_in
            refused_out = client.call("echo_formats", {"reply": {name: value}})
            assert body(refused_out)["error"] == "unavailable", (name, value)
            assert refused_out["_meta"]["handler/cause"] == "output_invalid"
    finally:
        assert "Traceback" not in client.close()


def test_the_refused_values_are_those_ajv_formats_refuses() -> None:
    """The case table against the ajv-formats the TypeScript SDK ships (full mode, as the SDK sets it)."""
    typescript_sdk()
    script = ("import Ajv from 'ajv'; import addFormats from 'ajv-formats';"
              "const ajv = new Ajv({strict: false, validateFormats: true, allErrors: true}); addFormats(ajv);"
              "const cases = JSON.parse(process.argv[1]);"
              "console.log(JSON.stringify(cases.map(([f, v]) => ajv.compile({type: 'string', format: f})(v))));")
    tables = {"good": format_cases.GOOD, "ajv": format_cases.AJV_REFUSES, "stricter": format_cases.STRICTER}
    cases = [(f, v, kind) for kind, table in tables.items() for f, values in table.items() for v in values]
    done = subprocess.run(["node", "--input-type=module", "-e", script, json.dumps([[f, v] for f, v, _ in cases])],
                          cwd=CLIENTS, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    verdicts = json.loads(done.stdout)
    wrong = [(f, v, kind) for (f, v, kind), accepted in zip(cases, verdicts, strict=True)
             if accepted != (kind != "ajv")]
    assert wrong == []


CREDENTIALS = ("none", "revoked", "expired", "another-profile")


@pytest.mark.parametrize("credential", CREDENTIALS)
@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind.endswith("-http")])
def test_over_http_a_client_without_a_credential_of_the_profile_is_refused_401_and_reaches_nothing(
        kind: str, credential: str, service: GovernedService) -> None:
    name = f"{kind}-{credential}"
    bearer = ""
    if credential == "revoked":
        bearer = service.token(name, instance=name)
        service.revoke(name)
    elif credential == "expired":
        bearer = service.token(name, instance=name, expires_in=-1)
    elif credential == "another-profile":
        bearer = service.token(name, profile="other", instance=name)
    calls_before = len(service.log_lines())
    proc = subprocess.Popen([*client_command(kind), service.url, "echo", "tester"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**service.env, "HANDLER_TEST_BEARER": bearer})
    out, err = proc.communicate(json.dumps({"op": "call", "name": "echo_say", "arguments": {"text": "x"}}) + "\n",
                                timeout=60)
    assert proc.returncode != 0, (out, err)
    assert '"result"' not in out
    # What each client met: SDK 2.x's error does not name the status, so it is asked for here.
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    said = httpx.post(service.url, headers={"Authorization": f"Bearer {bearer}"} if bearer else {},
                      json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello})
    assert said.status_code == 401, said.text
    assert said.headers["www-authenticate"].startswith("Bearer ")
    assert "handler token create tester" in said.text
    assert len(service.log_lines()) == calls_before  # the log is written within 50 ms of a call; none was made
    assert not any(line["instance"] == name for line in service.log_lines())
