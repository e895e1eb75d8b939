"""The listener's guards, through a real uvicorn listener on 127.0.0.1: a `Host` that is not this service's
is refused on every route (DNS rebinding), bodies over their limit are refused before they are read or cut
as they arrive, a slow body is cut, and the listener will not open beyond loopback without a token."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest

from reconciler.config import FolderSource, Loader, Snapshot
from reconciler.gitops.status import Status
from reconciler.governance.holds import LISTED_HOLDS
from reconciler.governance.store import open_store, store_url
from reconciler.web.dashboard import Desk
from reconciler.web.guards import host_name
from reconciler.web.http import (
    BodyLimits,
    ConnectionLimits,
    HttpListener,
    ListenerError,
    ListenerSettings,
    build_app,
    build_mcp_app,
)
from reconciler.web.links import LinkSigner
from reconciler.web.owners import MEMBER_COOKIE
from reconciler.web.slack import SlackSettings
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import short_dir
from tests.fixtures.service import DEADLINE
from tests.governance.builders import hold_calls

PUBLIC = "https://approvals.example.org"
HANDLER = str(Path(sys.executable).parent / "handler")


SIGNER = LinkSigner(b"k" * 32)


@asynccontextmanager
async def listening(store_dir: Path, pushes: list[bytes] | None = None, limits: BodyLimits | None = None,
                    connections: ConnectionLimits | None = None, store: str | None = None,
                    snapshot: Snapshot | None = None) -> AsyncIterator[int]:
    """A listener with the dashboard on 127.0.0.1 (its port), HANDLER_PUBLIC_URL set to PUBLIC; its store a new one in
    `store_dir`, or `store`; its live config `snapshot` (whose members may sign in with `SIGNER`)."""

    async def on_push() -> None:
        if pushes is not None:
            pushes.append(b"push")

    desk = Desk(open_store(store or f"sqlite:///{store_dir / 'store.db'}"), lambda: snapshot, SIGNER,
                SlackSettings(None, None))
    app = build_app(Status("worktree /tree").to_dict, webhook_secret=b"secret", on_push=on_push, desk=desk)
    settings = ListenerSettings(public_url=PUBLIC, limits=limits or BodyLimits(),
                                connections=connections or ConnectionLimits())
    listener = HttpListener(app, "127.0.0.1", 0, settings)
    await listener.start()
    try:
        yield listener.port
    finally:
        await listener.aclose()
        desk.store.close()


async def exchange(port: int, head: bytes, body_parts: list[bytes]) -> bytes:
    """Send `head` and `body_parts` over a raw socket (not finishing the body unless they do), and return
    what the server answers before it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        async with asyncio.timeout(DEADLINE):
            writer.write(head)
            for part in body_parts:
                writer.write(part)
                await writer.drain()
            return await reader.read()  # the refusal says Connection: close, so this ends
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


@pytest.mark.parametrize("path", ["/", "/approvals", "/hooks/git", "/status"])
def test_a_host_that_is_not_this_service_is_refused_on_every_route(tmp_path: Path, path: str) -> None:
    async def scenario() -> None:
        async with listening(tmp_path) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            method = "POST" if path.startswith("/hooks/") else "GET"
            rebound = await http.request(method, path, content=b"{}", headers={"Host": f"evil.example:{port}"})
            assert rebound.status_code == 400
            assert "'evil.example:" in rebound.text
            assert "is not one this service answers to" in rebound.text
            assert "HANDLER_PUBLIC_URL" in rebound.text
            headerless = await http.request(method, path, content=b"{}", headers={"Host": ""})
            assert headerless.status_code == 400
            for host in (f"127.0.0.1:{port}", "127.0.0.1", f"localhost:{port}", "LOCALHOST", f"[::1]:{port}",
                         "approvals.example.org", "approvals.example.org:443"):
                right = await http.request(method, path, content=b"{}", headers={"Host": host})
                assert right.status_code != 400, (host, right.text)
                # Past the Host check: an unsigned push, or a page that needs a member signed in.
                assert right.status_code == 401, (host, right.text)

    asyncio.run(scenario())


def test_host_names_are_compared_without_port_brackets_or_case() -> None:
    assert host_name("Example.ORG:8765") == "example.org"
    assert host_name("[::1]:8765") == "::1"
    assert host_name("[::1]") == "::1"
    assert host_name("localhost.") == "localhost"
    assert host_name("evil.example:notaport") == "evil.example:notaport"


