"""Files that travel: `PUT /files/<profile>/<path>` writes a file into a profile's work folder, `GET` reads one back,
`DELETE` removes one (or an empty folder).

A caller on another machine cannot name a file on the router's disk, so it sends it first: the file lands in the
profile's scope at `<path>`, where a later call's `handler-file` argument names it, and what a call wrote there
(`handler-output-file`) is fetched the same way (`handler call --url` does both). The service's listener routes
`/files/` here, behind its Host, Origin and body guards (web/guards.py); `app.Service` mounts it.

Every request needs a bearer credential of that profile (`governance.credentials`), checked before anything else
of it is read. The path follows the rules of `handler-file` (docs/architecture.md §6, rule S4): relative to the
scope, no `..`, no empty or `.` segment, no NUL, not a folder's name; every folder is opened from its parent's
descriptor without following a link (`beneath`), so a symlink anywhere on the way is refused, never followed. A
write goes to a fresh temporary file in the target's folder, renamed over the target once whole: a reader sees the
old file or the new one, never half of one, and a symlink, FIFO or folder at the target is refused, not replaced.
An upload may be as large as the largest `maxFileBytes` of the profile's interfaces, the most any of its calls
would take; a `Content-Length` past it is refused before a byte is read, and a chunked body is cut when it passes.
A profile none of whose interfaces sets `maxFileBytes` takes no upload at all. `DELETE` lets a caller clear what it
put there (`handler call --url` removes its copies once the call is done), never through a link either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

import orjson

from reconciler.governance.credentials import CredentialError, Credentials, Principal
from reconciler.router.beneath import RefusedPathError, describe_mode, open_folder, open_regular
from reconciler.router.generation import Generation

__all__ = ["PREFIX", "FileTransfer"]

log = logging.getLogger("handler.router")

PREFIX: Final = "/files/"
_CHUNK: Final = 1 << 20
_DRAIN: Final = 1 << 20  # the most of a refused body read to answer on a connection that stays whole
_TEMPORARY: Final = ".handler-upload-"
_WRITE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _Refusal(Exception):  # noqa: N818 - an answer, not a failure: raised to end the request with it
    """The HTTP answer that ends a request: its status and the body saying what to do."""

    def __init__(self, status: int, text: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(text)
        self.status, self.text, self.headers = status, text, headers or {}


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a profile's files go, and the most an upload may carry (None: it takes none)."""

    root: str
    most: int | None


class FileTransfer:
    """The ASGI app of `/files/<profile>/<path>`; `live` gives the router's live generation."""

    def __init__(self, live: Callable[[], Generation], credentials: Credentials) -> None:
        self._live = live
        self.credentials = credentials

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            await self._serve(scope, receive, send)
        except _Refusal as refusal:
            await _answer(send, refusal.status, refusal.text.encode(), "text/plain; charset=utf-8", refusal.headers)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        if method not in ("GET", "HEAD", "PUT", "DELETE"):
            raise _Refusal(405, f"{method} is not served here: PUT uploads a file, GET downloads one, DELETE removes "
                           "one.\n", {"Allow": "GET, HEAD, PUT, DELETE"})
        profile, relative = _split(scope["path"])
        principal = await self._authenticate(scope, profile)
        place = self._place(principal.profile)
        parts = _parts(relative)
        if method == "PUT":
            written = await self._put(place, parts, scope, receive, principal)
            body = orjson.dumps({"path": relative, "bytes": written})
            await _answer(send, 201, body, "application/json")
        elif method == "DELETE":
            await asyncio.to_thread(_remove, place.root, parts)
            await _answer(send, 204, b"", "text/plain; charset=utf-8")
        else:
            await _send_file(send, place, parts, relative, head=method == "HEAD")

    async def _authenticate(self, scope: Scope, profile: str) -> Principal:
        headers = dict(_headers(scope))
        try:
            return await self.credentials.authenticate(headers.get("authorization"), profile,
                                                       base_url=_base_url(scope, headers))
        except CredentialError as exc:
            raise _Refusal(exc.status, str(exc), exc.headers) from None

    def _place(self, profile: str) -> _Place:
        view = self._live().views.get((profile, None))
        if view is None:  # the credential is good but the live configuration has no such profile now
            raise _Refusal(404, f"Profile {profile!r} is not served by the configuration live now.\n")
        plans = view.tools.values()
        limits = [p.limits.maxFileBytes for p in plans if p.limits.maxFileBytes is not None]
        return _Place(next(iter(plans)).scope.real, max(limits) if limits else None)

    async def _put(self, place: _Place, parts: list[str], scope: Scope, receive: Receive,
                   principal: Principal) -> int:
        if place.most is None:
            raise _Refusal(403, f"No interface of profile {principal.profile!r} sets maxFileBytes, so it takes no "
                           "file: nothing it serves reads one.\n")
        declared = dict(_headers(scope)).get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > place.most):
            raise _Refusal(413, f"The file is {declared} bytes; profile {principal.profile!r} takes at most "
                           f"{place.most} (the largest maxFileBytes of its interfaces).\n", {"Connection": "close"})
        folder, leaf = await asyncio.to_thread(_open_target, place.root, parts)
        try:
            return await _receive_into(folder, leaf, receive, place.most, principal.profile)
        finally:
            os.close(folder)


