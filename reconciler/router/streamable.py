"""MCP over Streamable HTTP: `/mcp/<profile>` on the service's listener, framing the very sessions of the sockets.

`app.py` mounts `McpEndpoint` on the HTTP listener (whose guards have checked `Host` and the body's size). Each
request then passes, in order: its method, its `Origin` (a page of another origin is refused, the
specification's DNS-rebinding rule), its credential (`authenticate`: a bearer of this profile, from loopback as
from anywhere), the budget of its profile and of its credential. What a message means is `sessions.Session`'s,
as on a unix socket; only the framing differs (docs/router.md "MCP over HTTP"):

- 2024-11-05 to 2025-11-25: `initialize` opens a session whose id (`Mcp-Session-Id`) is its signed record
  (`resumption`), so any router sharing the state folder serves its next request, pinned to the revision it
  began on; POST carries one message, answered as JSON or an SSE stream (`exchanges`); GET opens the session's
  own stream; DELETE ends it.
- 2026-07-28 (`MCP-Protocol-Version: 2026-07-28`): no session and no GET stream; each POST is one request with
  its envelope, checked against the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers (-32020 when
  one is missing or disagrees), served by a session of its own; a client that disconnects cancels its call.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

import orjson

from reconciler.governance.credentials import Principal
from reconciler.governance.errors import CredentialError
from reconciler.router.exchanges import (
    CURRENT,
    Exchange,
    Receive,
    Scope,
    Send,
    answer,
    send_body,
    send_json_error,
    stream_session,
)
from reconciler.router.hub import Hub
from reconciler.router.protocol import Era, read_envelope
from reconciler.router.resumption import SessionRecord, SessionSigner
from reconciler.router.sessions import Session
from reconciler.wire.errors import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SERVER_BUSY,
    UNSUPPORTED_PROTOCOL_VERSION,
    JsonRpcError,
)
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES
from reconciler.wire.meta import INSTANCE
from reconciler.wire.versions import HANDSHAKE_VERSIONS

__all__ = ["Authenticate", "HttpBounds", "McpEndpoint"]

Authenticate = Callable[[str | None, str, str | None], Awaitable[Principal]]
_SESSION_HEADER: Final = "mcp-session-id"
_VERSION_HEADER: Final = "mcp-protocol-version"
_ROUTING_HEADERS: Final = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")
# 2026-07-28 names the HTTP status of each refusal; anything else is a JSON-RPC answer, 200.
_STATUS_OF_CODE: Final = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
                          -32021: 400, UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404}
_NEW_SESSION: Final = "start a new session: send initialize again, without Mcp-Session-Id"


@dataclass(frozen=True)
class HttpBounds:
    """What one profile and one credential may hold of the endpoint at once, as the sockets bound a client."""

    max_body_bytes: int = DEFAULT_MAX_LINE_BYTES  # one message, as a socket's line
    requests_per_profile: int = 512  # open requests and streams: a profile's socket takes 512 connections
    requests_per_credential: int = 256  # one credential: as many calls as one connection may run
    sessions_per_credential: int = 64  # held in memory; an idle one past it is let go, and resumes from its id
    idle_seconds: float = 600.0  # a session idle this long is let go too (its generation with it), and resumes
    stream_after_seconds: float = 5.0  # a call still running then answers as an SSE stream, kept alive
    keepalive_seconds: float = 15.0


class _Outlet:
    """Where a handshake-era session's writes go: the request that caused them, else its GET stream."""

    def __init__(self) -> None:
        self.stream: Exchange | None = None

    def write(self, data: bytes) -> None:
        exchange = CURRENT.get()
        if exchange is None:
            exchange = self.stream
        if exchange is not None:
            exchange.put(data)


@dataclass
class _Held:
    session: Session
    record: SessionRecord
    outlet: _Outlet
    used: float = field(default_factory=time.monotonic)


