"""The MCP endpoints over Streamable HTTP (`reconciler/router/streamable.py`), asked as a client would, byte for byte.

A real `handler serve --http` on the conformance suite's tree (tests/fixtures/suite_tree.py), with tokens of
its store: what a page of another origin and a rebound name get, a session that outlives its router, one whose
revision is gone, the end of a session, and the 2026-07-28 revision's single requests and their headers. Then
the endpoint in this process on the echo tree, with small bounds: a credential past its open requests, bodies
refused before any session, a long call answered as a stream, and a stream its client lost resumed with
`Last-Event-ID` (by the official client, and after a dropped connection) or refused when nothing is left of it;
the session's own GET stream likewise: its events' ids, what was written while its client was away sent on its
resume, in order, and an id of another stream, or past what it keeps, refused.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from starlette.applications import Starlette

from reconciler.governance.credentials import Credentials, Principal
from reconciler.governance.store import open_store
from reconciler.governance.store.engine import store_url
from reconciler.governance.tokens import create_token
from reconciler.router import held as held_module
from reconciler.router.held import Held, call_stream_id, lost_call
from reconciler.router.lifeline import LOST_CALL, STOPPING
from reconciler.router.resumption import SessionSigner, load_key
from reconciler.router.streamable import HttpBounds, McpEndpoint
from reconciler.web.http import HttpListener, build_mcp_app
from reconciler.wire.messages import encode_notification
from tests.fixtures.echo_tree import write_echo_tree
from tests.fixtures.harness import run, serving
from tests.fixtures.http_service import HttpServed
from tests.fixtures.suite_connector import SIMPLE_TEXT
from tests.fixtures.suite_tree import write_suite_tree

ACCEPT = {"Accept": "application/json, text/event-stream"}
HELLO = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
STATELESS = "2026-07-28"
ENVELOPE = {"io.modelcontextprotocol/protocolVersion": STATELESS, "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture
def served() -> Iterator[HttpServed]:
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="h"))
    running = HttpServed(write_suite_tree(base / "t"), base / "run")
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(base, ignore_errors=True)


def bearer(token: str, **more: str) -> dict[str, str]:
    return {**ACCEPT, "Authorization": f"Bearer {token}", **more}


def call(msg_id: int, tool: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call", "params": {"name": tool, "arguments": {}}}


def opened(served: HttpServed, token: str) -> str:
    answer = httpx.post(served.url("suite"), headers=bearer(token), json=HELLO)
    assert answer.status_code == 200, answer.text
    assert answer.json()["result"]["protocolVersion"] == "2025-11-25"
    return answer.headers["mcp-session-id"]


def test_a_page_of_another_origin_is_refused_even_with_the_token_and_a_rebound_name_too(served: HttpServed) -> None:
    token = served.token("suite")
    foreign = httpx.post(served.url("suite"), headers=bearer(token, Origin="https://evil.example"), json=HELLO)
    assert foreign.status_code == 403
    assert "Origin 'https://evil.example' is not this service's" in foreign.text
    rebound = httpx.post(served.url("suite"), json=HELLO,
                         headers=bearer(token, Host="evil.example", Origin="http://evil.example"))
    assert rebound.status_code == 400
    assert "Host 'evil.example' is not one this service answers to" in rebound.text
    own = httpx.post(served.url("suite"), json=HELLO, headers=bearer(token, Origin=served.base))
    assert own.status_code == 200, own.text  # a page of the service itself
    assert served.log_lines() == []


def test_a_request_from_loopback_without_a_token_is_refused_saying_how_to_get_one(served: HttpServed) -> None:
    refused = httpx.post(served.url("suite"), headers=ACCEPT, json=HELLO)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"] == 'Bearer realm="handler"'
    assert "handler token create suite" in refused.text


def test_a_session_goes_on_after_its_router_restarts_without_a_new_initialize(served: HttpServed) -> None:
    token = served.token("suite", instance="nightly")
    session = opened(served, token)
    first = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": session}),
                       json=call(2, "test_simple_text"))
    assert first.json()["result"]["structuredContent"] == {"text": SIMPLE_TEXT}

    served.restart()
    again = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": session}),
                       json=call(3, "test_error_handling"))
    assert again.status_code == 200, again.text
    result = again.json()["result"]
    assert result["isError"] is True
    assert "intentionally returns an error" in result["content"][0]["text"]
    other = served.token("suite")  # an id is good only with the credential it was opened with
    stolen = httpx.post(served.url("suite"), headers=bearer(other, **{"Mcp-Session-Id": session}), json=call(4, "x"))
    assert stolen.status_code == 404


def test_a_session_whose_revision_is_gone_is_told_so_and_to_start_anew(served: HttpServed) -> None:
    token = served.token("suite")
    session = opened(served, token)
    profile = served.root / "config/profiles/suite.toml"
    profile.write_text(profile.read_text().replace("The conformance suite's caller", "Another revision"))
    served.restart()
    told = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": session}),
                      json=call(2, "test_simple_text"))
    assert told.status_code == 404
    message = told.json()["error"]["message"]
    assert "this session was pinned to config revision" in message
    assert "start a new session: send initialize again" in message


def test_delete_ends_a_session_and_a_forged_id_is_unknown(served: HttpServed) -> None:
    token = served.token("suite")
    session = opened(served, token)
    assert httpx.delete(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": session})).status_code == 200
    after = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": session}),
                       json=call(2, "test_simple_text"))
    assert after.status_code == 404
    forged = session[:-4] + ("AAAA" if not session.endswith("AAAA") else "BBBB")
    assert httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": forged}),
                      json=call(2, "test_simple_text")).status_code == 404
    missing = httpx.post(served.url("suite"), headers=bearer(token), json=call(2, "test_simple_text"))
    assert missing.status_code == 400
    assert "needs the Mcp-Session-Id header" in missing.json()["error"]["message"]


def test_a_session_ended_by_delete_stays_ended_after_its_router_restarts(served: HttpServed) -> None:
    """The router that ended it restarts (or another shares its state folder): the ended id is still refused, while
    a session nobody ended goes on."""
    token = served.token("suite")
    ended, kept = opened(served, token), opened(served, token)
    assert httpx.delete(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": ended})).status_code == 200
    served.restart()
    refused = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": ended}),
                         json=call(2, "test_simple_text"))
    assert refused.status_code == 404, refused.text
    assert "no such session" in refused.json()["error"]["message"]
    goes_on = httpx.post(served.url("suite"), headers=bearer(token, **{"Mcp-Session-Id": kept}),
                         json=call(3, "test_simple_text"))
    assert goes_on.status_code == 200, goes_on.text


def test_a_notification_is_accepted_with_202_and_one_the_session_refuses_gets_400_with_its_error(
        served: HttpServed) -> None:
    """A POSTed notification or response: 202 with no body when the session takes it; else a 4xx saying why (the
    transport's rule), not a 202 whose error nothing ever sends."""
    token = served.token("suite")
    headers = bearer(token, **{"Mcp-Session-Id": opened(served, token)})
    taken = httpx.post(served.url("suite"), headers=headers,
                       json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    assert (taken.status_code, taken.content) == (202, b"")
    refused = httpx.post(served.url("suite"), headers=headers, json={"jsonrpc": "2.0", "method": "tools/list"})
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["message"], refused.text
    assert refused.json().get("id") is None
    still = httpx.post(served.url("suite"), headers=headers, json=call(2, "test_simple_text"))
    assert still.status_code == 200, still.text  # the session goes on


def test_protocol_2026_07_28_is_one_request_a_post_with_its_headers_and_no_session(served: HttpServed) -> None:
    token = served.token("suite")
    discover = {"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {"_meta": ENVELOPE}}
    found = httpx.post(served.url("suite"), json=discover,
                       headers=bearer(token, **{"MCP-Protocol-Version": STATELESS, "Mcp-Method": "server/discover"}))
    assert found.status_code == 200, found.text
    assert STATELESS in found.json()["result"]["supportedVersions"]
    assert "mcp-session-id" not in found.headers

    no_method = httpx.post(served.url("suite"), json=discover,
                           headers=bearer(token, **{"MCP-Protocol-Version": STATELESS}))
    assert no_method.status_code == 400
    assert no_method.json()["error"]["code"] == -32020

    tool = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "test_simple_text", "arguments": {}, "_meta": ENVELOPE}}
    wrong_name = httpx.post(served.url("suite"), json=tool, headers=bearer(token, **{
        "MCP-Protocol-Version": STATELESS, "Mcp-Method": "tools/call", "Mcp-Name": "test_error_handling"}))
    assert wrong_name.json()["error"]["code"] == -32020
    done = httpx.post(served.url("suite"), json=tool, headers=bearer(token, **{
        "MCP-Protocol-Version": STATELESS, "Mcp-Method": "tools/call", "Mcp-Name": "test_simple_text"}))
    assert done.json()["result"]["structuredContent"] == {"text": SIMPLE_TEXT}
    assert done.json()["result"]["resultType"] == "complete"

    later = {**discover, "params": {"_meta": {**ENVELOPE, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}
    headers = bearer(token, **{"MCP-Protocol-Version": "2099-01-01", "Mcp-Method": "server/discover"})
    unknown = httpx.post(served.url("suite"), json=later, headers=headers)
    assert unknown.status_code == 400
    assert unknown.json()["error"]["code"] == -32022
    stream = httpx.get(served.url("suite"), headers=bearer(token, **{"MCP-Protocol-Version": STATELESS}))
    assert stream.status_code == 405


# --- the endpoint in this process, on a router of its own: its bounds, and a long call's stream ----------------


@contextlib.asynccontextmanager
async def mounted(root: Path, run_dir: Path, bounds: HttpBounds) -> AsyncIterator[tuple[Starlette, str]]:
    """The endpoint as the listener mounts it, on a router of its own, and a bearer token of `tester`."""
    async with mounted_endpoint(root, run_dir, bounds) as (_, app, token):
        yield app, token


@contextlib.asynccontextmanager
async def mounted_endpoint(root: Path, run_dir: Path,
                           bounds: HttpBounds) -> AsyncIterator[tuple[McpEndpoint, Starlette, str]]:
    """`mounted`, with the endpoint itself, whose sessions a test may write to as the router would."""
    with contextlib.closing(open_store(store_url(root, {}, state_dir=root / ".handler"))) as store:
        token = create_token(store, "tester", name="bounded", instance=None, expires_in=None, actor="tests").token
        credentials = Credentials(store)
        async with serving(root, run_dir) as router:
            def authenticate(authorization: str | None, profile: str, base: str | None) -> Awaitable[Principal]:
                return credentials.authenticate(authorization, profile, base_url=base)

            mcp = McpEndpoint(router, authenticate, SessionSigner(load_key(root)), bounds)
            try:
                yield mcp, build_mcp_app(mcp), token
            finally:
                await mcp.aclose()


@contextlib.asynccontextmanager
async def endpoint(root: Path, run_dir: Path, bounds: HttpBounds) -> AsyncIterator[tuple[httpx.AsyncClient, str]]:
    """An HTTP client of the endpoint (as the listener mounts it) and a bearer token of `tester`."""
    async with mounted(root, run_dir, bounds) as (app, token), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as client:
        yield client, token


async def open_session(client: httpx.AsyncClient, token: str) -> dict[str, str]:
    opened = await client.post("/mcp/tester", headers=bearer(token), json=HELLO)
    assert opened.status_code == 200, opened.text
    return bearer(token, **{"Mcp-Session-Id": opened.headers["mcp-session-id"]})


def sleep_call(msg_id: int, seconds: float) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
            "params": {"name": "echo_misbehave", "arguments": {"mode": "sleep", "seconds": seconds}}}


def test_a_credential_past_its_open_requests_is_told_to_retry_and_then_served(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with endpoint(echo_root, run_dir, HttpBounds(requests_per_credential=1)) as (client, token):
            headers = await open_session(client, token)
            slow = asyncio.create_task(client.post("/mcp/tester", headers=headers, json=sleep_call(2, 1.0)))
            busy = None
            while busy is None or busy.status_code != 429:  # until the slow call holds the credential's one request
                assert not slow.done()
                busy = await client.post("/mcp/tester", headers=headers, json={"jsonrpc": "2.0", "id": 3,
                                                                              "method": "ping"})
            assert busy.headers["retry-after"] == "1"
            assert "the credential 'bounded' has 1 requests open already" in busy.text
            assert (await slow).status_code == 200
            after = await client.post("/mcp/tester", headers=headers, json={"jsonrpc": "2.0", "id": 4,
                                                                            "method": "ping"})
            assert after.json() == {"jsonrpc": "2.0", "id": 4, "result": {}}

    run(scenario())


def test_a_body_over_the_bound_a_wrong_type_or_accept_is_refused_before_any_session(echo_root: Path,
                                                                                     run_dir: Path) -> None:
    async def scenario() -> None:
        async with endpoint(echo_root, run_dir, HttpBounds(max_body_bytes=2000)) as (client, token):
            big = {**HELLO, "params": {**HELLO["params"], "padding": "x" * 3000}}
            assert (await client.post("/mcp/tester", headers=bearer(token), json=big)).status_code == 413
            typed = await client.post("/mcp/tester", headers=bearer(token, **{"Content-Type": "text/plain"}),
                                      content=b"{}")
            assert typed.status_code == 415
            json_only = await client.post("/mcp/tester", json=HELLO,
                                          headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
            assert json_only.status_code == 406
            assert "Accept: application/json, text/event-stream" in json_only.text

    run(scenario())


def test_a_long_call_is_answered_as_a_stream_ending_with_its_result(echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        bounds = HttpBounds(stream_after_seconds=0.1, keepalive_seconds=0.1)
        async with endpoint(echo_root, run_dir, bounds) as (client, token):
            headers = await open_session(client, token)
            streamed = await client.post("/mcp/tester", headers=headers, json=sleep_call(5, 0.6))
            assert streamed.headers["content-type"] == "text/event-stream"
            assert b": keep-alive\n\n" in streamed.content
            last = streamed.content.rstrip(b"\n").rsplit(b"\n", 1)[1]
            assert last.startswith(b'data: {"jsonrpc":"2.0","id":5,"result":')
            assert json.loads(last[len(b"data: "):])["result"]["isError"] is False

    run(scenario())


# --- a stream the client lost, resumed with Last-Event-ID ---------------------------------------------------------


def test_a_call_whose_stream_ends_before_its_result_is_resumed_by_the_sdk_client_and_answered(
        echo_root: Path, run_dir: Path) -> None:
    """The endpoint ends a 2025-11-25 call's stream after 0.2 s (as the specification lets a server), after an event
    with an id; the official client reconnects with GET and Last-Event-ID, and gets the call's result there."""
    async def scenario() -> None:
        bounds = HttpBounds(stream_after_seconds=0.05, keepalive_seconds=0.1, poll_after_seconds=0.2)
        async with mounted(echo_root, run_dir, bounds) as (app, token):
            listener = HttpListener(app, "127.0.0.1", 0, dashboard=False)
            await listener.start()
            asked: list[tuple[str, str | None]] = []

            async def note(request: Any) -> None:
                asked.append((request.method, request.headers.get("last-event-id")))

            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            http.event_hooks["request"].append(note)
            try:
                url = f"http://127.0.0.1:{listener.port}/mcp/tester"
                async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                    result = await client.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 1.0})
                    assert not result.is_error, result
                    said = await client.call_tool("echo_say", {"text": "after"})
                    assert not said.is_error, said
            finally:
                await listener.aclose()
            resumed = [last for method, last in asked if method == "GET" and last is not None]
            assert len(resumed) >= 2, asked  # 1 s of call, a stream ended every 0.2 s
            assert len({last.rpartition("/")[0] for last in resumed}) == 1  # the one call's stream, each time

    run(scenario())


def test_a_last_event_id_of_no_stream_held_is_refused_saying_to_send_the_request_again(echo_root: Path,
                                                                                        run_dir: Path) -> None:
    async def scenario() -> None:
        async with endpoint(echo_root, run_dir, HttpBounds()) as (client, token):
            headers = await open_session(client, token)
            answered = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": "gone/3"})
            assert answered.status_code == 400
            assert "No stream of this session to resume after event 'gone/3'" in answered.text
            assert "Send the request again" in answered.text

    run(scenario())


# Up to 30 characters: JSON writes a character in 6 bytes at most ("\u001f"), so every such id fits the 256 characters
# of base64 a stream id carries (the longer ones: the test below).
@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1) | st.text(max_size=30))
def test_a_call_stream_id_names_its_request_to_another_router_and_to_no_one_else(request_id: int | str) -> None:
    named = call_stream_id(request_id)
    assert "/" not in named
    assert lost_call(named) is None  # this router opened it: its reply was delivered, or it was dropped here
    router, _, rest = named.partition(".")
    assert lost_call(f"another-{router}.{rest}") == request_id


@pytest.mark.parametrize("made_up", [
    "gone", "a.b", "a.b.", "a.b.!!!", "a.b.dHJ1ZQ", "a.b.bnVsbA", "a.b.W10", "a.b.eyJhIjoxfQ", "a.b.MS41",
    "a.b." + "A" * 300, "a.b.ÿÿ", "a.b.Ig",
])
def test_a_last_event_id_that_names_no_request_is_refused_as_a_stream_of_no_router(made_up: str) -> None:
    """Made up by a client: an id that is not base64 of JSON, or names true, null, a list, an object, a float, too
    long a request id or a non-ASCII one, names no request."""
    assert lost_call(made_up) is None


@pytest.mark.parametrize("request_id", [None, "x" * 300, 1 << 70])
def test_a_stream_of_no_request_or_of_one_too_long_to_carry_names_none(request_id: int | str | None) -> None:
    """A notification's, or one whose request id is too long to carry (or past 64 bits, which no line carries):
    its stream names no request, so another router refuses its resume as it refuses any stream it does not know."""
    named = call_stream_id(request_id)
    router, _, rest = named.partition(".")
    assert lost_call(named) is None
    assert lost_call(f"another-{router}.{rest}") is None


def test_a_stream_whose_connection_drops_is_resumed_from_its_first_event_and_ends_with_the_reply(
        echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        bounds = HttpBounds(stream_after_seconds=0.05, keepalive_seconds=0.1)
        async with mounted(echo_root, run_dir, bounds) as (app, token):
            listener = HttpListener(app, "127.0.0.1", 0, dashboard=False)
            await listener.start()
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}", timeout=30) as client:
                    headers = await open_session(client, token)
                    async with client.stream("POST", "/mcp/tester", headers=headers, json=sleep_call(7, 0.8)) as cut:
                        first = (await anext(cut.aiter_raw())).decode()
                    assert first.startswith("id: "), first  # the priming event: an id, no data
                    assert "\ndata: \n" in first, first
                    last_id = first.split("\n", 1)[0].removeprefix("id: ")
                    resumed = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": last_id})
                    again = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": last_id})
            finally:
                await listener.aclose()
            assert resumed.status_code == 200
            assert resumed.headers["content-type"] == "text/event-stream"
            data = [line for line in resumed.text.splitlines() if line.startswith("data: {")]
            assert len(data) == 1, resumed.text
            assert json.loads(data[0][len("data: "):])["id"] == 7
            assert again.status_code == 400  # delivered whole: nothing is left to resume

    run(scenario())


def test_a_call_a_restart_cut_off_is_answered_by_the_next_router_saying_its_result_is_lost(tmp_path: Path) -> None:
    """`handler serve --http` is stopped while a call's stream is open and started again on the same state: the
    client's resume of that stream (GET with Last-Event-ID) gets the call's one answer, the error saying what happened
    and what to do, instead of a refusal it would retry until it gave up; the session goes on."""
    root = write_echo_tree(tmp_path / "t", limits={"maxFileBytes": 1000, "timeoutSeconds": 120, "maxConcurrent": 8,
                                                   "maxCallsPerRun": 10000})
    served = HttpServed(root, tmp_path / "run")
    try:
        token = served.token("tester")
        opened_now = httpx.post(served.url("tester"), headers=bearer(token), json=HELLO)
        headers = bearer(token, **{"Mcp-Session-Id": opened_now.headers["mcp-session-id"]})
        with httpx.Client(timeout=60) as client, \
                client.stream("POST", served.url("tester"), headers=headers, json=sleep_call(7, 100)) as cut:
            first = next(cut.iter_raw()).decode()  # the stream opens once the call runs past 5 s: an id to resume
        assert first.startswith("id: "), first
        assert "\nretry: 2000\n" in first, first  # resume after 2 s: time for the router to be back
        last_id = first.split("\n", 1)[0].removeprefix("id: ")
        served.restart()
        resumed = httpx.get(served.url("tester"), headers={**headers, "Last-Event-ID": last_id}, timeout=30)
        assert resumed.status_code == 200, resumed.text
        assert resumed.headers["content-type"] == "text/event-stream"
        data = [line for line in resumed.text.splitlines() if line.startswith("data: {")]
        assert len(data) == 1, resumed.text
        reply = json.loads(data[0][len("data: "):])
        assert reply["id"] == 7
        assert reply["error"]["message"] == LOST_CALL
        assert "it may or may not have run" in reply["error"]["message"]
        assert reply["error"]["data"] == {"handler/retry": "later"}
        said = {"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "echo_say",
                                                                             "arguments": {"text": "on"}}}
        after = httpx.post(served.url("tester"), headers=headers, json=said)
        assert after.status_code == 200, after.text
        assert after.json()["result"]["structuredContent"]["text"] == "on"
    finally:
        served.stop()


