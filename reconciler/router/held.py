"""The sessions the Streamable HTTP endpoint holds between requests, and what bounds them.

`streamable.McpEndpoint` answers the HTTP surface; what it keeps from one request to the next is here:
`HeldSessions` maps a session id to its `Session` (the very class a unix socket's connection serves), the
outlet its writes go to and its signed record (`resumption`); it opens sessions at `initialize`, rebuilds one
from its record when the id comes to a router that does not hold it, lets the least recently used idle one go
past a credential's bound (it resumes from its id) and remembers the ids ended here. `Budget` counts the requests
open per profile and per credential. `HttpBounds` is every number of both. A session also keeps the streams of its
calls that are not yet delivered whole (`Held.streams`), and the last events of its own GET stream (`Outlet.stream`),
for a client that lost one to resume it. A call's stream id names the router process that opened it and the request
it answers (`call_stream_id`), so a router that never held it, the same one restarted or another sharing the state,
answers that request, saying its result is lost (`lost_call`), as the bridge does over stdio.
"""

from __future__ import annotations

import base64
import binascii
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

import orjson

from reconciler.governance.credentials import Principal
from reconciler.router.exchanges import CURRENT, Exchange
from reconciler.router.hub import Hub
from reconciler.router.resumption import SessionRecord
from reconciler.router.sessions import Session
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES
from reconciler.wire.meta import INSTANCE

__all__ = ["Budget", "Held", "HeldSessions", "HttpBounds", "Outlet", "call_stream_id", "lost_call"]

_MOST_ENDED = 100_000  # ids ended here, refused rather than resumed; the oldest are forgotten past it
_ROUTER: Final = secrets.token_urlsafe(6)  # this router process, in its calls' stream ids
_MOST_NAMED_ID: Final = 256  # characters of a request id's encoding a stream id carries; a longer id is not named


@dataclass(frozen=True)
class HttpBounds:
    """What one profile and one credential may hold of the endpoint at once, as the sockets bound a client."""

    max_body_bytes: int = DEFAULT_MAX_LINE_BYTES  # one message, as a socket's line
    requests_per_profile: int = 512  # open requests and streams: a profile's socket takes 512 connections
    requests_per_credential: int = 256  # one credential: as many calls as one connection may run
    sessions_per_credential: int = 64  # held in memory; an idle one past it is let go, and resumes from its id
    idle_seconds: float = 600.0  # a session idle this long is let go too (its generation with it), and resumes
    stream_after_seconds: float = 5.0  # a call still running then answers as an SSE stream, kept alive
    keepalive_seconds: float = 15.0
    # 2025-11-25 sessions: a call's stream still open this long is ended after an event the client resumes from
    # (GET with Last-Event-ID), so no connection is held through a long call; None: held until the reply
    poll_after_seconds: float | None = None
    streams_per_session: int = 64  # streams a client lost and may resume; the oldest is dropped past it
    # a session's GET stream keeps its last events this many, for a client that lost it to resume (Last-Event-ID)
    session_stream_events: int = 100


class Outlet:
    """Where a handshake-era session's writes go: the request that caused them, else its GET stream, which keeps its
    last events, sent or not, for a client that loses it (from the session's first GET on: before it, they are
    dropped)."""

    def __init__(self) -> None:
        self.stream: Exchange | None = None
        self.listening = 0  # connections sending the GET stream now

    def new_stream(self, keep: int) -> Exchange:
        """A GET stream of a stream id of its own (`<id>/<n>` event ids, unique in the session), keeping its last
        `keep` events. The stream before it is forgotten with what it kept: a GET without Last-Event-ID names no
        place in it, and the specification has no message replayed on another stream than its own."""
        if self.stream is not None:
            self.stream.close()
        self.stream = Exchange(stream_id=new_stream_id(), keep=keep)
        return self.stream

    def write(self, data: bytes) -> None:
        exchange = CURRENT.get()
        if exchange is None:
            exchange = self.stream
        if exchange is not None:
            exchange.put(data)


@dataclass
class Held:
    session: Session
    record: SessionRecord
    outlet: Outlet
    used: float = field(default_factory=time.monotonic)
    # the calls' streams not yet delivered whole, by stream id: a client that lost one resumes it from here
    streams: OrderedDict[str, Exchange] = field(default_factory=OrderedDict)

    def open_stream(self, most: int, request_id: int | str | None) -> Exchange:
        """A resumable exchange for request `request_id` of this session, kept until its reply is delivered
        (`settle`)."""
        exchange = Exchange(stream_id=call_stream_id(request_id))
        self.streams[exchange.stream_id or ""] = exchange
        while len(self.streams) > most:
            self.streams.popitem(last=False)[1].close()
        return exchange

    def settle(self, exchange: Exchange) -> None:
        """Forget `exchange` once nothing of it is left to resume: its reply delivered, or no event with an id sent
        (a client that saw none cannot name where to resume)."""
        if exchange.delivered or exchange.closed or not exchange.log:
            self.streams.pop(exchange.stream_id or "", None)
            exchange.close()

    @property
    def idle(self) -> bool:
        """No call running and no connection on its GET stream: letting it go loses nothing its id cannot bring
        back but the events its GET stream kept (a resume of that stream is then refused, saying so)."""
        return not self.session.tasks and not self.outlet.listening