class _Budget:
    """Open requests by profile and by credential."""

    def __init__(self, bounds: HttpBounds) -> None:
        self._bounds = bounds
        self._profiles: dict[str, int] = {}
        self._credentials: dict[tuple[str, str], int] = {}

    def take(self, profile: str, credential: str) -> str | None:
        key = (profile, credential)
        if self._profiles.get(profile, 0) >= self._bounds.requests_per_profile:
            return f"profile {profile!r} has {self._bounds.requests_per_profile} requests open over HTTP already"
        if self._credentials.get(key, 0) >= self._bounds.requests_per_credential:
            return f"the credential {credential!r} has {self._bounds.requests_per_credential} requests open already"
        self._profiles[profile] = self._profiles.get(profile, 0) + 1
        self._credentials[key] = self._credentials.get(key, 0) + 1
        return None

    def give(self, profile: str, credential: str) -> None:
        key = (profile, credential)
        self._profiles[profile] -= 1
        self._credentials[key] -= 1
        if not self._credentials[key]:
            del self._credentials[key]


@dataclass
class _Call:
    """One HTTP request of the endpoint, checked up to its credential."""

    scope: Scope
    receive: Receive
    send: Send
    headers: Headers
    profile: str
    principal: Principal


class McpEndpoint:
    """The ASGI app of `/mcp/{profile}` (see the module docstring); `aclose` ends every session it holds."""

    def __init__(self, router: Hub, authenticate: Authenticate, signer: SessionSigner,
                 bounds: HttpBounds | None = None) -> None:
        self._router = router
        self._authenticate = authenticate
        self._signer = signer
        self.bounds = bounds or HttpBounds()
        self._budget = _Budget(self.bounds)
        self._sessions: dict[str, _Held] = {}
        self._by_credential: dict[tuple[str, str], OrderedDict[str, None]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()  # ids ended here, refused rather than resumed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope)
        profile = scope.get("path_params", {}).get("profile", "")
        if scope["method"] not in ("POST", "GET", "DELETE"):
            await send_body(send, 405, b"The MCP endpoint takes POST, GET and DELETE.\n",
                            {"allow": "POST, GET, DELETE", "content-type": "text/plain"})
            return
        if (problem := origin_problem(headers)) is not None:
            await send_body(send, 403, problem.encode(), {"content-type": "text/plain; charset=utf-8"})
            return
        try:
            principal = await self._authenticate(headers.get("authorization"), profile, _base_url(scope, headers))
        except CredentialError as exc:
            await send_body(send, exc.status, str(exc).encode(),
                            {**exc.headers, "content-type": "text/plain; charset=utf-8"})
            return
        if profile not in self._router.live.snapshot.profiles:  # a credential of a profile since removed
            await send_body(send, 404, f"Profile {profile!r} is not served by this revision of the config.\n".encode(),
                            {"content-type": "text/plain; charset=utf-8"})
            return
        if (busy := self._budget.take(profile, principal.name)) is not None:
            await send_body(send, 429, f"{busy}; retry once some have ended.\n".encode(),
                            {"content-type": "text/plain; charset=utf-8", "retry-after": "1"})
            return
        try:
            call = _Call(scope, receive, send, headers, profile, principal)
            version = headers.get(_VERSION_HEADER)
            if version is not None and version not in HANDSHAKE_VERSIONS:
                await self._stateless(call)
            else:
                await self._handshake(call)
        finally:
            self._budget.give(profile, principal.name)

    # --- 2026-07-28: one request per POST, no session ---------------------------------------------------

    async def _stateless(self, call: _Call) -> None:
        if call.scope["method"] != "POST":
            await send_body(call.send, 405, b"Protocol 2026-07-28 has no session stream and no session to end: "
                            b"POST each request.\n", {"allow": "POST", "content-type": "text/plain"})
            return
        accepts = _accepts(call.headers)
        if "application/json" not in accepts:
            await _refuse_accept(call.send, "application/json")
            return
        body, decoded = await self._read_message(call)
        if decoded is None:
            return
        if "id" not in decoded:  # a notification: nothing on this wire acts on one (cancelling is disconnecting)
            await send_body(call.send, 202, b"", {})
            return
        if not isinstance(decoded.get("method"), str) or decoded["method"] == "initialize":
            await send_json_error(call.send, 400, INVALID_REQUEST, "POST one request with its method (protocol "
                                  "2026-07-28 has no initialize: every request carries its envelope)", _id_of(decoded))
            return
        if (refusal := _routing_refusal(call.scope, call.headers, decoded)) is not None:
            await send_json_error(call.send, 400, refusal.code, refusal.message, _id_of(decoded))
            return
        session = Session(self._router, call.profile, _discard, _bound(call.principal))
        exchange = Exchange()
        session.write = exchange.put
        try:
            self._handle(session, exchange, body)
            await answer(exchange, call.receive, call.send, stream="text/event-stream" in accepts,
                         stream_after=self.bounds.stream_after_seconds, keepalive=self.bounds.keepalive_seconds,
                         status_of=lambda code: _STATUS_OF_CODE.get(code, 200) if code is not None else 200,
                         headers={}, on_gone=session.abort)
        finally:
            session.detach()
            session.abort()  # its calls ended (or were cancelled with the client gone): its generation is let go

    # --- 2024-11-05 to 2025-11-25: sessions --------------------------------------------------------------

    async def _handshake(self, call: _Call) -> None:
        method, sid = call.scope["method"], call.headers.get(_SESSION_HEADER)
        if method == "DELETE":
            await self._end(call, sid)
            return
        accepts = _accepts(call.headers)
        if method == "GET":
            if "text/event-stream" not in accepts:
                await _refuse_accept(call.send, "text/event-stream")
                return
            held = await self._find(call, sid, None)
            if held is not None:
                await self._open_stream(call, held)
            return
        if "application/json" not in accepts or "text/event-stream" not in accepts:
            await _refuse_accept(call.send, "application/json, text/event-stream")
            return
        await self._post(call, sid)

    async def _post(self, call: _Call, sid: str | None) -> None:
        body, decoded = await self._read_message(call)
        if decoded is None:
            return
        if decoded.get("method") == "initialize" and "id" in decoded:
            await self._open(call, body, decoded, sid)
            return
        held = await self._find(call, sid, _id_of(decoded))
        if held is None:
            return
        if "id" not in decoded or "method" not in decoded:  # a notification (or a response: the router asks none)
            self._handle(held.session, None, body)
            await send_body(call.send, 202, b"", {})
            return
        exchange = Exchange()
        self._handle(held.session, exchange, body)
        # A client that goes away leaves its call running (these revisions do not read a disconnect as a cancel).
        await answer(exchange, call.receive, call.send, stream=True, stream_after=self.bounds.stream_after_seconds,
                     keepalive=self.bounds.keepalive_seconds, status_of=lambda _: 200, headers={},
                     on_gone=lambda: None)

    async def _open(self, call: _Call, body: bytes, decoded: dict[str, Any], sid: str | None) -> None:
        if sid is not None:
            await send_json_error(call.send, 400, INVALID_REQUEST, "initialize opens a session: send it without "
                                 "Mcp-Session-Id (the session you name goes on as it was)", _id_of(decoded))
            return
        outlet = _Outlet()
        session = Session(self._router, call.profile, outlet.write, _bound(call.principal))
        exchange = Exchange()
        self._handle(session, exchange, body)  # answered inline: the reply is in the exchange now
        reply = exchange.reply or b""
        record = session.record(call.principal.name) if session.era is Era.HANDSHAKE else None
        if record is None:  # initialize was refused
            session.abort()
            await send_body(call.send, 400, reply, {"content-type": "application/json"})
            return
        new_id = self._signer.issue(record)
        if not self._keep(new_id, _Held(session, record, outlet)):
            session.abort()
            await send_json_error(call.send, 429, SERVER_BUSY, self._too_many(call), _id_of(decoded))
            return
        await send_body(call.send, 200, reply, {"content-type": "application/json", "mcp-session-id": new_id})

    async def _find(self, call: _Call, sid: str | None, msg_id: int | str | None) -> _Held | None:
        """The session `sid` names, held here or resumed from its record; else the refusal is sent and None."""
        if sid is None:
            await send_json_error(call.send, 400, INVALID_REQUEST, "this request needs the Mcp-Session-Id header "
                                  "that initialize answered with (or MCP-Protocol-Version: 2026-07-28, which needs "
                                  "no session)", msg_id)
            return None
        held = self._sessions.get(sid)
        record = held.record if held is not None else self._signer.read(sid)
        if record is None or sid in self._ended or record.profile != call.profile \
                or record.principal != call.principal.name:
            # Another credential's id is as unknown as a forged one: nothing says it exists.
            await send_json_error(call.send, 404, INVALID_REQUEST, f"no such session; {_NEW_SESSION}", msg_id)
            return None
        if held is None:
            held = await self._resume(call, sid, record, msg_id)
        else:
            held.used = time.monotonic()
            self._by_credential[(call.profile, call.principal.name)].move_to_end(sid)
        return held

    async def _resume(self, call: _Call, sid: str, record: SessionRecord, msg_id: int | str | None) -> _Held | None:
        live = self._router.live.snapshot.revision
        if record.revision != live:
            await send_json_error(call.send, 404, INVALID_REQUEST, f"this session was pinned to config revision "
                                  f"{record.revision[:12]}, which is no longer served (now {live[:12]}); "
                                  f"{_NEW_SESSION}", msg_id)
            return None
        outlet = _Outlet()
        session = Session(self._router, call.profile, outlet.write, _bound(call.principal))
        session.resume(record)  # the revision is live: checked above
        held = _Held(session, record, outlet)
        if not self._keep(sid, held):
            await send_json_error(call.send, 429, SERVER_BUSY, self._too_many(call), msg_id)
            return None
        return held

    def _keep(self, sid: str, held: _Held) -> bool:
        """Hold `held` under `sid`, letting the credential's least recently used idle session go past its bound;
        False when all of them are busy."""
        self._let_go_idle()
        ids = self._by_credential.setdefault((held.record.profile, held.record.principal), OrderedDict())
        if len(ids) >= self.bounds.sessions_per_credential:
            idle = next((old for old in ids if not self._sessions[old].session.tasks
                         and self._sessions[old].outlet.stream is None), None)
            if idle is None:
                return False
            self._let_go(idle)
        self._sessions[sid] = held
        ids[sid] = None
        return True

    def _let_go_idle(self) -> None:
        """Let go the sessions nobody used for `idle_seconds`: a client that never ends its session keeps no
        generation pinned for ever (its connectors could never drain). Each resumes from its id if it comes back."""
        horizon = time.monotonic() - self.bounds.idle_seconds
        for sid in [sid for sid, held in self._sessions.items() if held.used < horizon and not held.session.tasks
                    and held.outlet.stream is None]:
            self._let_go(sid)

    def _let_go(self, sid: str) -> None:
        held = self._sessions.pop(sid)
        ids = self._by_credential[(held.record.profile, held.record.principal)]
        del ids[sid]
        if not ids:
            del self._by_credential[(held.record.profile, held.record.principal)]
        if held.outlet.stream is not None:
            held.outlet.stream.close()
        held.session.abort()

    async def _open_stream(self, call: _Call, held: _Held) -> None:
        if held.outlet.stream is not None and not held.outlet.stream.closed:
            await send_body(call.send, 409, b"This session has its stream open already: one GET stream a session.\n",
                            {"content-type": "text/plain"})
            return
        held.outlet.stream = exchange = Exchange()
        try:
            await stream_session(exchange, call.receive, call.send, self.bounds.keepalive_seconds, {})
        finally:
            if held.outlet.stream is exchange:
                held.outlet.stream = None

    async def _end(self, call: _Call, sid: str | None) -> None:
        held = await self._find(call, sid, None)
        if held is None or sid is None:
            return
        self._let_go(sid)
        self._ended[sid] = None
        while len(self._ended) > 100_000:
            self._ended.popitem(last=False)
        await send_body(call.send, 200, b"", {})

    def _too_many(self, call: _Call) -> str:
        return (f"the credential {call.principal.name!r} holds {self.bounds.sessions_per_credential} sessions with "
                "calls running already: end one (DELETE) or wait for its calls")

    # --- shared ------------------------------------------------------------------------------------------

    def _handle(self, session: Session, exchange: Exchange | None, body: bytes) -> None:
        token = CURRENT.set(exchange)  # copied into the task a tools/call starts: its messages come back here
        try:
            session.handle(body)
        finally:
            CURRENT.reset(token)

    async def _read_message(self, call: _Call) -> tuple[bytes, dict[str, Any] | None]:
        """The body, read under the bound, and the one JSON-RPC message in it; None when refused (sent)."""
        if "application/json" not in call.headers.text("content-type"):
            await send_body(call.send, 415, b"POST a JSON-RPC message as Content-Type: application/json.\n",
                            {"content-type": "text/plain"})
            return b"", None
        body = await _read_body(call.receive, self.bounds.max_body_bytes)
        if body is None:
            await send_body(call.send, 413, f"A message may be at most {self.bounds.max_body_bytes} bytes.\n".encode(),
                            {"content-type": "text/plain", "connection": "close"})
            return b"", None
        try:
            decoded = orjson.loads(body)
        except orjson.JSONDecodeError:
            await send_json_error(call.send, 400, PARSE_ERROR, "the body is not JSON")
            return body, None
        if not isinstance(decoded, dict):
            await send_json_error(call.send, 400, INVALID_REQUEST, "POST one JSON-RPC message, an object; batches "
                                  "are not served (revisions after 2025-03-26 removed them)")
            return body, None
        return body, decoded

    async def aclose(self) -> None:
        for sid in list(self._sessions):
            self._let_go(sid)
        await asyncio.sleep(0)


class Headers:
    """A request's headers by lower-case name (the last of repeated ones; `_routing_refusal` counts those)."""

    def __init__(self, scope: Scope) -> None:
        self._values: dict[str, str] = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}

    def get(self, name: str) -> str | None:
        return self._values.get(name)

    def text(self, name: str) -> str:
        """The header's value, "" when it is absent."""
        return self._values.get(name, "")


