"""Is a service running on this state folder, and what does it say now? (docs/architecture.md §8)

A running service holds an exclusive `flock` on `<state>/service.lock` for its whole life, and one on
`<run>/service.lock` (its run folder: sockets, call folders); the kernel lets go of
them when the process ends however it ends, so a lock that can be taken means no service runs there,
whatever files were left behind — which the next service may then clear. The lock files name the
holder (pid, start time, run folder) and its control socket, `<run>/service.sock` (0600): one JSON
line in, one out, answered from the living service (`{"ask": "status"}` → its status document;
`{"ask": "doctor"}` → the same after it ran its preflight again, in its own environment; `{"ask": "agent", ...}` →
what `handler agent` asks of the service's agent runs, answered by the service's `answers`).

`handler status` and `handler doctor` ask that socket; when the lock is free it says "not running" and shows the last
recorded state as history only.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.places import PRIVATE_FILE_MODE, open_private_file
from reconciler.wire.errors import HandlerError

__all__ = ["ControlServer", "Holder", "NotOursError", "ServiceLock", "ServiceRunningError", "ask_control",
           "ask_service", "holder_of"]

LOCK_NAME = "service.lock"
CONTROL_NAME = "service.sock"
_MAX_REPLY = 8 << 20
RECHECK_SECONDS = 60.0  # a preflight whose secret commands each answer within their own 15 s


class ServiceRunningError(HandlerError):
    """Another service holds this state folder."""


class NotOursError(HandlerError):
    """A folder whose service lock this user cannot read: another user's service's."""


@dataclass(frozen=True, slots=True)
class Holder:
    pid: int
    started: str
    run_dir: str
    control: str


class ServiceLock:
    """The state folder's and the run folder's service locks, held from `acquire` to `release` (or the process's
    end)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / LOCK_NAME
        self._fd: int | None = None
        self._run_fd: int | None = None

    def acquire(self, run_dir: Path) -> None:
        """Take the state folder's lock, then the run folder's, or raise `ServiceRunningError` naming who holds
        it; then record ourselves in both."""
        fd = open_private_file(self.path, os.O_RDWR | os.O_CREAT)
        if not _take(fd):
            os.close(fd)
            holder = holder_of(self.path.parent)
            who = f"pid {holder.pid}, started {holder.started}, run folder {holder.run_dir}" if holder else "another"
            raise ServiceRunningError(
                f"a handler service already runs on the state folder {self.path.parent} ({who}); stop it first, "
                "or give this one its own --state-dir (and --run-dir, --http)")
        if (run_dir / LOCK_NAME).resolve() == self.path.resolve():  # one folder for both: its lock is held
            run_fd = os.dup(fd)
        else:
            run_fd = open_private_file(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT)
        if not _take(run_fd):
            holder = _read_holder(run_fd)
            os.close(run_fd)
            os.close(fd)
            raise ServiceRunningError(
                f"a handler service already runs on the run folder {run_dir} (pid {holder.pid}, started "
                f"{holder.started}), where its sockets and call folders are; stop it first, or "
                "give this one its own --run-dir")
        record = json.dumps({"pid": os.getpid(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "runDir": str(run_dir), "control": str(run_dir / CONTROL_NAME)}).encode() + b"\n"
        for held in (fd, run_fd):
            os.ftruncate(held, 0)
            os.pwrite(held, record, 0)
        self._fd, self._run_fd = fd, run_fd

    def release(self) -> None:
        for fd in (self._run_fd, self._fd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                os.close(fd)  # closing the descriptor lets go of the lock
        self._fd = self._run_fd = None


def _take(fd: int) -> bool:
    """Take `fd`'s exclusive lock; False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def holder_of(state_dir: Path) -> Holder | None:
    """Who holds the state folder's service lock now, or None when no service runs there."""
    path = state_dir / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):  # no such folder: no service can hold it
        return None
    except PermissionError as exc:
        raise NotOursError(f"{state_dir} is not this user's to read ({exc.strerror}): run this as the user the service "
                           "runs as, or name a folder of your own (--state-dir, HANDLER_STATE_DIR)") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_holder(fd)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None  # nobody holds it: whatever the file says is history
    finally:
        os.close(fd)


def _read_holder(fd: int) -> Holder:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except ValueError:
        data = {}
    return Holder(int(data.get("pid", 0)), str(data.get("started", "?")), str(data.get("runDir", "?")),
                  str(data.get("control", "")))


class ControlServer:
    """The living service's answers on `<run>/service.sock`."""

    def __init__(self, path: Path, status: Callable[[], dict[str, Any]],
                 recheck: Callable[[], Awaitable[dict[str, Any]]] | None = None,
                 answers: Mapping[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] | None = None) -> None:
        self.path = path
        self._status = status
        self._answers = dict(answers or {})  # other asks, by name: the line in, its reply out
        self._recheck = recheck  # `{"ask": "doctor"}`: the preflight again, in the service, then its status
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a socket left by a service that died: the lock says it is gone
        self._server = await asyncio.start_unix_server(self._answer, path=str(self.path))
        self.path.chmod(PRIVATE_FILE_MODE)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            try:
                message = json.loads(line)
                ask = message.get("ask")
            except (ValueError, AttributeError):
                message, ask = {}, None
            reply: dict[str, Any]
            if isinstance(ask, str) and ask in self._answers:
                reply = await self._answers[ask](message)
            elif ask == "doctor" and self._recheck is not None:
                reply = {"status": await asyncio.wait_for(self._recheck(), RECHECK_SECONDS)}
            else:
                reply = {"status": self._status()} if ask == "status" else {"error": "ask for 'status' or 'doctor'"}
            writer.write(json.dumps(reply).encode() + b"\n")
            await writer.drain()
        except (TimeoutError, ConnectionError, ValueError):  # ValueError: a line over the reader's limit
            pass
        finally:
            writer.close()


def ask_service(holder: Holder, timeout: float = 5.0, ask: str = "status") -> dict[str, Any] | None:
    """The living service's status (`ask="doctor"`: after it ran its preflight again), or None when its control
    socket does not answer."""
    reply = ask_control(holder, {"ask": ask}, timeout)
    status = reply.get("status") if reply is not None else None
    return status if isinstance(status, dict) else None


def ask_control(holder: Holder, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any] | None:
    """The living service's reply to one line on its control socket, or None when it does not answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(holder.control)
            sock.sendall(json.dumps(message).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n") and len(data) < _MAX_REPLY:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        reply = json.loads(data)
    except (OSError, ValueError):
        return None
    return reply if isinstance(reply, dict) else None
