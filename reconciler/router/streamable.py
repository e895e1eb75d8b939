"""MCP over Streamable HTTP: `/mcp/<profile>` on the service's listener, framing the very sessions of the sockets.

`app.py` mounts `McpEndpoint` on the HTTP listener, whose guards (web/guards.py) have checked `Host`, `Origin` (a
page of another origin is refused, the specification's DNS-rebinding rule) and the body's size. Each request then
passes, in order: its method, its credential (`authenticate`: a bearer of this profile, from loopback as from
anywhere), the budget of its profile and of its credential (`held.Budget`). What a message means is
`sessions.Session`'s, as on a unix socket, and the sessions kept between requests are `held.HeldSessions`'; only
the framing differs (docs/router.md "MCP over HTTP"):

- 2024-11-05 to 2025-11-25: `initialize` opens a session whose id (`Mcp-Session-Id`) is its signed record
  (`resumption`), so any router sharing the state folder serves its next request, pinned to the revision it
  began on; POST carries one message, answered as JSON or an SSE stream (`exchanges`); GET opens the session's
  own stream, and GET with `Last-Event-ID` resumes a stream its client lost (a call's, or the session's own; a
  call's that another router process ran is answered saying its result is lost, `held.lost_call`); DELETE ends it.
  While the router stops (`quiesce`), a new `tools/call` is answered at once that it did not run (`lifeline.STOPPING`):
  the calls running finish.
- 2026-07-28 (`MCP-Protocol-Version: 2026-07-28`): no session and no GET stream; each POST is one request with
  its envelope, checked against the `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers (-32020 when
  one is missing or disagrees), served by a session of its own; a client that disconnects cancels its call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

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
    resume,
    send_body,
    send_json_error,
    stream_session,
)
from reconciler.router.held import Budget, Held, HeldSessions, HttpBounds, Outlet, lost_call, new_session
from reconciler.router.hub import Hub
from reconciler.router.lifeline import LOST_CALL, STOPPING, cut_off
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
from reconciler.wire.versions import HANDSHAKE_VERSIONS

__all__ = ["Authenticate", "HttpBounds", "McpEndpoint"]

Authenticate = Callable[[str | None, str, str | None], Awaitable[Principal]]
_SESSION_HEADER: Final = "mcp-session-id"
_VERSION_HEADER: Final = "mcp-protocol-version"
_LAST_EVENT_HEADER: Final = "last-event-id"
_ROUTING_HEADERS: Final = (b"mcp-protocol-version", b"mcp-method", b"mcp-name")
# 2026-07-28 names the HTTP status of each refusal; anything else is a JSON-RPC answer, 200.
_STATUS_OF_CODE: Final = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
                          -32021: 400, UNSUPPORTED_PROTOCOL_VERSION: 400, METHOD_NOT_FOUND: 404}
_NEW_SESSION: Final = "start a new session: send initialize again, without Mcp-Session-Id"


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
        self._budget = Budget(self.bounds)
        self._held = HeldSessions(router, self.bounds)
        self._one_off: set[Session] = set()  # the sessions of 2026-07-28 requests being served
        self.stopping = False  # `quiesce` began: a new call is refused, saying it did not run

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope)
        profile = scope.get("path_params", {}).get("profile", "")
        if scope["method"] not in ("POST", "GET", "DELETE"):
            await send_body(send, 405, b"The MCP endpoint takes POST, GET and DELETE.\n",
                            {"allow": "POST, GET, DELETE", "content-type": "text/plain"})
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
        await self._serve_one(call, body, decoded, stream="text/event-stream" in accepts)

    async def _serve_one(self, call: _Call, body: bytes, decoded: Mapping[str, Any], *, stream: bool) -> None:
        """A 2026-07-28 request that passed every check, served by a session of its own."""
        if self.stopping and await self._refused_stopping(call, decoded):
            return
        session = new_session(self._router, call.profile, call.principal, Outlet())  # writes to no stream
        exchange = Exchange()
        session.write = exchange.put
        self._one_off.add(session)
        try:
            self._handle(session, exchange, body)
            await answer(exchange, call.receive, call.send, stream=stream,
                         stream_after=self.bounds.stream_after_seconds, keepalive=self.bounds.keepalive_seconds,
                         status_of=lambda code: _STATUS_OF_CODE.get(code, 200) if code is not None else 200,
                         headers={}, on_gone=session.abort)
        finally:
            self._one_off.discard(session)
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
            if held is not None and (last := call.headers.get(_LAST_EVENT_HEADER)) is not None:
                await self._resume_stream(call, held, last)
            elif held is not None:
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
            refused = Exchange()
            self._handle(held.session, refused, body)
            if refused.reply is None:
                await send_body(call.send, 202, b"", {})
            else:  # one the session cannot accept: the specification's 4xx, its JSON-RPC error as the body
                await send_body(call.send, 400, refused.reply, {"content-type": "application/json"})
            return
        if self.stopping and await self._refused_stopping(call, decoded):
            return
        exchange = held.open_stream(self.bounds.streams_per_session, _id_of(decoded))
        self._handle(held.session, exchange, body)
        # A client that goes away leaves its call running (these revisions do not read a disconnect as a cancel),
        # and may resume its stream: GET with Last-Event-ID (`_resume_stream`).
        try:
            await answer(exchange, call.receive, call.send, stream=True, stream_after=self.bounds.stream_after_seconds,
                         keepalive=self.bounds.keepalive_seconds, status_of=lambda _: 200, headers={},
                         on_gone=lambda: None, poll_after=self._poll_after(held), prime=_primes(held))
        finally:
            held.settle(exchange)

    async def _open(self, call: _Call, body: bytes, decoded: dict[str, Any], sid: str | None) -> None:
        if sid is not None:
            await send_json_error(call.send, 400, INVALID_REQUEST, "initialize opens a session: send it without "
                                 "Mcp-Session-Id (the session you name goes on as it was)", _id_of(decoded))
            return
        outlet = Outlet()
        session = new_session(self._router, call.profile, call.principal, outlet)
        exchange = Exchange()
        self._handle(session, exchange, body)  # answered inline: the reply is in the exchange now
        reply = exchange.reply or b""
        record = session.record(call.principal.name) if session.era is Era.HANDSHAKE else None
        if record is None:  # initialize was refused
            session.abort()
            await send_body(call.send, 400, reply, {"content-type": "application/json"})
            return
        new_id = self._signer.issue(record)
        if not self._held.keep(new_id, Held(session, record, outlet)):
            session.abort()
            await send_json_error(call.send, 429, SERVER_BUSY, self._too_many(call), _id_of(decoded))
            return
        await send_body(call.send, 200, reply, {"content-type": "application/json", "mcp-session-id": new_id})

    async def _find(self, call: _Call, sid: str | None, msg_id: int | str | None) -> Held | None:
        """The session `sid` names, held here or resumed from its record; else the refusal is sent and None."""
        if sid is None:
            await send_json_error(call.send, 400, INVALID_REQUEST, "this request needs the Mcp-Session-Id header "
                                  "that initialize answered with (or MCP-Protocol-Version: 2026-07-28, which needs "
                                  "no session)", msg_id)
            return None
        held = self._held.get(sid)
        record = held.record if held is not None else self._signer.read(sid)
        if record is None or self._ended(sid) or record.profile != call.profile \
                or record.principal != call.principal.name:
            # Another credential's id is as unknown as a forged one: nothing says it exists.
            await send_json_error(call.send, 404, INVALID_REQUEST, f"no such session; {_NEW_SESSION}", msg_id)
            return None
        if held is None:
            held = await self._resume(call, sid, record, msg_id)
        else:
            self._held.touch(sid, held)
        return held

    async def _resume(self, call: _Call, sid: str, record: SessionRecord, msg_id: int | str | None) -> Held | None:
        live = self._router.live.snapshot.revision
        if record.revision != live:
            await send_json_error(call.send, 404, INVALID_REQUEST, f"this session was pinned to config revision "
                                  f"{record.revision[:12]}, which is no longer served (now {live[:12]}); "
                                  f"{_NEW_SESSION}", msg_id)
            return None
        held = self._held.resumed(record, call.principal)
        if not self._held.keep(sid, held):
            await send_json_error(call.send, 429, SERVER_BUSY, self._too_many(call), msg_id)
            return None
        return held

    async def _open_stream(self, call: _Call, held: Held) -> None:
        """GET without `Last-Event-ID`: the session's own stream, anew (`Outlet.new_stream`). A connection still
        sending the stream before it ends there (its exchange is closed): the newer GET takes the stream over, as
        a client reconnecting after a drop its server never noticed (a proxy's idle cut) must be able to."""
        exchange = held.outlet.new_stream(self.bounds.session_stream_events)
        if _primes(held):
            exchange.prime()
        await self._listen(call, held, exchange, 0)

    async def _listen(self, call: _Call, held: Held, exchange: Exchange, after: int) -> None:
        held.outlet.listening += 1
        try:
            await stream_session(exchange, after, call.receive, call.send, self.bounds.keepalive_seconds, {})
        finally:
            held.outlet.listening -= 1

    async def _resume_stream(self, call: _Call, held: Held, last_event_id: str) -> None:
        """GET with `Last-Event-ID`: the stream its client lost — a call's, or the session's own — from the event
        after that one, never another stream's. The specification lets a server replay or not; a stream delivered
        whole, dropped, or of another router, or events no longer kept, are refused 400, saying so, rather than
        opened empty or in part (the client would wait for its reply for ever, or miss messages unknowing)."""
        stream_id = last_event_id.strip().rpartition("/")[0]
        if held.outlet.stream is not None and stream_id == held.outlet.stream.stream_id:
            await self._resume_session_stream(call, held, held.outlet.stream, last_event_id)
            return
        exchange = held.streams.get(stream_id)
        if exchange is None and (lost := lost_call(stream_id)) is not None:
            await self._answer_lost(call, lost)
            return
        after = exchange.resumes_after(last_event_id) if exchange is not None else None
        if exchange is None or after is None:
            await send_body(call.send, 400, f"No stream of this session to resume after event {last_event_id[:80]!r}: "
                            "its reply was delivered already, or it was dropped (a router restarted, the session "
                            "was let go, or its GET stream was opened anew). Send the request again; for the "
                            "session's own stream, reopen it: GET without Last-Event-ID.\n".encode(),
                            {"content-type": "text/plain"})
            return
        try:
            await resume(exchange, after, call.receive, call.send, self.bounds.keepalive_seconds, {},
                         self._poll_after(held))
        finally:
            held.settle(exchange)

    async def _answer_lost(self, call: _Call, request_id: int | str) -> None:
        """A call's stream that another router process opened, resumed here: the call ran there (a router restarted,
        or the request came to another one), so its result is not here. Its request is answered on this stream with
        the error the bridge gives a call a restart cut off over stdio, so the client stops waiting for it."""
        lost = Exchange()
        lost.put(cut_off(request_id, LOST_CALL))
        await resume(lost, 0, call.receive, call.send, self.bounds.keepalive_seconds, {})

    async def _resume_session_stream(self, call: _Call, held: Held, exchange: Exchange, last_event_id: str) -> None:
        after = exchange.resumes_after(last_event_id)
        if after is None:
            kept = f"events {exchange.dropped + 1} to {exchange.count}" if exchange.log else "none yet"
            await send_body(call.send, 400, f"This session's stream cannot be resumed after event "
                            f"{last_event_id[:80]!r}: what came after it is no longer all kept (the stream keeps its "
                            f"last {self.bounds.session_stream_events} events; {kept} now), or it names no event of "
                            "the stream. Reopen the stream: GET without Last-Event-ID (what was written meanwhile is "
                            "lost).\n".encode(), {"content-type": "text/plain"})
            return
        await self._listen(call, held, exchange, after)

    def _poll_after(self, held: Held) -> float | None:
        """`HttpBounds.poll_after_seconds` for a session of 2025-11-25 on (the revision that lets a server end a
        stream for its client to resume), else None."""
        return self.bounds.poll_after_seconds if _primes(held) else None

    def _ended(self, sid: str) -> bool:
        """Whether the session was ended by DELETE, here or at any router sharing the state folder."""
        revocations = self._signer.revocations
        return self._held.ended(sid) or (revocations is not None and revocations.revoked(sid))

    async def _end(self, call: _Call, sid: str | None) -> None:
        held = await self._find(call, sid, None)
        if held is None or sid is None:
            return
        self._held.end(sid)
        if (revocations := self._signer.revocations) is not None:  # no router resumes it, this one restarted too
            await asyncio.to_thread(revocations.revoke, sid, held.record.revision,
                                    self._router.live.snapshot.revision)
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

    async def _refused_stopping(self, call: _Call, decoded: Mapping[str, Any]) -> bool:
        """Answer a call the router, stopping, does not run; False: the request is served. Over HTTP a request cannot
        wait unread for the next router, as a line on a pipe does, so it is told at once (`lifeline.STOPPING`)."""
        if decoded.get("method") != "tools/call" or (msg_id := _id_of(decoded)) is None:
            return False
        await send_body(call.send, 200, cut_off(msg_id, STOPPING), {"content-type": "application/json"})
        return True

    def _serving(self) -> list[Session]:
        """The sessions whose calls may be running: those held, and those of 2026-07-28 requests being served."""
        return [*self._held.sessions(), *self._one_off]

    async def quiesce(self) -> None:
        """Run no new call, and return once the calls in flight have finished (`Router.quiesce`, over HTTP): their
        replies go out on their streams, or wait there for their clients to resume them."""
        self.stopping = True
        await asyncio.gather(*(session.drain() for session in self._serving()))

    @property
    def calls_in_flight(self) -> int:
        return sum(len(session.tasks) for session in self._serving())

    async def aclose(self) -> None:
        self._held.close()
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


def _primes(held: Held) -> bool:
    """Whether the session's revision (2025-11-25 on) has a server open a stream with an event to resume from,
    and lets it end a stream for its client to resume."""
    return held.record.version >= "2025-11-25"


def _id_of(decoded: Mapping[str, Any]) -> int | str | None:
    value = decoded.get("id")
    return value if isinstance(value, int | str) and not isinstance(value, bool) else None


def _base_url(scope: Scope, headers: Headers) -> str:
    return f"{scope.get('scheme', 'http')}://{headers.text('host')}"