def _split(path: str) -> tuple[str, str]:
    """(profile, the path in its scope) of a request path `/files/<profile>/<path>`."""
    rest = path[len(PREFIX):] if path.startswith(PREFIX) else ""
    profile, _, relative = rest.partition("/")
    if not profile or not relative:
        raise _Refusal(404, "Name a file as /files/<profile>/<path in its work folder>, e.g. "
                       "/files/researcher/scans/invoice.png.\n")
    return profile, relative  # the server decoded the path once: decoding again would turn %252e into '.'


def _parts(relative: str) -> list[str]:
    """The folders and file name of a path in the scope, under the rules of `handler-file`; else 400."""
    if "\x00" in relative:
        raise _Refusal(400, "The path holds a NUL character; name a file in the work folder.\n")
    parts = relative.split("/")
    if parts[-1] == "":
        raise _Refusal(400, f"'{relative}' ends in '/', so it names a folder; name a file.\n")
    if any(p in ("", ".", "..") for p in parts):
        raise _Refusal(400, f"'{relative}' holds an empty, '.' or '..' segment; name a path inside the work "
                       "folder, relative to it, one name per segment.\n")
    if parts[-1].startswith(_TEMPORARY):
        raise _Refusal(400, f"'{parts[-1]}' is the name of an upload under way; choose another.\n")
    return parts


def _refused_path(relative: str, refusal: RefusedPathError, *, write: bool) -> _Refusal:
    if refusal.missing:
        if write:
            return _Refusal(409, "The profile's work folder does not exist on the router; its operator makes it.\n")
        return _Refusal(404, f"There is no file '{relative}' in the work folder.\n")
    if not refusal.final:
        return _Refusal(403, f"'{relative}' goes through {refusal.kind}, which is never followed; name a path of "
                        "folders and a regular file in the work folder.\n")
    return _Refusal(409, f"'{relative}' is {refusal.kind}, not a regular file; only regular files are read or "
                    "replaced.\n")


def _open_target(root: str, parts: list[str]) -> tuple[int, str]:
    """(descriptor of the target's folder, made where missing, its leaf name); a link on the way or at the leaf,
    or a leaf that is not a regular file, is refused."""
    relative = "/".join(parts)
    try:
        folder = open_folder(root, parts[:-1], create=True, mode=0o755)
    except (RefusedPathError, FileNotFoundError) as exc:
        refusal = exc if isinstance(exc, RefusedPathError) else RefusedPathError("nothing", final=False, missing=True)
        raise _refused_path(relative, refusal, write=True) from None
    try:
        mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return folder, parts[-1]
    if not stat.S_ISREG(mode):
        os.close(folder)
        raise _refused_path(relative, RefusedPathError(describe_mode(mode), final=True), write=True)
    return folder, parts[-1]


