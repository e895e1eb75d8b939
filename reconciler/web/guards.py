"""What every request to the listener passes before any route sees it; `http.HttpListener` wraps its app in these.

- `HostAllowList`: the `Host` header must name this service (its own address, loopback, or the host of
  `HANDLER_PUBLIC_URL`), else 400. A page on evil.example whose name is made to resolve to 127.0.0.1
  (DNS rebinding) sends `Host: evil.example` and so reads nothing (docs/architecture.md §7: the
  dashboard shows holds and their arguments).
- `OriginAllowList`: a request to an agents' route (`/mcp`, `/files/`) that carries an `Origin` header must come
  from this service's own origin (the `Host` it was sent to, or `HANDLER_PUBLIC_URL`'s), else 403: a page of
  another origin cannot call the endpoints, even with a token in hand (the MCP specification's DNS-rebinding rule).
  Agents' clients send no `Origin`; browsers always do on such requests.
- `BodyLimiter`: a body over its limit is refused before it is read (a `Content-Length` over it: 413
  at once), or cut as it arrives (a chunked body: a running count, 413 when it passes the limit), and
  a body that takes longer than `BodyLimits.seconds` to arrive is cut with 408. Nothing buffers a
  whole body the limit has not already allowed.

Both are plain ASGI, so they apply to every route, the dashboard's and the hooks' alike. Beneath them,
`guarded_connections` makes uvicorn's HTTP/1.1 connection guard itself (on httptools, the C parser: h11 served a
quarter of its requests a second), before any request exists: a client must send a whole request head within
`ConnectionLimits.head_seconds` of connecting (or of its last request) or it gets 408 and is closed, and past
`ConnectionLimits.most` connections open at once a new one gets 503 and is closed at once. Without them a client
that opens connections and never finishes a head held a descriptor each for ever, until the process ran out of
them and the router's own sockets could accept no agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from reconciler.config.errors import HandlerError
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES

__all__ = ["BodyLimiter", "BodyLimits", "ConnectionLimits", "HostAllowList", "OriginAllowList", "allowed_hosts",
           "guarded_connections", "is_loopback", "is_wildcard"]

_log = logging.getLogger("handler.http")
_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - recognised here, never bound
_CLOSE = {"Connection": "close"}  # a refused body is left unread: the connection cannot carry another request


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The most a request body may carry, by route, and how long it may take to arrive."""

    hooks: int = 1 << 20  # /hooks/*: a push event or a Slack click; GitHub's own pushes stay well under
    forms: int = 64 << 10  # every other route: the dashboard's forms are a few fields
    mcp: int = DEFAULT_MAX_LINE_BYTES  # /mcp/*: one JSON-RPC message, as large as a socket's line may be
    seconds: float = 10.0  # for the whole body, from the route's first read
    # /files/*: the ceiling; the route refuses past the profile's largest maxFileBytes before reading (router/transfer)
    uploads: int = 1 << 32
    upload_seconds: float = 600.0  # a file of tens of megabytes over a slow link

    def limit_for(self, path: str) -> int:
        if path.startswith("/mcp/"):
            return self.mcp
        if path.startswith("/files/"):
            return self.uploads
        return self.hooks if path.startswith("/hooks/") else self.forms

    def seconds_for(self, path: str) -> float:
        return self.upload_seconds if path.startswith("/files/") else self.seconds


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How many connections the listener holds at once, and how long one may take to send a request head."""

    most: int = 256  # the dashboard's users and the hooks' senders are a few; the router's sockets need descriptors
    head_seconds: float = 10.0  # a head is one packet from any real client


def guarded_connections(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools HTTP/1.1 protocol with `limits` applied to every connection (the module's docstring)."""

    class Guarded(_GuardedHttpTools):
        most, head_seconds = limits.most, limits.head_seconds

    return Guarded


