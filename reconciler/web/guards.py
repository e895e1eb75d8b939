"""What every request to the listener passes before any route sees it; `http.HttpListener` wraps its app in these.

- `HostAllowList`: the `Host` header must name this service (its own address, loopback, or the host of
  `HANDLER_PUBLIC_URL`), else 400. A page on evil.example whose name is made to resolve to 127.0.0.1
  (DNS rebinding) sends `Host: evil.example` and so reads nothing (docs/architecture.md §7: the
  dashboard shows holds and their arguments).
- `BodyLimiter`: a body over its limit is refused before it is read (a `Content-Length` over it: 413
  at once), or cut as it arrives (a chunked body: a running count, 413 when it passes the limit), and
  a body that takes longer than `BodyLimits.seconds` to arrive is cut with 408. Nothing buffers a
  whole body the limit has not already allowed.

Both are plain ASGI, so they apply to every route, the dashboard's and the hooks' alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reconciler.config.errors import HandlerError

__all__ = ["BodyLimiter", "BodyLimits", "HostAllowList", "allowed_hosts", "is_loopback", "is_wildcard"]

_LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
_WILDCARDS = frozenset({"", "0.0.0.0", "::"})  # noqa: S104 - recognised here, never bound
_CLOSE = {"Connection": "close"}  # a refused body is left unread: the connection cannot carry another request


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The most a request body may carry, by route, and how long it may take to arrive."""

    hooks: int = 1 << 20  # /hooks/*: a push event or a Slack click; GitHub's own pushes stay well under
    forms: int = 64 << 10  # every other route: the dashboard's forms are a few fields
    seconds: float = 10.0  # for the whole body, from the route's first read

    def limit_for(self, path: str) -> int:
        return self.hooks if path.startswith("/hooks/") else self.forms


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
        if declared is not None and (not declared.strip().isdigit() or int(declared) > limit):
            await _refuse(scope, send, *_declared_refusal(declared, limit))
            return
        reader = _LimitedBody(scope, receive, send, limit, self.limits.seconds)
        with contextlib.suppress(_BodyRefusedError):  # the refusal went out; what the route sent after it was dropped
            await self.app(scope, reader.receive, reader.send)


def _declared_refusal(declared: str, limit: int) -> tuple[int, str]:
    if not declared.strip().isdigit():
        return 400, "Content-Length is not a number.\n"
    return 413, f"The body is {declared.strip()} bytes; this route takes at most {limit}.\n"


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