class Budget:
    """Open requests by profile and by credential."""

    def __init__(self, bounds: HttpBounds) -> None:
        self._bounds = bounds
        self._profiles: dict[str, int] = {}
        self._credentials: dict[tuple[str, str], int] = {}

    def take(self, profile: str, credential: str) -> str | None:
        key = (profile, credential)
        if self._profiles.get(profile, 0) >= self._bounds.requests_per_profile:
            return f"profile {profile!r} has {self._bounds.requests_per_profile} requests open over HTTP already"
        if self._credentials.get(key, 0) >= self._bounds.requests_per_credential:
            return f"the credential {credential!r} has {self._bounds.requests_per_credential} requests open already"
        self._profiles[profile] = self._profiles.get(profile, 0) + 1
        self._credentials[key] = self._credentials.get(key, 0) + 1
        return None

    def give(self, profile: str, credential: str) -> None:
        key = (profile, credential)
        self._profiles[profile] -= 1
        self._credentials[key] -= 1
        if not self._credentials[key]:
            del self._credentials[key]


def new_stream_id() -> str:
    """A stream's id: 72 random bits, so none repeats in a session, whichever of its streams it names."""
    return secrets.token_urlsafe(9)


def call_stream_id(request_id: int | str | None) -> str:
    """The id of the stream answering `request_id`: this router process's mark, 72 random bits and the request's id
    (base64url of its JSON; none of them holds the "." or the "/" of an event id). A request id too long to carry
    leaves its stream unnamed: a resume of it that comes to another router is refused like any unknown stream."""
    try:
        named = base64.urlsafe_b64encode(orjson.dumps(request_id)).rstrip(b"=").decode()
    except orjson.JSONEncodeError:  # an integer past 64 bits, which no JSON-RPC line this router reads carries
        return new_stream_id()
    if request_id is None or len(named) > _MOST_NAMED_ID:
        return new_stream_id()
    return f"{_ROUTER}.{new_stream_id()}.{named}"


def lost_call(stream_id: str) -> int | str | None:
    """The request a call's stream answered, when another router process opened it (this one never held it, so the
    call ran there and its result is not here); None when this one did (its reply was delivered or it was dropped
    here, and the client is told so), or when the id names no request. A client can name any request of its own
    session so, and learns only that a result is lost."""
    router, _, rest = stream_id.partition(".")
    named = rest.partition(".")[2]
    if not named or router == _ROUTER or len(named) > _MOST_NAMED_ID:
        return None
    try:
        request_id = orjson.loads(base64.urlsafe_b64decode(named + "=" * (-len(named) % 4)))
    except (binascii.Error, ValueError):
        return None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        return None
    return request_id


def new_session(router: Hub, profile: str, principal: Principal, outlet: Outlet) -> Session:
    """A session of `profile` writing to `outlet`, bound to the credential's agent run, which a request may not
    override (as the bridge's tags on a socket)."""
    return Session(router, profile, outlet.write, {INSTANCE: principal.instance} if principal.instance else None)


class HeldSessions:
    """The sessions held in memory, by id (the module's docstring)."""

    def __init__(self, router: Hub, bounds: HttpBounds) -> None:
        self._router = router
        self.bounds = bounds
        self._sessions: dict[str, Held] = {}
        self._by_credential: dict[tuple[str, str], OrderedDict[str, None]] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()

    def get(self, sid: str) -> Held | None:
        return self._sessions.get(sid)

    def ended(self, sid: str) -> bool:
        return sid in self._ended

    def touch(self, sid: str, held: Held) -> None:
        held.used = time.monotonic()
        self._by_credential[(held.record.profile, held.record.principal)].move_to_end(sid)

    def resumed(self, record: SessionRecord, principal: Principal) -> Held:
        """A session rebuilt from its record, as it was after its `initialize` (not yet held: `keep` it)."""
        outlet = Outlet()
        session = new_session(self._router, record.profile, principal, outlet)
        session.resume(record)  # the transport checked the revision is live
        return Held(session, record, outlet)

    def keep(self, sid: str, held: Held) -> bool:
        """Hold `held` under `sid`, letting the credential's least recently used idle session go past its bound;
        False when all of them are busy."""
        self._let_go_idle()
        ids = self._by_credential.setdefault((held.record.profile, held.record.principal), OrderedDict())
        if len(ids) >= self.bounds.sessions_per_credential:
            idle = next((old for old in ids if self._sessions[old].idle), None)
            if idle is None:
                return False
            self.let_go(idle)
        self._sessions[sid] = held
        ids[sid] = None
        return True

    def end(self, sid: str) -> None:
        """DELETE: let the session go, and refuse its id from now on rather than resume it."""
        self.let_go(sid)
        self._ended[sid] = None
        while len(self._ended) > _MOST_ENDED:
            self._ended.popitem(last=False)

    def let_go(self, sid: str) -> None:
        held = self._sessions.pop(sid)
        key = (held.record.profile, held.record.principal)
        ids = self._by_credential[key]
        del ids[sid]
        if not ids:
            del self._by_credential[key]
        if held.outlet.stream is not None:
            held.outlet.stream.close()
        for exchange in held.streams.values():
            exchange.close()
        held.session.abort()

    def _let_go_idle(self) -> None:
        """Let go the sessions nobody used for `idle_seconds`: a client that never ends its session keeps no
        generation pinned for ever (its connectors could never drain). Each resumes from its id if it comes back."""
        horizon = time.monotonic() - self.bounds.idle_seconds
        for sid in [sid for sid, held in self._sessions.items() if held.used < horizon and held.idle]:
            self.let_go(sid)

    def sessions(self) -> list[Session]:
        """The sessions held now."""
        return [held.session for held in self._sessions.values()]

    def close(self) -> None:
        for sid in list(self._sessions):
            self.let_go(sid)
