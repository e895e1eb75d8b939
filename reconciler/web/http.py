"""The HTTP listener of `handler up`: `/healthz`, `/status`, `/metrics`, the git push webhook `/hooks/git`, the
agents' MCP endpoints `/mcp/<profile>` (an ASGI app the service hands in: the router's) and, with a governance
store, the dashboard and the channels' endpoints (`dashboard`). `handler serve --http` serves `/healthz` and the
MCP endpoints alone (`build_mcp_app`).

A Starlette app served by uvicorn inside the service's own event loop (its signal handling is left
to the service, which stops everything in order). `HttpListener` puts every request through the
`guards` first (a `Host` allow-list, the agents' routes' `Origin` check, then body limits), and refuses to
listen beyond this machine without `HANDLER_DASHBOARD_TOKEN` (`ListenerError`, raised before anything starts).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from reconciler.config.errors import HandlerError
from reconciler.gitops.webhook import verify_signature
from reconciler.governance.credentials import Credentials
from reconciler.governance.errors import StoreError
from reconciler.web.activation import ActivationError, inherited_socket
from reconciler.web.dashboard import PAGE_HEADERS, Dashboard, Desk
from reconciler.web.guards import (
    BodyLimiter,
    BodyLimits,
    ConnectionLimits,
    HostAllowList,
    OriginAllowList,
    allowed_hosts,
    guarded_connections,
    is_loopback,
)
from reconciler.web.metrics import CONTENT_TYPE_LATEST, MetricsSources, bearer_allowed, render_metrics
from reconciler.web.resource import agents_routes

__all__ = ["BodyLimits", "ConnectionLimits", "HttpListener", "ListenerError", "ListenerSettings", "WebApp", "build_app",
           "build_mcp_app"]

log = logging.getLogger("handler.http")


WebApp = Starlette  # what `build_app` makes: the rooms above name it without importing Starlette


def build_app(
    status: Callable[[], dict[str, Any]],
    *,
    webhook_secret: bytes | None,
    on_push: Callable[[], Awaitable[None]] | None,
    desk: Desk | None = None,
    metrics: MetricsSources | None = None,
    token: str | None = None,
    mcp: ASGIApp | None = None,
    credentials: Credentials | None = None,
    files: ASGIApp | None = None,
) -> Starlette:
    """The ASGI app. `on_push` is awaited for a verified push (None: the source is not git); `metrics` serves
    `/metrics`; `mcp` the agents' MCP endpoints, `credentials` and `files` their file routes and resource metadata
    (`resource.agents_routes`). `/status` and `/metrics` are read by a member signed in to the dashboard, or by a
    machine sending `token` (HANDLER_DASHBOARD_TOKEN) as a bearer token; `/healthz` by anyone (it says nothing but
    that the service answers)."""
    dashboard = Dashboard(desk, status) if desk is not None else None
    may_read = _reader(token, dashboard)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def status_route(request: Request) -> Response:
        if not may_read(request):
            return _reader_refusal(token is not None)
        return JSONResponse(status())

    async def metrics_route(request: Request) -> Response:
        if not may_read(request):
            return _reader_refusal(token is not None)
        assert metrics is not None  # noqa: S101 - routed only with sources
        return Response(await render_metrics(metrics), media_type=CONTENT_TYPE_LATEST)

    routes: list[BaseRoute] = [
        Route("/healthz", healthz),
        Route("/status", status_route),
        Route("/hooks/git", _push_hook(webhook_secret, on_push), methods=["POST"]),
    ]
    if metrics is not None:
        routes.append(Route("/metrics", metrics_route))
    if mcp is not None:
        routes.append(Route("/mcp/{profile}", _Endpoint(mcp)))
    routes += agents_routes(credentials, files)
    handlers: dict[Any, Any] = {StoreError: _store_unavailable, 404: _not_found, 405: _not_found}
    if dashboard is not None:
        routes += dashboard.routes()
        handlers.update({404: dashboard.not_found, 405: dashboard.not_found})
    return Starlette(routes=routes, exception_handlers=handlers)


def _push_hook(webhook_secret: bytes | None,
               on_push: Callable[[], Awaitable[None]] | None) -> Callable[[Request], Awaitable[Response]]:
    """`/hooks/git`: a push announced by the forge, its `X-Hub-Signature-256` checked before `on_push` runs."""

    async def hook(request: Request) -> Response:
        body = await request.body()
        if not webhook_secret:
            return JSONResponse({"error": "the webhook is off: start with HANDLER_WEBHOOK_SECRET set"}, status_code=403)
        if not verify_signature(webhook_secret, body, request.headers.get("x-hub-signature-256")):
            log.warning(
                "webhook: refused a request from %s with a missing or wrong X-Hub-Signature-256",
                request.client.host if request.client else "?",
            )
            return JSONResponse({"error": "signature mismatch"}, status_code=401)
        event = request.headers.get("x-github-event", "push")
        if event == "ping":
            return JSONResponse({"ok": True, "pong": True})
        if event != "push" or on_push is None:
            return JSONResponse({"ok": True, "ignored": event}, status_code=202)
        await on_push()
        return JSONResponse({"ok": True, "fetching": True}, status_code=202)

    return hook


def build_mcp_app(mcp: ASGIApp) -> Starlette:
    """`handler serve --http`: `/healthz` and the MCP endpoints, nothing of the dashboard."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    return Starlette(routes=[Route("/healthz", healthz), Route("/mcp/{profile}", _Endpoint(mcp))])