class _GuardedHttpTools(HttpToolsProtocol):
    most: int
    head_seconds: float
    _head_timer: asyncio.TimerHandle | None = None
    _refused_at = 0.0  # when the last refusal was logged, for all connections: once a minute under a flood

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.most:
            now = self.loop.time()
            if now - _GuardedHttpTools._refused_at > 60:
                _GuardedHttpTools._refused_at = now
                _log.warning("the HTTP listener holds %d connections, its most: refusing new ones until some close",
                             self.most)
            self._answer_and_close(503, f"This service holds {self.most} connections already; retry in a moment.\n")
            return
        self._await_head()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._await_head()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _owes_head(self) -> bool:
        """Whether the client owes a whole request head: none came yet, or the last one is answered and no
        pipelined one waits. A head arriving in pieces is still owed until its last header is in."""
        answered = self.cycle is None or self.cycle.response_complete
        return answered and not self.pipeline and not self.transport.is_closing()

    def _await_head(self) -> None:
        """Arm the head's deadline while the client owes a request head; disarm it once the head is in."""
        if self._owes_head():
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(self.head_seconds, self._head_late)
        else:
            self._stop_head_timer()

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if self._owes_head():
            self._answer_and_close(408, f"No whole request arrived within {self.head_seconds:g} seconds.\n")

    def _answer_and_close(self, status: int, text: str) -> None:
        body = text.encode()
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        self.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                             b"Connection: close\r\n\r\n%s" % (status, reason, len(body), body))
        self.transport.close()


def is_wildcard(host: str) -> bool:
    """Whether `host` (as given to `--http`) listens on every address of the machine."""
    return _bare(host) in _WILDCARDS


