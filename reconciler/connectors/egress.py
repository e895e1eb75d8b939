"""The egress allow-list proxy: a connector reaches the network only through it (docs/architecture.md §4 `egress`).

The router runs one proxy per sandboxed connector process, listening on a unix socket (a path socket
crosses network namespaces). It speaks enough HTTP proxying for every client library: `CONNECT
host:port` for TLS and absolute-form `GET http://host:port/...` for plain HTTP. A destination
outside the binding's egress entries (`host:port`, `*` for a host or a port) is refused with 403
and logged with its host and port; an allowed one is dialled from the router's network.

The router's network is the host's: its loopback holds the router's own listeners, PostgreSQL and
whatever else serves only this machine. So a name is resolved first and the address checked: a
loopback, private, link-local or otherwise non-global address is refused unless an entry names that
exact address (`127.0.0.1:2525`), whatever `*` allows. An IPv6 address is global only inside global
unicast (2000::/3) and outside 6to4, Teredo and the documentation ranges: NAT64, IPv4-compatible,
IPv4-mapped and site-local forms are refused whichever IPv4 address they embed (`is_global_address`).
The proxy then dials the address it checked, never the name again, so a second DNS answer cannot
swap it (docs/architecture.md §6).

A connector is not trusted to use the proxy gently: it may hold `MAX_CONNECTIONS` connections through
it at once (each costs the router two descriptors; one more is answered 503 and closed), a request's
head must arrive within `HEAD_SECONDS` (else 408), and only its first `LOGGED_REFUSALS` refusals are
logged one by one (every one is still counted in `refused`, the last 100 kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from reconciler.config.reach import egress_allows, is_global_address, names_address

__all__ = ["EgressProxy", "allowed_address", "egress_allows", "is_global_address", "names_address"]

log = logging.getLogger("handler.egress")

_MAX_HEAD = 64 * 1024
_DIAL_TIMEOUT = 15.0
MAX_CONNECTIONS = 64  # open at once through one connector process's proxy
HEAD_SECONDS = 30.0  # for a request's head to arrive
LOGGED_REFUSALS = 20  # refusals logged one by one, per proxy


async def allowed_address(entries: Sequence[str], host: str, port: int) -> str | None:
    """The first address of `host` that `entries` let a connector reach (a global one, or one an entry names
    itself), or None if none is. Raises OSError when the name does not resolve."""
    infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    for *_, sockaddr in infos:
        address = str(sockaddr[0])
        if is_global_address(address) or names_address(entries, address, port):
            return address
    return None


class EgressProxy:
    """Serves the allow-list for one connector process on `socket_path`."""

    def __init__(self, socket_path: Path, entries: Sequence[str], owner: str) -> None:
        self.socket_path = socket_path
        self.entries = tuple(entries)
        self.owner = owner  # the binding, for the log
        self.refused: list[str] = []  # host:port refused, newest last (bounded)
        self.refusals = 0  # how many, since it started
        self.turned_away = 0  # connections over MAX_CONNECTIONS, answered 503
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.socket_path))
        self.socket_path.chmod(0o600)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # ended here, not left to be destroyed pending
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if len(self._tasks) >= MAX_CONNECTIONS:
            self.turned_away += 1
            if self.turned_away == 1:
                log.warning("egress: binding '%s' holds %d connections through its proxy, the most it may; more are "
                            "answered 503", self.owner, MAX_CONNECTIONS)
            await _reply(writer, 503, f"Service Unavailable: this connector has {MAX_CONNECTIONS} connections open "
                         "through its egress proxy, the most it may; close one first")
            writer.close()
            return
        if task is not None:
            self._tasks.add(task)
        try:
            await self._handle(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            if task is not None:
                self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_SECONDS):
                head = await reader.readuntil(b"\r\n\r\n")
        except TimeoutError:
            await _reply(writer, 408, f"Request Timeout: no request head within {HEAD_SECONDS:.0f} s")
            return
        if len(head) > _MAX_HEAD:
            await _reply(writer, 431, "Request Header Fields Too Large")
            return
        asked = _destination(head)
        if isinstance(asked, str):
            await _reply(writer, 400, f"Bad Request: {asked}")
            return
        host, port, forward = asked
        if not egress_allows(self.entries, host, port):
            await self._refuse(writer, host, port, "which is not in this connector's egress")
            return
        try:
            async with asyncio.timeout(_DIAL_TIMEOUT):
                address = await self._checked_address(host, port)
                if address is None:
                    await self._refuse(writer, host, port, "which resolves to an address of this machine or its "
                                       "private network that the egress does not name (name the address itself)")
                    return
                up_reader, up_writer = await asyncio.open_connection(address, port)
        except (OSError, TimeoutError) as exc:
            await _reply(writer, 502, f"Bad Gateway: {host}:{port} could not be reached ({exc})")
            return
        try:
            if forward:
                up_writer.write(forward)
            else:
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await writer.drain()
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()


    async def _checked_address(self, host: str, port: int) -> str | None:
        return await allowed_address(self.entries, host, port)

    async def _refuse(self, writer: asyncio.StreamWriter, host: str, port: int, why: str) -> None:
        self.refused.append(f"{host}:{port}")
        del self.refused[:-100]
        self.refusals += 1
        if self.refusals <= LOGGED_REFUSALS:
            log.warning("egress refused: binding '%s' tried %s:%d, %s%s", self.owner, host, port, why,
                        "; its further refusals are counted, not logged" if self.refusals == LOGGED_REFUSALS else "")
        await _reply(writer, 403, f"Forbidden: {host}:{port}, {why}")


def _destination(head: bytes) -> tuple[str, int, bytes] | str:
    """Where a request's head asks to go: (host, port, what to send there first: nothing for CONNECT, the
    request in origin form for plain HTTP); else what is wrong with it."""
    request_line, _, rest = head.partition(b"\r\n")
    method, target, version = request_line.decode("latin-1").split(" ", 2)
    if method.upper() == "CONNECT":
        host, _, port_text = target.rpartition(":")
        port = _port(port_text)
        return (host, port, b"") if host and port else "CONNECT names host:port, the port from 1 to 65535"
    url = urlsplit(target)
    if url.scheme != "http" or not url.hostname:
        return "a proxy request names an absolute http:// URL"
    try:
        given = url.port
    except ValueError:  # out of range, or not a number
        given = 0
    if given == 0:  # `or 80` took an explicit ':0' for http's own port
        return "the URL's port is not a number from 1 to 65535"
    port = 80 if given is None else given
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    return url.hostname, port, f"{method} {path} {version}\r\n".encode("latin-1") + _strip_proxy_headers(rest)


def _port(text: str) -> int | None:
    """A port from 1 to 65535 written in ASCII digits; None for anything else (`int` also takes '+80' and ' 80')."""
    return int(text) if text.isascii() and text.isdigit() and 0 < int(text) < 65536 else None


def _strip_proxy_headers(rest: bytes) -> bytes:
    lines = rest.split(b"\r\n")
    kept = [line for line in lines if not line.lower().startswith((b"proxy-connection:", b"proxy-authorization:"))]
    return b"\r\n".join(kept)


async def _reply(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = reason.encode() + b"\n"
    writer.write(f"HTTP/1.1 {status} {reason.partition(':')[0]}\r\ncontent-type: text/plain\r\ncontent-length: "
                 f"{len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    with contextlib.suppress(ConnectionError):
        await writer.drain()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if writer.can_write_eof():
                writer.write_eof()