class _Endpoint:
    """An ASGI app as a route's whole endpoint, every method its own to answer (Starlette takes a function or
    method, a bound one included, for a request handler of GET alone)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


async def _not_found(request: Request, exc: Exception) -> Response:
    """A path nothing serves, without a dashboard: said in plain text, with the pages' security headers."""
    return Response(f"there is nothing at {request.url.path}; /healthz and /status are served here\n",
                    status_code=getattr(exc, "status_code", 404), media_type="text/plain", headers=PAGE_HEADERS)


def _reader(token: str | None, dashboard: Dashboard | None) -> Callable[[Request], bool]:
    """Who may read `/status` and `/metrics`: a machine with the token as its bearer, or a member signed in. Both
    name every profile and binding, the plan and which secrets are missing: not for any local user."""

    def may_read(request: Request) -> bool:
        if token is not None and bearer_allowed(token, request.headers.get("authorization")):
            return True
        return dashboard is not None and dashboard.signed_in(request) is not None

    return may_read


def _reader_refusal(has_token: bool) -> Response:
    machine = ("send HANDLER_DASHBOARD_TOKEN as a bearer token: the header `Authorization: Bearer <the token>` (curl "
               "-H; in Prometheus, authorization: {credentials: <the token>})" if has_token else
               "start the service with HANDLER_DASHBOARD_TOKEN set to a long random secret and send it as a bearer "
               "token (`Authorization: Bearer <the token>`)")
    return Response("this page names every profile, binding and missing secret, so it is read by a member of the org "
                    "signed in to the dashboard (`handler dashboard login --member NAME` prints a sign-in link) or, "
                    f"for a machine, with a token: {machine}\n",
                    status_code=401, headers={"WWW-Authenticate": "Bearer"}, media_type="text/plain")


async def _store_unavailable(request: Request, exc: Exception) -> Response:
    """A page that needs the store while it cannot be read (down, restarting, a lock held past the timeout): 503,
    saying so, rather than a bare 500 and a traceback."""
    log.warning("%s %s: the store cannot be read now: %s", request.method, request.url.path, exc)
    return Response(f"The governance store cannot be read now: {exc}\nThis page works again once it answers; "
                    "`handler status` says more.\n", status_code=503, media_type="text/plain",
                    headers={"Retry-After": "5"})


class ListenerError(HandlerError):
    """The listener cannot start as asked (an address beyond this machine without a token)."""


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """What the listener's guards need besides its address."""

    token: str | None = None  # HANDLER_DASHBOARD_TOKEN: required to listen beyond loopback
    public_url: str | None = None  # HANDLER_PUBLIC_URL: its host is allowed in `Host`
    limits: BodyLimits = field(default_factory=BodyLimits)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ListenerSettings:
        return cls(env.get("HANDLER_DASHBOARD_TOKEN", "").strip() or None,
                   env.get("HANDLER_PUBLIC_URL", "").strip() or None)