def test_a_stopping_router_finishes_the_call_in_flight_and_tells_a_new_call_it_did_not_run(tmp_path: Path) -> None:
    """SIGTERM to `handler serve --http` under a call of 2 s: that call's reply still comes; a call posted while the
    router stops, in a session and as a 2026-07-28 request, is answered at once that it did not run and to call again
    in a few seconds (over HTTP it cannot wait unread for the next router); the router then exits cleanly."""
    root = write_echo_tree(tmp_path / "t")
    served = HttpServed(root, tmp_path / "run")
    try:
        token = served.token("tester")
        opened_now = httpx.post(served.url("tester"), headers=bearer(token), json=HELLO)
        headers = bearer(token, **{"Mcp-Session-Id": opened_now.headers["mcp-session-id"]})
        said = {"name": "echo_say", "arguments": {"text": "too late"}}
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            running = pool.submit(httpx.post, served.url("tester"), headers=headers, json=sleep_call(7, 2), timeout=30)
            time.sleep(0.5)  # the call runs
            assert served.proc is not None
            served.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            late = httpx.post(served.url("tester"), headers=headers,
                              json={"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": said})
            one_off = httpx.post(served.url("tester"), json={"jsonrpc": "2.0", "id": 9, "method": "tools/call",
                                                              "params": {**said, "_meta": ENVELOPE}},
                                 headers=bearer(token, **{"MCP-Protocol-Version": STATELESS, "Mcp-Method": "tools/call",
                                                          "Mcp-Name": "echo_say"}))
            finished = running.result()
        assert served.proc.wait(30) == 0
        for answer, msg_id in ((late, 8), (one_off, 9)):
            assert answer.status_code == 200, answer.text
            error = answer.json()["error"]
            assert answer.json()["id"] == msg_id
            assert error["message"] == STOPPING
            assert "this call was not run and nothing was charged" in error["message"]
            assert error["data"] == {"handler/retry": "later"}
        assert finished.status_code == 200, finished.text
        data = [line for line in finished.text.splitlines() if line.startswith(("data: {", "{"))]
        assert json.loads(data[-1].removeprefix("data: "))["result"]["structuredContent"] == {"text": "slept"}
        assert any("stopping; 1 call(s) in flight may finish" in line for line in served.said)
        assert [entry["tool"] for entry in served.log_lines()] == ["echo_misbehave"]  # the refused calls never ran
    finally:
        served.stop()