def _remove(root: str, parts: list[str]) -> None:
    """Remove the regular file or empty folder `parts` below `root`, walking down without following a link."""
    relative = "/".join(parts)
    try:
        folder = open_folder(root, parts[:-1])
    except (RefusedPathError, FileNotFoundError) as exc:
        refusal = exc if isinstance(exc, RefusedPathError) else RefusedPathError("nothing", final=False, missing=True)
        raise _refused_path(relative, refusal, write=False) from None
    try:
        mode = os.stat(parts[-1], dir_fd=folder, follow_symlinks=False).st_mode
        if stat.S_ISDIR(mode):
            os.rmdir(parts[-1], dir_fd=folder)
        elif stat.S_ISREG(mode):
            os.unlink(parts[-1], dir_fd=folder)
        else:
            raise _refused_path(relative, RefusedPathError(describe_mode(mode), final=True), write=False)
    except FileNotFoundError:
        raise _Refusal(404, f"There is no file '{relative}' in the work folder.\n") from None
    except OSError as exc:  # a folder that is not empty
        raise _Refusal(409, f"'{relative}' cannot be removed: {exc.strerror}.\n") from None
    finally:
        os.close(folder)


async def _receive_into(folder: int, leaf: str, receive: Receive, most: int, profile: str) -> int:
    """The body written to a temporary file beside `leaf`, renamed over it once whole; its size."""
    tmp = _TEMPORARY + secrets.token_hex(8)
    fd = os.open(tmp, _WRITE_FLAGS, 0o600, dir_fd=folder)
    written, renamed = 0, False
    try:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Refusal(400, "The client went away before the whole file arrived.\n")
            chunk = message.get("body", b"")
            written += len(chunk)
            if written > most:
                ended = not message.get("more_body", False) or await _drain(receive)
                raise _Refusal(413, f"The file is over {most} bytes, the most profile {profile!r} takes (the "
                               "largest maxFileBytes of its interfaces).\n", {} if ended else {"Connection": "close"})
            # Page-cache writes of at most one body chunk: short enough to leave on the loop.
            os.write(fd, chunk)
            if not message.get("more_body", False):
                break
        os.fchmod(fd, 0o644)
        os.close(fd)
        fd = -1
        os.replace(tmp, leaf, src_dir_fd=folder, dst_dir_fd=folder)
        renamed = True
    except IsADirectoryError:
        raise _Refusal(409, f"'{leaf}' became a folder during the upload; name a file.\n") from None
    except OSError as exc:  # a full disk, a quota
        raise _Refusal(507, f"The router could not store the file: {exc.strerror}.\n") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if not renamed:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=folder)
    return written


async def _drain(receive: Receive) -> bool:
    """Read and drop what is left of a refused body, up to `_DRAIN` bytes: a connection closed with the body unread
    is reset, and the client may lose the refusal with it. True when the body ended."""
    dropped = 0
    while dropped <= _DRAIN:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        dropped += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


async def _send_file(send: Send, place: _Place, parts: list[str], relative: str, *, head: bool) -> None:
    try:
        fd, size = await asyncio.to_thread(open_regular, place.root, parts)
    except RefusedPathError as refusal:
        raise _refused_path(relative, refusal, write=False) from None
    except FileNotFoundError:  # the work folder itself is missing
        raise _Refusal(404, f"There is no file '{relative}' in the work folder.\n") from None
    with os.fdopen(fd, "rb") as file:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream"),
                                (b"content-length", str(size).encode()), (b"cache-control", b"no-store")]})
        sent = 0
        while not head and sent < size:
            chunk = await asyncio.to_thread(file.read, min(_CHUNK, size - sent))
            if not chunk:  # shortened since it was opened: the server ends the connection short of its length
                log.warning("the file %s shrank while it was sent", relative)
                break
            sent += len(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})


def _headers(scope: Scope) -> list[tuple[str, str]]:
    return [(k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope.get("headers", [])]


def _base_url(scope: Scope, headers: dict[str, str]) -> str:
    """The service's address as this request reached it (the listener's Host guard has checked the name)."""
    return f"{scope.get('scheme', 'http')}://{headers.get('host', 'localhost')}"


async def _answer(send: Send, status: int, body: bytes, content_type: str,
                  headers: dict[str, str] | None = None) -> None:
    raw = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})
