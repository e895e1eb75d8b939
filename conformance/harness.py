"""One real router and one real connector process per test process (each pytest-xdist worker its own).

`Harness.start` writes the check's workspace (see `workspace`), serves the test pages its cases read
(see `pages`: the binding under check may reach those addresses alone), starts a `Router` on it in an event
loop the harness owns, and starts the binding's connector before the first item, so its start-up
is not charged to a call's time limit. `Harness.call` sends one `tools/call` over the profile's unix
socket, as an agent's bridge would, and runs the loop until the reply: the router and the client
share that loop, so nothing runs between calls and no thread is needed.

A hook on the router's connector pool records what reached the connector during a call (the
arguments it received and its raw result): how the runner proves that invalid inputs were refused
before the connector saw them, and shows a connector's actual output when the router refused it.
After a call the router ended with `timeout` or `crashed`, the connector is restarted, so that one
hung or dead process does not fail the examples after it: every input is judged on its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar

import orjson

from conformance.errors import CheckError
from conformance.pages import PageServer, allow_pages, serve_pages
from conformance.replies import Dispatch, Reply
from conformance.workspace import Subject, Workspace, build_workspace
from reconciler.config import Snapshot, effective_limits
from reconciler.config.errors import HandlerError
from reconciler.config.eventloop import new_event_loop
from reconciler.connectors.errors import ConnectorError
from reconciler.connectors.pool import ConnectorPool
from reconciler.router.server import Router
from reconciler.wire import meta as meta_keys
from reconciler.wire.client import LineClient
from reconciler.wire.errors import JsonRpcError

__all__ = ["NO_REPLY_MARGIN", "Harness"]

NO_REPLY_MARGIN = 10.0  # seconds past the interface's own time limit before the client gives up on the router
_RESTART_CAUSES = frozenset({"timeout", "crashed", "no_reply"})
_T = TypeVar("_T")


_TAIL_BYTES = 16_384  # of the connector's stderr log, however much it wrote before it died
_TAIL_LINE = 400  # characters of each line shown


def _stderr_tail(path: Path, lines: int = 12) -> str:
    """The last lines a connector wrote to its stderr (the router's log of them, secrets masked), for an error."""
    try:
        with path.open("rb") as log:
            log.seek(max(0, log.seek(0, os.SEEK_END) - _TAIL_BYTES))
            said = log.read().decode(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        said = []
    if not said:
        return "; it wrote nothing to its stderr"
    return "; the last of its stderr:\n" + "\n".join(f"    {line[:_TAIL_LINE]}" for line in said)


class Harness:
    """A router serving one check's workspace, and a client per interface version's profile."""

    def __init__(self, subject: Subject) -> None:
        self.subject = subject
        self.folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="h"))  # short: unix socket paths are ~107 bytes
        self.start_error: str | None = None
        self._loop = new_event_loop()
        self._clients: dict[str, LineClient] = {}
        self._instances = itertools.count(1)
        self._old_path = os.environ.get("PATH")
        # The router logs each connector failure as a warning; the check reports them itself, once.
        self._logger = logging.getLogger("handler")
        self._old_level = self._logger.level
        self._router: Router | None = None
        self._tap: _Tap | None = None
        self._pages: PageServer | None = None
        self.workspace: Workspace | None = None

    @classmethod
    def start(cls, subject: Subject) -> Harness:
        harness = cls(subject)
        try:
            harness._start()
        except BaseException:
            harness.close()
            raise
        return harness

    def _start(self) -> None:
        workspace = build_workspace(self.subject, self.folder / "tree")
        self._pages, addresses = serve_pages(self.subject.interfaces, workspace.folder)
        snapshot = allow_pages(workspace.snapshot, self.subject.binding.name, addresses,
                               list(self.subject.connector.spec.egress))
        self.workspace = dataclasses.replace(workspace, snapshot=snapshot)
        # `python3` in a connector's command is the Python running the check (its venv holds the SDK),
        # as it is for a router started from the project's environment.
        self._logger.setLevel(logging.ERROR)
        os.environ["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), self._old_path]))
        self._router = Router(self.workspace.snapshot, root=self.subject.root.absolute(), run_dir=self.folder / "run",
                              state_dir=self.folder / "state")
        self._run(self._router.start())
        self._tap = _Tap(self._router.services.pool, self.workspace.snapshot, self.subject.binding.name)
        self.start_error = self._run(self._tap.warm_up())
        if self.start_error is not None:
            self._run(asyncio.sleep(0.2))  # what it wrote as it ended is still on its way through the pipe
            logged = self.folder / "state/connectors" / f"{self.subject.binding.name}.stderr.log"
            self.start_error += _stderr_tail(logged)

    def workspace_profiles(self) -> frozenset[str]:
        """The interface versions this router serves a profile for: the subject's, and its helpers'."""
        return frozenset(self.workspace.profiles) if self.workspace is not None else frozenset()

    def time_limit(self, key: str) -> float:
        """The call time limit the router applies to interface version `key` on this binding."""
        iface = self.subject.source.interfaces[key]
        helper = next((h for h in self.subject.helpers if h.iface.key == key), None)
        limits = effective_limits(iface.spec, (helper.binding if helper is not None else self.subject.binding).spec)
        return float(limits.timeoutSeconds or 300.0)

    def call(self, key: str, tool: str, arguments: Mapping[str, Any]) -> Reply:
        """Call `tool` of interface version `key` through the router; the reply and what reached the connector."""
        return self._run(self._call(key, tool, arguments))

    async def _call(self, key: str, tool: str, arguments: Mapping[str, Any]) -> Reply:
        if self._router is None or self._tap is None or self.workspace is None:
            raise CheckError("the harness was closed, or never started")
        client = self._clients.get(key)
        if client is None:
            client = self._clients[key] = await _open_client(self._router.socket_path(self.workspace.profiles[key]))
        self._tap.begin()
        limit = self.time_limit(key) + NO_REPLY_MARGIN
        started = time.perf_counter()
        # Each call is its own agent run, so per-run limits (maxCallsPerRun) never end a long fuzz run.
        params = {"name": tool, "arguments": arguments, "_meta": {meta_keys.INSTANCE: f"check-{next(self._instances)}"}}
        result: dict[str, Any] = {}
        protocol_error: dict[str, Any] | None = None
        try:
            result = await client.request("tools/call", params, asyncio.get_running_loop().time() + limit)
        except JsonRpcError as exc:
            protocol_error = exc.to_wire()
        except (TimeoutError, ConnectionError):
            client.close()
            del self._clients[key]
            body = {"error": "unavailable", "message": f"the router gave no reply within {limit:.0f} s"}
            result = {"isError": True, "_meta": {meta_keys.CAUSE: "no_reply"},
                      "content": [{"type": "text", "text": orjson.dumps(body).decode()}]}
        reply = Reply(result=result, seconds=time.perf_counter() - started, dispatched=self._tap.end(),
                      protocol_error=protocol_error)
        if reply.cause in _RESTART_CAUSES:
            await self._tap.restart()
        return reply

    def close(self) -> None:
        """Stop the router and the connector, remove the workspace, restore PATH."""
        try:
            for client in self._clients.values():
                client.close()
            if self._router is not None:
                self._run(self._router.aclose())
        finally:
            self._clients.clear()
            self._router = None
            if self._pages is not None:
                self._pages.close()
            with contextlib.suppress(RuntimeError):
                self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()
            self._logger.setLevel(self._old_level)
            if self._old_path is None:
                os.environ.pop("PATH", None)
            else:
                os.environ["PATH"] = self._old_path
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, coro: Coroutine[Any, Any, _T]) -> _T:
        return self._loop.run_until_complete(coro)


