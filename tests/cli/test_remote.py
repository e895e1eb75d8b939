"""The files of `handler call --url`: the caller's local file goes into the profile's work folder through
`PUT /files/...` and the router's own pipeline reads it there; what a tool writes comes back to the caller's path.

The call itself goes over the profile's MCP endpoint over HTTP; these tests make it through the profile's socket
instead, which runs the same pipeline, so that what is checked here is the carrying of the files."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from reconciler.app import UpOptions
from reconciler.cli import main
from reconciler.cli.remote import FileCarrier, RemoteLinkError, endpoint_of
from reconciler.governance.store import open_store
from reconciler.governance.tokens import create_token
from reconciler.wire.results import result_body
from tests.fixtures.echo_tree import TOKEN_ENV, TOOLS, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.service import running

SCHEMAS = {tool["name"]: tool["inputSchema"] for tool in TOOLS}


@pytest.fixture
def short(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "token-A")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_PUBLIC_URL", "HANDLER_DASHBOARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as path:
        yield path


def test_a_local_input_is_uploaded_read_by_the_call_and_an_output_comes_back_to_the_callers_folder(
        short: Path) -> None:
    root = write_echo_tree(short / "tree")
    caller = short / "caller"
    (caller / "out").mkdir(parents=True)
    page = caller / "page.png"
    page.write_bytes(b"\x89PNG" + bytes(range(200)))
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0, sandbox=False)

    async def scenario() -> None:
        async with running(options) as service:
            assert service.listener is not None
            store = open_store(f"sqlite:///{short / 'state' / 'handler.db'}")
            try:
                token = create_token(store, "tester", name="t", instance=None, expires_in=60, actor="test").token
            finally:
                store.close()
            carrier = FileCarrier(f"http://127.0.0.1:{service.listener.port}", "tester", token)
            session = await service.session()
            try:
                read_args = await asyncio.to_thread(carrier.upload_inputs, SCHEMAS["echo_read"], {"path": str(page)})
                assert read_args["path"].startswith(".handler-call/")
                assert read_args["path"].endswith("/page.png")
                read = result_body(await session.call("echo_read", read_args))
                assert (read["bytes"], read["sha256"]) == (204, hashlib.sha256(page.read_bytes()).hexdigest())

                wanted = caller / "out" / "speech.txt"
                write_args = await asyncio.to_thread(carrier.upload_inputs, SCHEMAS["echo_write"],
                                                     {"text": "spoken words", "outputPath": str(wanted)})
                assert write_args["text"] == "spoken words"
                assert write_args["outputPath"].endswith("/speech.txt")
                assert not wanted.exists()
                written = result_body(await session.call("echo_write", write_args))
                assert written["bytes"] == 12
                assert await asyncio.to_thread(carrier.download_outputs) == [wanted]
                assert wanted.read_text() == "spoken words"
                assert sorted(p.name for p in (caller / "out").iterdir()) == ["speech.txt"]  # no partial file
                assert await asyncio.to_thread(carrier.clear) == []
                assert sorted(p.name for p in (root / "work/tester").iterdir()) == [".handler-call"]
                assert list((root / "work/tester/.handler-call").iterdir()) == []
            finally:
                await session.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_refused_upload_says_what_the_router_said(short: Path) -> None:
    root = write_echo_tree(short / "tree")
    big = short / "big.bin"
    big.write_bytes(b"x" * 1001)  # the echo interface's maxFileBytes is 1000
    options = UpOptions(root=str(root), run_dir=short / "run", state_dir=short / "state", http_port=0, sandbox=False)

    async def scenario() -> None:
        async with running(options) as service:
            assert service.listener is not None
            base = f"http://127.0.0.1:{service.listener.port}"
            with pytest.raises(RemoteLinkError, match=r"\(401\).*handler token create tester"):
                await asyncio.to_thread(FileCarrier(base, "tester", "hst_" + "A" * 43).upload_inputs,
                                        SCHEMAS["echo_read"], {"path": str(big)})
            store = open_store(f"sqlite:///{short / 'state' / 'handler.db'}")
            try:
                token = create_token(store, "tester", name="t", instance=None, expires_in=60, actor="test").token
            finally:
                store.close()
            with pytest.raises(RemoteLinkError, match=r"\(413\).*at most 1000"):
                await asyncio.to_thread(FileCarrier(base, "tester", token).upload_inputs, SCHEMAS["echo_read"],
                                        {"path": str(big)})

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_the_url_may_name_the_service_or_the_profiles_endpoint() -> None:
    assert endpoint_of("https://mcp.example.org/", "researcher") == (
        "https://mcp.example.org", "https://mcp.example.org/mcp/researcher")
    assert endpoint_of("https://mcp.example.org/mcp/researcher", "researcher") == (
        "https://mcp.example.org", "https://mcp.example.org/mcp/researcher")
    with pytest.raises(RemoteLinkError, match="not an http"):
        endpoint_of("mcp.example.org", "researcher")


class _BearerOnly:
    """Answers 401 to a request without `Authorization: Bearer good`, as the router's endpoint would."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and (b"authorization", b"Bearer good") not in scope["headers"]:
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"www-authenticate", b'Bearer realm="handler"')]})
            await send({"type": "http.response.body", "body": b"no credential\n"})
            return
        await self.app(scope, receive, send)


@pytest.fixture
def mcp_endpoint() -> Iterator[str]:
    """An MCP server of the official SDK over Streamable HTTP at /mcp/tester on loopback, behind a bearer check:
    the shape of a profile's endpoint, for the MCP half of `handler call --url`."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("stand-in")

    @server.tool()
    def echo_say(text: str) -> dict[str, str]:
        """Echo a text back."""
        return {"text": f"echoed: {text}"}

    app = _BearerOnly(server.streamable_http_app(streamable_http_path="/mcp/tester"))
    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not runner.started:
        assert time.monotonic() < deadline, "the stand-in MCP server did not start"
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    runner.should_exit = True
    thread.join(20)
    sock.close()


def test_handler_call_url_lists_and_calls_over_streamable_http_with_the_bearer(
        mcp_endpoint: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDLER_TOKEN", raising=False)
    code = main(["call", "echo", "echo_say", "--profile", "tester", "--url", mcp_endpoint, "--token", "good",
                 "--text", "hi"])
    out, err = capsys.readouterr()
    assert (code, out, err) == (0, "echoed: hi\n", "")
    monkeypatch.setenv("HANDLER_TOKEN", "bad")
    code = main(["call", "echo", "echo_say", "--profile", "tester", "--url", f"{mcp_endpoint}/mcp/tester",
                 "--text", "hi"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith(f"handler call: cannot call {mcp_endpoint}/mcp/tester: ")
    assert "the router answered 401: no credential" in err
    monkeypatch.delenv("HANDLER_TOKEN")
    code = main(["call", "echo", "echo_say", "--profile", "tester", "--url", mcp_endpoint, "--text", "hi"])
    assert code == 1
    assert "--url needs a token of the profile" in capsys.readouterr().err