def test_a_huge_content_length_is_refused_before_its_body_is_read(tmp_path: Path) -> None:
    pushes: list[bytes] = []

    async def scenario() -> None:
        async with listening(tmp_path, pushes) as port:
            head = (b"POST /hooks/git HTTP/1.1\r\nHost: 127.0.0.1\r\nX-GitHub-Event: push\r\n"
                    b"Content-Length: 209715200\r\n\r\n")
            answer = await exchange(port, head, [b"{" * 10])  # 200 MB announced, ten bytes sent
            assert status_of(answer) == 413, answer
            assert b"this route takes at most 1048576" in answer
            form = await exchange(port, b"POST /approvals/h1 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                        b"Content-Type: application/x-www-form-urlencoded\r\n"
                                        b"Content-Length: 65537\r\n\r\n", [b"decision=approve"])
            assert status_of(form) == 413, form  # a form takes 64 KiB
        assert pushes == []

    asyncio.run(scenario())


def test_a_chunked_body_is_cut_at_the_limit(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with listening(tmp_path) as port:
            head = b"POST /hooks/git HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            piece = b"x" * (64 << 10)
            chunks = [b"%x\r\n%s\r\n" % (len(piece), piece)] * 16 + [b"1\r\nx\r\n"]  # 1 MiB and a byte, unfinished
            answer = await exchange(port, head, chunks)
            assert status_of(answer) == 413, answer[:200]
            assert b"over 1048576 bytes" in answer
            closing = head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
            under = await exchange(port, closing, [b"2\r\n{}\r\n0\r\n\r\n"])
            assert status_of(under) == 401, under  # a small chunked body reaches the route (unsigned here)

    asyncio.run(scenario())


def test_a_slow_body_is_cut_with_408(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with listening(tmp_path, limits=BodyLimits(seconds=0.3)) as port:
            head = b"POST /hooks/git HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n"
            answer = await exchange(port, head, [b"{" * 10])  # ninety bytes never come
            assert status_of(answer) == 408, answer
            assert b"did not arrive within 0.3 seconds" in answer

    asyncio.run(scenario())


def test_a_client_that_never_finishes_a_request_head_is_closed_and_cannot_hold_every_descriptor(
        tmp_path: Path) -> None:
    partial = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # the blank line that ends a head never comes

    async def scenario() -> None:
        limits = ConnectionLimits(most=3, head_seconds=0.5)
        async with listening(tmp_path, connections=limits) as port:
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert status_of(await exchange(port, partial, [])) == 408  # closed, not held for ever
            assert 0.4 < loop.time() - started < 5
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            for _, writer in held:
                writer.write(partial)
            refused = await exchange(port, partial, [])  # a fourth, while three are open
            assert status_of(refused) == 503, refused
            assert b"holds 3 connections already" in refused
            for reader, writer in held:  # each is answered 408 and closed at its deadline, freeing its place
                async with asyncio.timeout(DEADLINE):
                    assert status_of(await reader.read()) == 408
                writer.close()
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                assert (await http.get("/healthz")).status_code == 200
            # Between requests too: a kept-alive connection whose next head stalls is closed at the deadline.
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            async with asyncio.timeout(DEADLINE):
                first = await reader.readuntil(b'{"ok":true}')
                writer.write(partial)
                late = await reader.read()
            writer.close()
            assert first.startswith(b"HTTP/1.1 200"), first
            assert late.startswith(b"HTTP/1.1 408"), late

    asyncio.run(scenario())


def test_signatures_and_times_that_are_not_ascii_are_refused_not_a_server_error(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with listening(tmp_path) as port, httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            signed = {"X-Hub-Signature-256": "sha256=\u00e9".encode()}
            hook = await http.post("/hooks/git", content=b"{}", headers=signed)
            assert hook.status_code == 401, hook.text
            link = await http.get("/approvals/req_x", params={"member": "alice", "expires": "\u00b2", "sig": "x"})
            assert link.status_code == 403, link.text  # the link was read, and does not hold
            long_expiry = await http.get("/approvals/req_x", params={"member": "alice", "expires": "9" * 5000,
                                                                       "sig": "x"})
            assert long_expiry.status_code == 403, long_expiry.text
            signin = await http.get("/login", params={"member": "alice", "expires": "\u00b2", "nonce": "n",
                                                      "sig": "s"})
            assert signin.status_code == 403, signin.text
        raw = b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nCookie: handler_member=alice:\xb2:abc\r\nConnection: close\r\n\r\n"
        async with listening(tmp_path) as port:
            assert status_of(await exchange(port, raw, [])) == 401  # an unreadable cookie signs nobody in
            huge = (b"POST /hooks/git HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n")
            answer = await exchange(port, huge, [])
            assert status_of(answer) in (400, 413), answer  # the parser or the limit refuses it, never a 500

    asyncio.run(scenario())


def test_listening_beyond_loopback_needs_the_dashboard_token() -> None:
    app = build_app(dict, webhook_secret=None, on_push=None)
    for host in ("0.0.0.0", "::", "192.0.2.7", "handler.example.org"):  # noqa: S104 - refused, never bound
        with pytest.raises(ListenerError) as refused:
            HttpListener(app, host, 8765, ListenerSettings())
        assert "--http" in str(refused.value)
        assert "HANDLER_DASHBOARD_TOKEN" in str(refused.value)
    for host in ("127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"):
        HttpListener(app, host, 8765, ListenerSettings())
    HttpListener(app, "0.0.0.0", 8765, ListenerSettings(token="a-long-random-secret"))  # noqa: S104, S106


def test_the_agents_endpoints_alone_may_listen_beyond_loopback_each_request_asking_a_credential() -> None:
    async def nothing(scope: object, receive: object, send: object) -> None:
        return None

    HttpListener(build_mcp_app(nothing), "0.0.0.0", 8765, ListenerSettings(), dashboard=False)  # noqa: S104
    limits = BodyLimits()
    assert limits.limit_for("/mcp/researcher") == DEFAULT_MAX_LINE_BYTES  # one message, as large as a socket's line
    assert limits.limit_for("/approvals/h1") == limits.forms


@pytest.fixture
def tree() -> Iterator[Path]:
    with short_dir() as base:
        yield write_echo_tree(base / "t")


def test_handler_up_on_every_address_without_a_token_says_what_to_set(tree: Path) -> None:
    env = {**os.environ, "HANDLER_RUN_DIR": str(tree.parent / "run"), "HANDLER_STATE_DIR": str(tree.parent / "state"),
           TOKEN_ENV: "t"}
    env.pop("HANDLER_DASHBOARD_TOKEN", None)
    done = subprocess.run([HANDLER, "up", str(tree), "--http", "0.0.0.0:0"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)
    assert done.returncode != 0
    assert "--http 0.0.0.0:0" in done.stderr, done.stderr
    assert "HANDLER_DASHBOARD_TOKEN" in done.stderr, done.stderr


def test_the_approvals_page_counts_every_pending_hold_and_says_when_it_lists_only_the_oldest(
        shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    held = hold_calls(shipped_tree, LISTED_HOLDS + 3)

    snapshot = Loader().load(FolderSource(shipped_tree))

    async def scenario() -> None:
        async with listening(shipped_tree, store=store_url(shipped_tree), snapshot=snapshot) as port, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                  cookies={MEMBER_COOKIE: SIGNER.session("alice")}) as http:
            page = (await http.get("/approvals")).text
            assert f"Waiting for a decision ({LISTED_HOLDS + 3})" in page
            assert f"The {LISTED_HOLDS} oldest are listed here" in page
            assert "handler approvals list --limit 0" in page
            assert held[0] in page
            assert held[-1] not in page

    asyncio.run(scenario())


def test_without_signing_in_no_page_shows_a_held_call_or_the_status_on_loopback_either(
        shipped_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HANDLER_STORE_URL", raising=False)
    monkeypatch.delenv("HANDLER_STATE_DIR", raising=False)
    (held,) = hold_calls(shipped_tree, 1)  # its query is "q0"
    snapshot = Loader().load(FolderSource(shipped_tree))

    async def scenario() -> None:
        async with listening(shipped_tree, store=store_url(shipped_tree), snapshot=snapshot) as port, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            for path in ("/", "/approvals", f"/approvals/{held}", "/catalog", "/profiles/auditor", "/status", "/audit",
                         "/spend", "/calls", "/changes"):
                refused = await http.get(path)
                assert refused.status_code == 401, (path, refused.text)
                assert "q0" not in refused.text, path
                assert held not in refused.text, path
                assert "researcher" not in refused.text, path  # no profile, binding or secret reference named
                assert "handler dashboard login --member NAME" in refused.text, path
            assert (await http.get("/healthz")).json() == {"ok": True}
            http.cookies.set(MEMBER_COOKIE, SIGNER.session("bob"))  # a member, not an owner
            shown = await http.get(f"/approvals/{held}")
            assert shown.status_code == 200
            assert "q0" in shown.text
            assert (await http.get("/status")).status_code == 200
            http.cookies.set(MEMBER_COOKIE, SIGNER.session("mallory"))  # signed, but no member of the org
            assert (await http.get(f"/approvals/{held}")).status_code == 401
            missing = await http.get("/no/such/page")
            assert missing.status_code == 404
            assert missing.headers["X-Frame-Options"] == "DENY"
            assert "default-src 'none'" in missing.headers["Content-Security-Policy"]
            assert "No such page" in missing.text

    asyncio.run(scenario())