def test_the_sdk_client_resuming_a_call_onto_a_router_that_never_held_it_gets_its_one_answer(
        echo_root: Path, run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The official client loses a call's stream when its router goes (its listener closed); the next endpoint on the
    same address is another router process (`held`'s mark of it changed), which never held the stream: the client's
    resume gets the error that names the lost call, and its call ends with it, not with "reconnection attempts were
    exhausted"."""
    async def scenario() -> None:
        bounds = HttpBounds(stream_after_seconds=0.05, keepalive_seconds=0.1)
        async with mounted_endpoint(echo_root, run_dir, bounds) as (mcp, app, token):
            first = HttpListener(app, "127.0.0.1", 0, dashboard=False)
            await first.start()
            port = first.port
            url = f"http://127.0.0.1:{port}/mcp/tester"
            http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
            async with http, Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                calling = asyncio.create_task(client.call_tool("echo_misbehave", {"mode": "sleep", "seconds": 30}))
                await asyncio.sleep(0.5)  # the call's stream is open, primed with an id
                for connection in list(first._server.server_state.connections):  # the router dies: its connections
                    connection.transport.abort()                               # cut, the call's stream with them
                await first.aclose()
                monkeypatch.setattr(held_module, "_ROUTER", "another")
                # Another router process on the same address and state: an endpoint that holds no session yet.
                again = McpEndpoint(mcp._router, mcp._authenticate, SessionSigner(load_key(echo_root)), bounds)
                second = HttpListener(build_mcp_app(again), "127.0.0.1", port, dashboard=False)
                await second.start()
                try:
                    with pytest.raises(MCPError) as told:
                        await asyncio.wait_for(calling, 20)
                    assert told.value.error.message == LOST_CALL
                    said = await client.call_tool("echo_say", {"text": "on"})  # the session goes on there
                    assert not said.is_error, said
                finally:
                    await second.aclose()
                    await again.aclose()

    run(scenario())


# --- the session's own GET stream, resumed with Last-Event-ID ---------------------------------------------------
# The router sends nothing there of its own yet (docs/router.md "MCP over HTTP"); these tests write what a session
# sends outside any request as the router would: through the session's own writer, from no request's context.


def changed(n: int) -> bytes:
    return encode_notification("notifications/tools/list_changed", {"_meta": {"n": n}})


async def sse_events(lines: AsyncIterator[str], count: int) -> list[dict[str, str]]:
    """The next `count` events of an SSE body, each its fields (`id`, `data`); comments are skipped, and an event
    with no `id` fails the test (a comment has none, an event always has one)."""
    events: list[dict[str, str]] = []
    fields: dict[str, str] = {}
    async for line in lines:
        if line.startswith(":"):
            continue
        if line:
            name, _, value = line.partition(": ")
            fields[name] = value
            continue
        if fields:
            assert "id" in fields, fields
            events.append(fields)
            fields = {}
        if len(events) == count:
            break
    return events


def notes_of(events: list[dict[str, str]]) -> list[int]:
    """The `n` of each `changed(n)` among `events` (the priming event, with no data, has none)."""
    return [json.loads(event["data"])["params"]["_meta"]["n"] for event in events if event.get("data")]


@contextlib.asynccontextmanager
async def listening(root: Path, run_dir: Path, bounds: HttpBounds) -> AsyncIterator[
        tuple[McpEndpoint, httpx.AsyncClient, str]]:
    """The endpoint on a real listener, a client of it, and a bearer token of `tester`."""
    async with mounted_endpoint(root, run_dir, bounds) as (mcp, app, token):
        listener = HttpListener(app, "127.0.0.1", 0, dashboard=False)
        await listener.start()
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{listener.port}", timeout=30) as client:
                yield mcp, client, token
        finally:
            await listener.aclose()


async def held_session(mcp: McpEndpoint, client: httpx.AsyncClient, token: str) -> tuple[dict[str, str], Held]:
    """A session opened over HTTP (its request headers) and the endpoint's hold of it, to write to it directly: the
    router sends nothing on a session's own stream of itself."""
    headers = await open_session(client, token)
    held = mcp._held.get(headers["Mcp-Session-Id"])
    assert held is not None
    return headers, held


async def until_dropped(held: Held) -> None:
    """Until the endpoint has seen the client's GET stream go."""
    while held.outlet.listening:
        await asyncio.sleep(0.01)


def test_a_get_stream_resumed_with_last_event_id_gets_what_was_written_while_it_was_away_once_in_order(
        echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with listening(echo_root, run_dir, HttpBounds(keepalive_seconds=0.05)) as (mcp, client, token):
            headers, held = await held_session(mcp, client, token)
            async with client.stream("GET", "/mcp/tester", headers=headers) as first:
                lines = first.aiter_lines()
                primed = await sse_events(lines, 1)  # 2025-11-25: an event with an id and no data, to resume from
                assert primed[0]["data"] == "", primed
                held.session.write(changed(1))
                await asyncio.sleep(0.15)  # keep-alives meanwhile: comments, which `sse_events` finds with no id
                seen = await sse_events(lines, 1)
            assert notes_of(seen) == [1]
            stream, _, number = seen[0]["id"].rpartition("/")
            assert (stream, number) == (primed[0]["id"].rpartition("/")[0], "2")
            for n in (2, 3, 4):  # while the client is away
                held.session.write(changed(n))
            resumed = {**headers, "Last-Event-ID": seen[0]["id"]}
            async with client.stream("GET", "/mcp/tester", headers=resumed) as again:
                assert again.status_code == 200
                lines = again.aiter_lines()
                missed = await sse_events(lines, 3)
                held.session.write(changed(5))  # then the live stream goes on
                live = await sse_events(lines, 1)
            assert notes_of(missed) == [2, 3, 4]
            assert [event["id"] for event in missed + live] == [f"{stream}/{n}" for n in (3, 4, 5, 6)]
            assert notes_of(live) == [5]

    run(scenario())


def test_a_second_get_takes_the_stream_over_from_a_connection_the_router_still_holds(
        echo_root: Path, run_dir: Path) -> None:
    """A client whose GET stream a proxy cut without a word opens it again while the router still holds the old
    connection: the newer one gets the stream (not a 409 that would leave the client without it), and the older
    one ends."""
    async def scenario() -> None:
        async with listening(echo_root, run_dir, HttpBounds()) as (mcp, client, token):
            headers, held = await held_session(mcp, client, token)
            async with client.stream("GET", "/mcp/tester", headers=headers) as old:
                old_lines = old.aiter_lines()
                await sse_events(old_lines, 1)  # open, and still held by the router
                async with client.stream("GET", "/mcp/tester", headers=headers) as new:
                    assert new.status_code == 200
                    assert new.headers["content-type"].startswith("text/event-stream")
                    lines = new.aiter_lines()
                    await sse_events(lines, 1)
                    rest = [line async for line in old_lines]  # the older connection's response ends
                    assert not any(line.startswith("data:") and line != "data:" for line in rest), rest
                    held.session.write(changed(1))
                    got = await sse_events(lines, 1)
                    assert notes_of(got) == [1]
                    assert held.outlet.listening == 1

    run(scenario())


def test_a_last_event_id_of_an_abandoned_or_unknown_get_stream_is_refused_saying_to_reopen_it(
        echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with listening(echo_root, run_dir, HttpBounds()) as (mcp, client, token):
            headers, held = await held_session(mcp, client, token)
            async with client.stream("GET", "/mcp/tester", headers=headers) as first:
                old = (await sse_events(first.aiter_lines(), 1))[0]["id"]
            await until_dropped(held)
            held.session.write(changed(1))
            ahead = old.rpartition("/")[0] + "/9"  # an event the stream never had
            future = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": ahead})
            assert future.status_code == 400
            assert f"This session's stream cannot be resumed after event {ahead!r}" in future.text
            assert "Reopen the stream: GET without Last-Event-ID" in future.text
            async with client.stream("GET", "/mcp/tester", headers=headers) as fresh:  # anew: nothing replayed
                lines = fresh.aiter_lines()
                opened_anew = (await sse_events(lines, 1))[0]
                held.session.write(changed(2))
                after = await sse_events(lines, 1)
            assert opened_anew["data"] == ""
            assert opened_anew["id"].rpartition("/")[0] != old.rpartition("/")[0]
            assert notes_of(after) == [2]
            abandoned = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": old})
            assert abandoned.status_code == 400
            assert f"No stream of this session to resume after event {old!r}" in abandoned.text
            assert "reopen it: GET without Last-Event-ID" in abandoned.text
            other = await open_session(client, token)  # another session knows no stream of this one's
            foreign = await client.get("/mcp/tester", headers={**other, "Last-Event-ID": opened_anew["id"]})
            assert foreign.status_code == 400

    run(scenario())


def test_a_get_stream_resumed_from_before_what_it_keeps_is_refused_not_replayed_in_part(
        echo_root: Path, run_dir: Path) -> None:
    async def scenario() -> None:
        async with listening(echo_root, run_dir, HttpBounds(session_stream_events=3)) as (mcp, client, token):
            headers, held = await held_session(mcp, client, token)
            async with client.stream("GET", "/mcp/tester", headers=headers) as first:
                primed = (await sse_events(first.aiter_lines(), 1))[0]["id"]
            await until_dropped(held)
            for n in range(1, 6):  # events 2 to 6: the stream keeps 4 to 6
                held.session.write(changed(n))
            stream = primed.rpartition("/")[0]
            refused = await client.get("/mcp/tester", headers={**headers, "Last-Event-ID": primed})
            assert refused.status_code == 400
            assert "no longer all kept (the stream keeps its last 3 events; events 4 to 6 now)" in refused.text
            assert "Reopen the stream: GET without Last-Event-ID" in refused.text
            async with client.stream("GET", "/mcp/tester", headers={**headers, "Last-Event-ID": f"{stream}/3"}) as kept:
                assert kept.status_code == 200
                replayed = await sse_events(kept.aiter_lines(), 3)
            assert notes_of(replayed) == [3, 4, 5]
            assert [event["id"] for event in replayed] == [f"{stream}/{n}" for n in (4, 5, 6)]

    run(scenario())
