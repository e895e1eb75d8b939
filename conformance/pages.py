"""The test pages a check serves: an interface's `conformance/pages/`, at the loopback addresses its cases name.

web-fetch/v1's cases read `http://127.0.0.1:28461/article.html` and the like. `Harness.start` calls
`serve_pages` before the router starts: each address is served by a thread of the check's own process
(SO_REUSEPORT, so the workers of `-n auto` each serve it, and one ending does not take the pages away
from another), and `allow_pages` lets the binding under check reach exactly those addresses — its
egress otherwise untouched — so a connector passes under its shipped binding (the egress proxy
refuses loopback unless a binding names the very address: docs/architecture.md §6).
"""

from __future__ import annotations

import functools
import socket
import threading
from dataclasses import replace
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from conformance.errors import CheckError
from reconciler.config import InterfaceVersion, Snapshot

__all__ = ["PageServer", "allow_pages", "page_addresses", "serve_pages"]

PAGES_FOLDER = "pages"


def page_addresses(iface: InterfaceVersion) -> list[tuple[str, int]]:
    """The loopback (host, port) pairs the interface's cases call, when it has a `conformance/pages/` to serve."""
    if not any(rel.startswith(PAGES_FOLDER + "/") for rel in iface.fixtures):
        return []
    found: set[tuple[str, int]] = set()
    for case in iface.cases:
        for value in case.input.values():
            parts = urlsplit(value) if isinstance(value, str) and value.startswith("http://") else None
            if parts is not None and parts.hostname == "127.0.0.1" and parts.port:
                found.add((parts.hostname, parts.port))
    return sorted(found)


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class _SharedPortServer(ThreadingHTTPServer):
    daemon_threads = True

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()


class PageServer:
    """The threads serving one folder of pages at some addresses; `close` stops them."""

    def __init__(self) -> None:
        self._servers: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def serve(self, folder: Path, address: tuple[str, int]) -> None:
        try:
            server = _SharedPortServer(address, functools.partial(_Quiet, directory=str(folder)))
        except OSError as exc:
            raise CheckError(f"cannot serve the test pages at http://{address[0]}:{address[1]}/ ({exc.strerror}); "
                             "a program other than a check holds that port: stop it and run the check again") from None
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        self._servers.append((server, thread))

    def close(self) -> None:
        for server, thread in self._servers:
            server.shutdown()
            server.server_close()
            thread.join()
        self._servers.clear()


def serve_pages(interfaces: tuple[InterfaceVersion, ...], tree: Path) -> tuple[PageServer, list[str]]:
    """Serve each interface's pages (from the workspace copy under `tree`); the server and the addresses."""
    server = PageServer()
    allowed: list[str] = []
    try:
        for iface in interfaces:
            for address in page_addresses(iface):
                server.serve(tree / iface.folder / "conformance" / PAGES_FOLDER, address)
                allowed.append(f"{address[0]}:{address[1]}")
    except BaseException:
        server.close()
        raise
    return server, allowed


def allow_pages(snapshot: Snapshot, binding: str, addresses: list[str], connector_egress: list[str]) -> Snapshot:
    """`snapshot` with the binding's egress widened by the page addresses alone (the check's own servers)."""
    if not addresses:
        return snapshot
    found = snapshot.bindings[binding]
    egress = list(found.spec.egress if found.spec.egress is not None else connector_egress)
    spec = found.spec.model_copy(update={"egress": [*egress, *(a for a in addresses if a not in egress)]})
    bindings = dict(snapshot.bindings)
    bindings[binding] = replace(found, spec=spec)
    return replace(snapshot, bindings=MappingProxyType(bindings))