def origin_problem(headers: Headers) -> str | None:
    """Why a request's `Origin` is refused, or None. A browser names the page's origin; a request of a page served
    elsewhere (another site, or a name rebound to this address) may not act with a credential it holds. Clients
    that are not browsers send none."""
    origin = headers.get("origin")
    if origin is None:
        return None
    host = headers.text("host").lower()
    parts = urlsplit(origin.strip())
    if parts.scheme in ("http", "https") and parts.netloc and _same_host(parts.scheme, parts.netloc.lower(), host):
        return None
    return (f"Origin {origin[:100]!r} is not this service's ({host[:100]}): a page served elsewhere may not call the "
            "MCP endpoint. Call it from a program (which sends no Origin), or from a page of this service.\n")


def _same_host(scheme: str, netloc: str, host: str) -> bool:
    default = ":443" if scheme == "https" else ":80"
    return netloc.removesuffix(default) == host.removesuffix(default)


def _routing_refusal(scope: Scope, headers: Headers, decoded: Mapping[str, Any]) -> JsonRpcError | None:
    """2026-07-28's checks of a POST's headers against its body, in the specification's order: the envelope, then
    each routing header present once and agreeing with the body. The version itself is the session's to check."""
    params = decoded.get("params")
    try:
        read_envelope(params if isinstance(params, dict) else None)
    except JsonRpcError as exc:
        if exc.code != UNSUPPORTED_PROTOCOL_VERSION:
            return exc
    for name in _ROUTING_HEADERS:
        if sum(1 for key, _ in scope["headers"] if key.lower() == name) > 1:
            return JsonRpcError(HEADER_MISMATCH, f"the {name.decode()} header appears more than once")
    meta = params.get("_meta") if isinstance(params, dict) else None
    version = meta.get("io.modelcontextprotocol/protocolVersion") if isinstance(meta, dict) else None
    if headers.get(_VERSION_HEADER) != version:
        return JsonRpcError(HEADER_MISMATCH, "the MCP-Protocol-Version header must equal the request's protocol "
                            "version in params._meta")
    if headers.get("mcp-method") != decoded.get("method"):
        return JsonRpcError(HEADER_MISMATCH, "the Mcp-Method header is missing, or does not name the request's method")
    if decoded.get("method") == "tools/call" and isinstance(params, dict) \
            and headers.get("mcp-name") != params.get("name"):
        return JsonRpcError(HEADER_MISMATCH, "the Mcp-Name header is missing, or does not name the tool called")
    return None


async def _read_body(receive: Receive, most: int) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > most:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _refuse_accept(send: Send, needed: str) -> None:
    await send_body(send, 406, f"This request needs Accept: {needed}.\n".encode(), {"content-type": "text/plain"})


def _accepts(headers: Headers) -> str:
    accept = headers.text("accept").lower()
    return accept.replace("*/*", "application/json, text/event-stream")


def _bound(principal: Principal) -> dict[str, str] | None:
    """The credential's agent run, which a request may not override (as the bridge's tags on a socket)."""
    return {INSTANCE: principal.instance} if principal.instance else None


def _id_of(decoded: Mapping[str, Any]) -> int | str | None:
    value = decoded.get("id")
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _base_url(scope: Scope, headers: Headers) -> str:
    return f"{scope.get('scheme', 'http')}://{headers.text('host')}"


def _discard(data: bytes) -> None:
    return None
