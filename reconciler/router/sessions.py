"""One agent session: a connection to a profile's socket, its era, its pinned generation, its calls.

`Session.handle` receives each framed line. The first request pins the session to the generation
live at that moment, so a reload only affects sessions that start after it. The era settles at the
first request that is accepted: `initialize` opens the initialize era; a request carrying the
2026-07-28 `_meta` envelope opens the stateless era. Quick methods are answered inline; each
`tools/call` runs as a task, so calls of a session proceed concurrently and replies may come back
out of order, matched by id. `notifications/cancelled` cancels a call in flight (no reply is sent; the connector
is told in turn). A call whose `_meta` carries a `progressToken` hears progress while it runs (`progress`).
The interface's skill is served as a resource and a prompt (`protocol`); a session whose bridge says the
built-in tools are served elsewhere (`handler/builtins`) lists and runs none of them.

`record` is what the session is, as a `resumption.SessionRecord` (both transports make it here), and
`resume` goes on from one without a new `initialize`: pinned to the generation that serves the record's
revision, or, when that revision is no longer served, answering each request with why and what to do.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from reconciler.router.generation import Generation, View
from reconciler.router.hub import Hub
from reconciler.router.outcomes import EncodedResult
from reconciler.router.pipeline import Caller, run_tools_call
from reconciler.router.progress import Progress
from reconciler.router.protocol import (
    Era,
    ServedSkill,
    discover_result,
    get_prompt_result,
    has_envelope,
    initialize_result,
    list_prompts_result,
    list_resources_result,
    list_templates_result,
    negotiate_handshake,
    read_envelope,
    read_resource_result,
    refuse_other_era,
)
from reconciler.router.resumption import SessionRecord
from reconciler.wire.errors import INVALID_PARAMS, INVALID_REQUEST, METHOD_NOT_FOUND, JsonRpcError
from reconciler.wire.messages import (
    IdentifiedError,
    Message,
    encode_error,
    encode_raw_result,
    encode_result,
    parse_message,
)
from reconciler.wire.meta import (
    BUILTINS,
    BUILTINS_ELSEWHERE,
    INSTANCE,
    INTERFACE,
    PARENT_INSTANCE,
    SECRET,
    minted_run_id,
    run_id_problem,
    secret_digest,
)
from reconciler.wire.versions import HANDSHAKE_VERSIONS

__all__ = ["Session"]


_SKILL_METHODS: dict[str, Callable[[tuple[ServedSkill, ...], Mapping[str, Any] | None, bool], dict[str, Any]]] = {
    "resources/list": lambda skills, _params, stateless: list_resources_result(skills, stateless),
    "resources/templates/list": lambda _skills, _params, stateless: list_templates_result(stateless),
    "resources/read": read_resource_result,
    "prompts/list": lambda skills, _params, stateless: list_prompts_result(skills, stateless),
    "prompts/get": get_prompt_result,
}


_HANDSHAKE_METHODS = frozenset({"ping", "tools/list", "tools/call", *_SKILL_METHODS})


class Session:
    """The protocol state of one connection; `write` sends one encoded line to the client.

    `bound` holds `_meta` keys fixed for the whole session (those the bridge hands over with the
    agent's stdio); they win over the same keys in a request, as the bridge's tags would.
    """

    def __init__(self, router: Hub, profile: str, write: Callable[[bytes], None],
                 bound: Mapping[str, str] | None = None, on_call_end: Callable[[], None] | None = None,
                 on_call_start: Callable[[int | str], None] | None = None,
                 on_call_answer: Callable[[int | str], None] | None = None) -> None:
        self.router = router
        self._on_call_end = on_call_end  # the connection resumes reading once fewer calls run
        # Which calls a bridge would owe an answer: each call's start, and its answer, told just before the reply
        self._on_call_start, self._on_call_answer = on_call_start, on_call_answer
        self.profile = profile
        self.write = write
        bound = bound or {}
        self.interface = bound.get(INTERFACE) or None
        self.instance = bound.get(INSTANCE) or None
        self.parent = bound.get(PARENT_INSTANCE) or None
        self.proven = False  # instance and parent proven by the secret the router gave an agent run
        self.member: str | None = None  # the member who started that run, when no run did
        if bound.get(SECRET):
            self._prove(str(bound[SECRET]))
        self.builtins = bound.get(BUILTINS) != BUILTINS_ELSEWHERE
        self.generation: Generation | None = None
        self.era: Era | None = None
        self.version: str | None = None
        self.capabilities: dict[str, Any] = {}  # the client's, from its `initialize`
        self.refusal: str | None = None  # why every request is refused: a resumed session whose revision is gone
        # An agent run that names no instance is one per connection, so per-run limits still apply.
        self.default_instance = "conn-" + secrets.token_hex(6)
        self.tasks: dict[int | str, asyncio.Task[None]] = {}
        self._released = False
        self._loop = asyncio.get_running_loop()  # sessions are made on the loop; asked once, not per call

    def handle(self, line: bytes) -> None:
        try:
            msg = parse_message(line)
        except IdentifiedError as exc:
            self.write(encode_error(exc.msg_id, exc))
            return
        except JsonRpcError as exc:
            self.write(encode_error(None, exc))
            return
        if msg is None:
            return  # a response: the router sends no requests, so there is nothing to match
        if not msg.is_request:
            self._notification(msg)
            return
        if self.refusal is not None:
            self.write(encode_error(msg.id, JsonRpcError(INVALID_REQUEST, self.refusal)))
            return
        if self.generation is None:
            self.generation = self.router.live
            self.router.services.pool.pin(self.generation.pool_keys)  # its connectors drain only after it ends
        try:
            self._request(msg, self.generation)
        except JsonRpcError as exc:
            self.write(encode_error(msg.id, exc))

    def _request(self, msg: Message, generation: Generation) -> None:
        method, params = msg.method, msg.params
        if method == "initialize":
            if self.era is Era.STATELESS:
                raise refuse_other_era(Era.STATELESS, method, params)
            version = negotiate_handshake(params)
            view = self._view(generation, params)
            self.era, self.version = Era.HANDSHAKE, version
            capabilities = params.get("capabilities") if params else None
            self.capabilities = capabilities if isinstance(capabilities, dict) else {}
            self.write(encode_result(msg.id, initialize_result(version, view.instructions)))
        elif has_envelope(params):
            if self.era is Era.HANDSHAKE:
                raise refuse_other_era(Era.HANDSHAKE, method, params)
            version = read_envelope(params)
            self._stateless(msg, generation)  # raises for a request it refuses, which settles nothing
            self.era, self.version = Era.STATELESS, version
        elif self.era is Era.STATELESS or method == "server/discover":
            read_envelope(params)  # raises: a stateless request needs its envelope
        elif method in _HANDSHAKE_METHODS:
            self._handshake(msg, generation)
        else:
            raise _unknown_method(method)

    def _handshake(self, msg: Message, generation: Generation) -> None:
        if msg.method == "ping":
            self.write(encode_result(msg.id, {}))
        elif msg.method == "tools/list":
            self.write(encode_raw_result(msg.id, self._view(generation, msg.params).list_handshake))
        elif msg.method == "tools/call":
            self._start_call(msg, generation, stateless=False)
        else:
            self.write(encode_result(msg.id, self._skill_request(msg, generation, stateless=False)))

    def _stateless(self, msg: Message, generation: Generation) -> None:
        if msg.method == "server/discover":
            self.write(encode_result(msg.id, discover_result(self._view(generation, msg.params).instructions)))
        elif msg.method == "tools/list":
            self.write(encode_raw_result(msg.id, self._view(generation, msg.params).list_stateless))
        elif msg.method == "tools/call":
            self._start_call(msg, generation, stateless=True)
        elif msg.method in _SKILL_METHODS:
            self.write(encode_result(msg.id, self._skill_request(msg, generation, stateless=True)))
        elif msg.method == "ping":
            raise JsonRpcError(METHOD_NOT_FOUND, "ping was removed in protocol 2026-07-28")
        else:
            raise _unknown_method(msg.method)

    def _skill_request(self, msg: Message, generation: Generation, *, stateless: bool) -> dict[str, Any]:
        """The result of a request for the interface's skill (docs/router.md "Skills")."""
        skills = self._view(generation, msg.params).skills
        return _SKILL_METHODS[msg.method](skills, msg.params, stateless)

    def _view(self, generation: Generation, params: Mapping[str, Any] | None) -> View:
        builtins = self.builtins and _builtins(params)
        return generation.view(self.profile, self.interface or _interface(params), builtins)

    def _prove(self, secret: str) -> None:
        """Bind the run the secret proves; a secret that proves none leaves no claim standing (docs/agents.md)."""
        proof = self.router.services.proofs.get(secret_digest(secret))
        self.instance, self.parent = (proof.instance, proof.parent) if proof is not None else (None, None)
        self.proven, self.member = proof is not None, proof.member if proof is not None else None

    def _caller(self, params: Mapping[str, Any] | None) -> Caller:
        """Who calls: the run proven by a secret (bound at the handover, or a relayed request's), else the run ids
        bound to the session (checked when it was handed over), else the request's, as claims."""
        if not self.proven and (meta := _meta(params)) and isinstance(secret := meta.get(SECRET), str):
            self._prove(secret)
        instance = self.instance or _run_id(params, INSTANCE)
        if instance is not None and not self.proven and minted_run_id(instance):
            instance = None  # another run's id, claimed without its secret: the session's own run, not that one
        return Caller(self.profile, instance or self.default_instance,
                      self.parent or _run_id(params, PARENT_INSTANCE), self.proven, self.member)

    def _start_call(self, msg: Message, generation: Generation, *, stateless: bool) -> None:
        if msg.id is None:  # pragma: no cover - only requests (with ids) reach here
            return
        view = self._view(generation, msg.params)  # an unknown interface is refused before any task starts
        if msg.id in self.tasks:
            raise JsonRpcError(INVALID_REQUEST, f"request id {msg.id!r} is already in use by a call in flight")
        # The task removes itself from `tasks` when it ends (its body starts after this registration).
        self.tasks[msg.id] = self._loop.create_task(self._call(msg, generation, view, stateless))
        if self._on_call_start is not None:
            self._on_call_start(msg.id)

    async def _call(self, msg: Message, generation: Generation, view: View, stateless: bool) -> None:
        # None unless the client asked for it; it writes through `self.write` as it is then (`detach` changes it)
        progress = Progress.asked(msg.params, lambda data: self.write(data))  # noqa: PLW0108
        call_id: int | str = msg.id  # type: ignore[assignment]  # only requests (with ids) start calls
        answered = False
        try:
            try:
                reply = self._reply(msg, await run_tools_call(self.router.services, generation, view,
                                                              self._caller(msg.params), msg.params,
                                                              progress.relay if progress else None), stateless)
            except JsonRpcError as exc:
                reply = encode_error(msg.id, exc)
            answered = True
            self._answering(call_id)  # before the reply: a bridge must never answer a call the client heard of
            self.write(reply)
        finally:
            if progress is not None:  # after the reply, with no wait between: nothing follows it
                progress.end()
            if not answered:  # cancelled: no reply comes
                self._answering(call_id)
            self.tasks.pop(call_id, None)
            if self._on_call_end is not None:  # after the reply: what was waiting for the slot answers later
                self._on_call_end()

    def _answering(self, call_id: int | str) -> None:
        if self._on_call_answer is not None:
            self._on_call_answer(call_id)

    def _reply(self, msg: Message, result: EncodedResult | dict[str, Any], stateless: bool) -> bytes:
        if isinstance(result, EncodedResult):
            return encode_raw_result(msg.id, result.to_json(stateless))
        if stateless:
            result["resultType"] = "complete"
        return encode_result(msg.id, result)

    def _notification(self, msg: Message) -> None:
        if msg.method == "notifications/cancelled":
            request_id = (msg.params or {}).get("requestId")
            task = self.tasks.get(request_id) if isinstance(request_id, int | str) else None
            if task is not None:
                # After its first step, which is already due: a task cancelled before it starts never runs its
                # `finally`, so the call would go unlogged and its id stay taken for the rest of the connection.
                self._loop.call_soon(task.cancel)
        # notifications/initialized and the rest need nothing from a tools-only server

    def record(self, principal: str) -> SessionRecord | None:
        """What a router needs to resume this session (None until `initialize` or an envelope settled it)."""
        if self.version is None or self.generation is None:
            return None
        return SessionRecord(self.profile, principal, self.version, self.generation.snapshot.revision,
                             self.instance or self.default_instance, self.capabilities)

    def resume(self, record: SessionRecord) -> None:
        """Go on as `record` says, without a new `initialize`: on the live generation if it serves the record's
        revision; otherwise each request is answered with why, and what to do (`refusal`)."""
        self.default_instance = record.instance
        live = self.router.live
        if record.revision != live.snapshot.revision:
            self.refusal = (f"this session was pinned to config revision {record.revision[:12]}, which the router "
                            f"no longer serves since it restarted (now {live.snapshot.revision[:12]}); restart "
                            "this MCP server in your host to start a new session, then call again")
            return
        self.generation = live
        self.router.services.pool.pin(live.pool_keys)
        self.version, self.capabilities = record.version, dict(record.capabilities)
        self.era = Era.HANDSHAKE if record.version in HANDSHAKE_VERSIONS else Era.STATELESS

    async def drain(self) -> None:
        """Wait for the calls in flight to finish and reply (the client closed its side)."""
        while self.tasks:
            running = list(self.tasks.items())
            await asyncio.gather(*(task for _, task in running), return_exceptions=True)
            for key, task in running:  # a task cancelled before it started never removed itself
                if self.tasks.get(key) is task:
                    del self.tasks[key]

    def abort(self) -> None:
        """The client is gone: cancel its calls (each still logs and settles) and release its generation."""
        for task in list(self.tasks.values()):
            task.cancel()
        if self.generation is not None and not self._released:
            self._released = True
            self.router.services.pool.unpin(self.generation.pool_keys)

    def detach(self) -> None:
        """Its connection has ended: what still runs writes nowhere and tells it nothing. So neither keeps the other
        alive until the collector's next full pass, which a busy router makes rarely."""
        self.write = _discard
        self._on_call_end = self._on_call_start = self._on_call_answer = None


def _discard(data: bytes) -> None:
    return None


def _builtins(params: Mapping[str, Any] | None) -> bool:
    """Whether a request leaves the built-in tools in (a relayed bridge tags each request with `handler/builtins`)."""
    meta = _meta(params)
    return not meta or meta.get(BUILTINS) != BUILTINS_ELSEWHERE


def _meta(params: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The request's `_meta` (None when it has none); a JSON-RPC error when it is not an object."""
    meta = params.get("_meta") if params else None
    if meta is None or isinstance(meta, dict):
        return meta
    raise JsonRpcError(INVALID_PARAMS, "params._meta must be an object, as MCP defines it; send {} or leave it out")


def _interface(params: Mapping[str, Any] | None) -> str | None:
    """The interface a request names in `_meta` (None when it names none: no key, null or ""); a JSON-RPC error
    when the value is not a string."""
    meta = _meta(params)
    value = meta.get(INTERFACE) if meta else None
    if value is None or isinstance(value, str):
        return value or None
    raise JsonRpcError(INVALID_PARAMS, f"params._meta[{INTERFACE!r}] must be a string naming an interface, "
                       "such as ocr or ocr/v1")


def _run_id(params: Mapping[str, Any] | None, key: str) -> str | None:
    """An agent run's id under `key` in the request's `_meta` (None when it names none: no key, null or ""); a
    JSON-RPC error when the router may not keep it (`run_id_problem`), a value that is not a string among them."""
    meta = _meta(params)
    value = meta.get(key) if meta else None
    if value is not None and (problem := run_id_problem(value)) is not None:
        raise JsonRpcError(INVALID_PARAMS, f"params._meta[{key!r}] {problem}")
    return value or None


def _unknown_method(method: str) -> JsonRpcError:
    return JsonRpcError(METHOD_NOT_FOUND, f"unknown method '{method[:100]}'; this server offers tools "
                        "(tools/list, tools/call), and its skill as a resource (resources/list, resources/read) and a "
                        "prompt (prompts/list, prompts/get)")