def is_loopback(host: str) -> bool:
    """Whether `host` (as given to `--http`) is reachable from this machine only."""
    name = _bare(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:  # a name other than localhost may resolve anywhere
        return False


def allowed_hosts(listen_host: str, public_url: str | None) -> frozenset[str]:
    """The names a `Host` header may carry (any port): loopback, the listener's own address and, when
    set, the host of `HANDLER_PUBLIC_URL`. Listening on every address adds the machine's names, which
    `channels.Channels.set_public_url` puts in links when no public URL is set."""
    names = set(_LOOPBACK_NAMES)
    if is_wildcard(listen_host):
        names.update(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n)
    else:
        names.add(_bare(listen_host))
    if public_url and (public := urlsplit(public_url).hostname):
        names.add(public.lower())
    return frozenset(names)


def _bare(host: str) -> str:
    """A host name as compared here: lower case, no IPv6 brackets, no trailing dot."""
    return host.strip().strip("[]").rstrip(".").lower()


def host_name(header: str) -> str:
    """The name in a `Host` header, without its port."""
    value = header.strip()
    if value.startswith("["):
        return _bare(value.partition("]")[0])
    name, colon, port = value.rpartition(":")
    return _bare(name if colon and port.isdigit() else value)


class HostAllowList:
    """Answers 400 to a request whose `Host` is not one of `allowed` (see `allowed_hosts`)."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        self.allowed = frozenset(allowed)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get("host", "")
        if host_name(given) in self.allowed:
            await self.app(scope, receive, send)
            return
        text = (f"Host {given[:100]!r} is not one this service answers to (it answers to "
                f"{', '.join(sorted(self.allowed))}). To reach it under another name, set HANDLER_PUBLIC_URL "
                "to the address people use, e.g. https://approvals.example.org, and restart it.\n")
        await PlainTextResponse(text, status_code=400, headers=_CLOSE)(scope, receive, send)


_AGENTS_ROUTES = ("/mcp", "/files/")
_DEFAULT_PORTS = {"http": "80", "https": "443"}


class OriginAllowList:
    """Answers 403 to a request of an agents' route whose `Origin` is not this service's (the module's docstring)."""

    def __init__(self, app: ASGIApp, public_url: str | None) -> None:
        self.app = app
        self.public = _origin_of(public_url) if public_url else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_AGENTS_ROUTES):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        given = None if origin is None else _origin_of(origin)
        own = _origin_of(f"{scope['scheme']}://{headers.get('host', '')}")
        # `Origin: null` (a sandboxed frame, a file: page) and what does not parse are no origin of ours
        if origin is None or (given is not None and given in (self.public, own)):
            await self.app(scope, receive, send)
            return
        text = (f"Origin {origin[:100]!r} is not this service's: a page of another site may not call its agents' "
                "endpoints. Call them from an agent's MCP client (which sends no Origin), or from a page this "
                "service serves.\n")
        await PlainTextResponse(text, status_code=403, headers=_CLOSE)(scope, receive, send)


def _origin_of(url: str) -> tuple[str, str, str] | None:
    """(scheme, host, port) of an origin or URL, the port made explicit; None for `null` or what does not parse."""
    parts = urlsplit(url.strip())
    try:
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return (parts.scheme, _bare(parts.hostname), str(port) if port is not None else _DEFAULT_PORTS[parts.scheme])


class _BodyRefusedError(HandlerError):
    """Raised into the route by a read that broke a limit, after the refusal was sent; `BodyLimiter` ends it."""


class BodyLimiter:
    """Refuses a body over `limits` (413) or too slow to arrive (408), reading no more of it than allowed."""

    def __init__(self, app: ASGIApp, limits: BodyLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.limit_for(scope["path"])
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and ((size := _size(declared)) is None or size > limit):
            await _refuse(scope, send, *_declared_refusal(size, limit))
            return
        reader = _LimitedBody(scope, receive, send, limit, self.limits.seconds_for(scope["path"]))
        with contextlib.suppress(_BodyRefusedError):  # the refusal went out; what the route sent after it was dropped
            await self.app(scope, reader.receive, reader.send)


_PAST_ANY_LIMIT = 1 << 62


def _size(declared: str) -> int | None:
    """A Content-Length's bytes (ASCII digits: `str.isdigit` also takes "²", which `int` refuses), None when it is
    not a number; past 18 digits, more than any limit (`int` refuses a string of 4,300)."""
    text = declared.strip()
    if not (text.isascii() and text.isdigit()):
        return None
    return int(text) if len(text) <= 18 else _PAST_ANY_LIMIT


def _declared_refusal(size: int | None, limit: int) -> tuple[int, str]:
    if size is None:
        return 400, "Content-Length is not a number.\n"
    said = f"{size} bytes" if size < _PAST_ANY_LIMIT else "more than 18 digits of bytes"
    return 413, f"The body is {said}; this route takes at most {limit}.\n"


class _LimitedBody:
    """The route's `receive` and `send` for one request: counts the body as it comes and cuts it at
    the limit or the deadline, answering in the route's stead."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, limit: int, seconds: float) -> None:
        self.scope, self._receive, self._send = scope, receive, send
        self.limit, self.seconds = limit, seconds
        self.received = 0
        self.complete = False  # the whole body is in: reads now only wait for a disconnect
        self.deadline: float | None = None
        self.started = False  # the route began its response
        self.refused = False  # we answered instead: the route's messages are dropped

    async def receive(self) -> Message:
        if self.complete:
            return await self._receive()
        loop = asyncio.get_running_loop()
        if self.deadline is None:
            self.deadline = loop.time() + self.seconds
        try:
            async with asyncio.timeout_at(self.deadline):
                message = await self._receive()
        except TimeoutError:
            await self.refuse(408, f"The body did not arrive within {self.seconds:g} seconds.\n")
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                await self.refuse(413, f"The body is over {self.limit} bytes, the most this route takes.\n")
            self.complete = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def refuse(self, status: int, text: str) -> NoReturn:
        """Answer `status` unless the route already began its answer, then stop the route."""
        if not self.started:
            await _refuse(self.scope, self._send, status, text)
        self.refused = True
        raise _BodyRefusedError(text)


async def _refuse(scope: Scope, send: Send, status: int, text: str) -> None:
    async def nothing() -> Message:  # the response reads no body
        return {"type": "http.disconnect"}

    await PlainTextResponse(text, status_code=status, headers=_CLOSE)(scope, nothing, send)