def check_exposure(host: str, port: int, settings: ListenerSettings) -> None:
    """Raise `ListenerError` for an address beyond this machine without a dashboard token: the pages show
    holds and their arguments, and decide with a session (docs/architecture.md §7)."""
    if settings.token is None and not is_loopback(host):
        raise ListenerError(
            f"--http {host}:{port} would listen beyond this machine with the dashboard open to anyone who reaches "
            "it: set HANDLER_DASHBOARD_TOKEN to a long random secret, or listen on loopback (--http 127.0.0.1:8765)")


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the service owns SIGINT/SIGTERM and stops this server itself


class HttpListener:
    """Runs an ASGI app on host:port as a task of the current event loop, behind the `guards`.

    `settings` defaults to the environment's (`ListenerSettings.from_env`). Raises `ListenerError` for
    a non-loopback `host` without a dashboard token, when the app serves the dashboard (`dashboard`)."""

    def __init__(self, app: Starlette, host: str, port: int, settings: ListenerSettings | None = None, *,
                 dashboard: bool = True) -> None:
        settings = ListenerSettings.from_env(os.environ) if settings is None else settings
        if dashboard:  # without one, every route but /healthz asks for a credential of its own
            check_exposure(host, port, settings)
        guarded = HostAllowList(OriginAllowList(BodyLimiter(app, settings.limits), settings.public_url),
                                allowed_hosts(host, settings.public_url))
        config = uvicorn.Config(guarded, host=host, port=port, log_level="warning", access_log=False, lifespan="off",
                                http=guarded_connections(settings.connections))
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self.inherited = False  # the socket is the service manager's (`activation`): it outlives this process

    def bind(self) -> None:
        """Take the port now, before the service writes anything: the socket a service manager passed for it
        (`activation`), else one made here; a port in use is a `ListenerError` that says which option chooses
        another."""
        config = self._server.config
        try:
            self._socket = inherited_socket(config.host, config.port)
        except ActivationError as exc:
            raise ListenerError(str(exc)) from None
        self.inherited = self._socket is not None
        if self.inherited:
            return
        try:
            family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
            self._socket = socket.create_server((config.host.strip("[]"), config.port), family=family)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ListenerError(f"{config.host}:{config.port} is already in use (another handler up, or another "
                                    "program); choose another address with --http HOST:PORT") from None
            raise ListenerError(f"cannot listen on {config.host}:{config.port}: {exc.strerror}; choose another "
                                "address with --http HOST:PORT") from None

    async def serve(self) -> None:
        """Serve until `stop()`, on the socket `bind` took (or one uvicorn takes now)."""
        await self._server.serve(sockets=[self._socket] if self._socket is not None else None)

    async def start(self, timeout: float = 10.0) -> None:
        """Serve in a task of this loop; return once listening. What stops it first (a port in use, an
        address that is not this machine's) is raised here."""
        self._task = task = asyncio.create_task(self.serve())
        async with asyncio.timeout(timeout):
            while not self.started and not task.done():  # uvicorn says it is up by a flag, not an event
                await asyncio.sleep(0.01)
        if task.done():
            task.result()

    async def aclose(self, timeout: float = 5.0) -> None:
        """Stop serving and wait (up to `timeout` seconds) for the task `start` began."""
        self.stop()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._task, timeout=timeout)
        if self._socket is not None:  # taken by `bind`, and never served when the start failed after it
            self._socket.close()
            self._socket = None

    @property
    def started(self) -> bool:
        return self._server.started

    @property
    def port(self) -> int:
        servers = getattr(self._server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return self._server.config.port

    def stop(self) -> None:
        self._server.should_exit = True

    def stop_accepting(self) -> None:
        """The service is stopping: on a socket the service manager holds, accept no more connections (those open
        are served on), so a new one waits in the kernel's queue for the next service rather than meet this one's
        stop. On a socket of its own it accepts on: a new connection is told the router is stopping, not refused."""
        if self.inherited:
            for server in getattr(self._server, "servers", []):
                server.close()