async def _open_client(path: Path) -> LineClient:
    """An MCP client on a profile's socket, as an agent's bridge would be (its replies may be large)."""
    client = await LineClient.connect_unix(path, name="the router", max_line_bytes=64 * 1024 * 1024)
    await client.initialize({"name": "handler-conformance", "version": "1"},
                            deadline=asyncio.get_running_loop().time() + 30.0)
    return client




class _Tap:
    """Records each call that reaches the binding's connector process, through the pool's dispatch hook.

    The hook stays on the process across its restarts, so every dispatch is seen, however the
    pipeline finds the connector.
    """

    def __init__(self, pool: ConnectorPool, snapshot: Snapshot, binding: str) -> None:
        self._pool, self._snapshot, self._binding = pool, snapshot, binding
        self._seen: list[Dispatch] = []
        pool.on_dispatch(self._record)

    async def warm_up(self) -> str | None:
        """Start the binding's connector now; the reason it could not start, if it could not."""
        try:
            await self._pool.connector(self._snapshot, self._binding)
        except ConnectorError as exc:
            return exc.message
        return None

    def begin(self) -> None:
        self._seen.clear()

    def end(self) -> tuple[Dispatch, ...]:
        return tuple(self._seen)

    async def restart(self) -> None:
        """A fresh connector process after a hang or a crash (the next call would start one anyway)."""
        with contextlib.suppress(HandlerError, OSError):
            await self._pool.restart(self._snapshot, self._binding)

    async def _record(self, name: str, arguments: Mapping[str, Any],
                      call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
        shown = orjson.loads(orjson.dumps(arguments))
        try:
            result = await call
        except ConnectorError as exc:
            self._seen.append(Dispatch(name, shown, None, f"{exc.cause}: {exc.message}"))
            raise
        except (TimeoutError, asyncio.CancelledError):
            self._seen.append(Dispatch(name, shown, None, "cut off by the router (its time limit)"))
            raise
        self._seen.append(Dispatch(name, shown, result))
        return result
