"""An MCP session's record, signed, as the session's id: what any router sharing the state folder needs to resume it.

The Streamable HTTP transport (`streamable`) issues the id at `initialize` and reads it back on every later
request. The id is the record itself (profile, the credential it was opened with, protocol version, the
client's capabilities, the config revision it is pinned to, its agent run) with an HMAC-SHA256 under a key kept
in the state folder (`http-sessions.key`, 0600), so a router that did not open the session — the same one after
a restart, or another sharing the state — resumes it without a table of sessions anywhere. A record whose
revision is no longer served is read, then refused by the transport, which tells the client so. The same record
is what a bridge hands over to a new router to carry a stdio session across a restart (`lifeline`, docs/router.md
"Restarts").

An id its client ended (DELETE) is revoked in the same folder (`http-sessions.ended`, 0600: one line per id, its
revision and its digest), so no router sharing it, and no router started there again, resumes it. A revoked id
matters only while its revision is served or a router still holds its session: the lines of other revisions than
the live one and the revoked session's are dropped when the next id is revoked.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

__all__ = ["ENDED_NAME", "KEY_NAME", "Revocations", "SessionRecord", "SessionSigner", "load_key"]

KEY_NAME: Final = "http-sessions.key"
ENDED_NAME: Final = "http-sessions.ended"
_KEY_BYTES: Final = 32
_MOST_ENDED: Final = 100_000  # ids revoked kept in the file at most; the oldest are forgotten past it
_MOST_ID_CHARS: Final = 4096  # a record is a few hundred bytes; a longer id is not one of ours


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """What a session is, beyond its calls: enough to serve its next request anywhere the key is."""

    profile: str
    principal: str  # the credential's name: an id is good only with a credential of that name
    version: str  # the protocol version `initialize` settled
    revision: str  # the config revision it was pinned to
    instance: str  # the agent run its calls count under (the credential's, else one per session)
    capabilities: dict[str, Any] = field(default_factory=dict)  # the client's, from its `initialize`
    issued: int = 0
    nonce: str = ""


class Revocations:
    """The ids ended by DELETE, kept in a file of the state folder that every router sharing it reads (the module's
    docstring). Read again only when the file changed: a request costs one `stat`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[int, int] | None = None  # (mtime_ns, size) of the file as last read
        self._digests: frozenset[str] = frozenset()

    def revoked(self, session_id: str) -> bool:
        self._refresh()
        return _digest(session_id) in self._digests

    def revoke(self, session_id: str, revision: str, live: str | None = None) -> None:
        """Add the id of a session pinned to `revision`, and keep only the lines of that revision and of the `live`
        one (by default the same: the others are refused on resumption anyway; a session held in memory is pinned to
        one of them, its own), at most `_MOST_ENDED` of them, under an exclusive lock of the file so that two routers
        revoking at once both keep theirs."""
        keep = (f"{revision} ", f"{live or revision} ")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        with os.fdopen(fd, "r+", encoding="ascii") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            kept = [line for line in handle.read().splitlines() if line.startswith(keep)]
            kept.append(f"{revision} {_digest(session_id)}")
            handle.seek(0)
            handle.truncate()
            handle.write("".join(f"{line}\n" for line in kept[-_MOST_ENDED:]))
        self._seen = None

    def _refresh(self) -> None:
        try:
            found = self.path.stat()
        except FileNotFoundError:
            self._seen, self._digests = None, frozenset()
            return
        if (found.st_mtime_ns, found.st_size) == self._seen:
            return
        with self.path.open(encoding="ascii") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            lines = handle.read().splitlines()
        self._seen = (found.st_mtime_ns, found.st_size)
        self._digests = frozenset(line.partition(" ")[2] for line in lines)


class SessionSigner:
    """Makes and reads session ids under one key; `revocations`, where the ids ended by DELETE are kept."""

    def __init__(self, key: bytes, revocations: Revocations | None = None) -> None:
        self._key = key
        self.revocations = revocations

    def issue(self, record: SessionRecord) -> str:
        if not record.nonce:
            record = SessionRecord(**{**asdict(record), "issued": int(time.time()), "nonce": secrets.token_hex(8)})
        payload = _b64(orjson.dumps(asdict(record)))
        return f"{payload}.{self._sign(payload)}"

    def read(self, session_id: str) -> SessionRecord | None:
        """The record an id carries, or None when it is not an id this key signed (forged, cut, another key's)."""
        if len(session_id) > _MOST_ID_CHARS:
            return None
        payload, _, signature = session_id.partition(".")
        if not hmac.compare_digest(signature.encode(), self._sign(payload).encode()):
            return None
        try:
            fields = orjson.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
            return SessionRecord(**fields)
        except (ValueError, TypeError):  # signed by us but of another shape: an older router's
            return None

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode(), hashlib.sha256).digest())


def load_key(state_dir: Path) -> bytes:
    """The key in `state_dir`, made (0600, never replaced) when missing; every router sharing the folder reads it.

    Written whole to a file of its own, then linked into place: two routers starting at once read the same key."""
    path = state_dir / KEY_NAME
    if not path.exists():
        draft = state_dir / f".{KEY_NAME}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(_KEY_BYTES))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass  # another router's won
        finally:
            draft.unlink()
    return path.read_bytes()


def _digest(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
