"""A snapshot compiled for serving: everything the per-call path needs, computed once per generation.

`compile_generation` turns an immutable `Snapshot` into a `Generation`: for each profile and each
interface it uses, a `View` holding the tools an agent sees (their `tools/list` payloads serialized
once per era) and, per tool, a `ToolPlan`: the compiled `jsonschema-rs` validators (`format`
checked, `config/formats.py`), the locations of file arguments, the effective limits, the binding
and its price; and what it says of itself: the `instructions` of `initialize` and `server/discover`
and the interface's skill, served as a resource and a prompt (docs/router.md "Skills"). Each view
has a twin without the built-in tools, for a host configuration whose `handler` entry carries them
(docs/hosts.md). Validators are cached by the interface version's content hash, so a reload that
leaves an interface alone compiles nothing. Sessions pin a `Generation` at their first request;
`Router.swap` replaces the live one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import jsonschema_rs
import orjson

from reconciler.config.formats import compile_validator
from reconciler.config.models import Limits, Tool
from reconciler.config.schemas import schema_depth
from reconciler.config.skills import host_skill_name, skill_uri
from reconciler.config.snapshot import ROUTER_ERRORS, InterfaceVersion, Snapshot, effective_limits
from reconciler.connectors.pool import PoolKey, pool_key
from reconciler.router.builtins import BUILTIN_INTERFACE, BUILTIN_KEY, BUILTIN_TOOLS
from reconciler.router.files import FileField, Scope, find_file_fields
from reconciler.router.protocol import CACHE_SCOPE, LIST_TTL_MS, ServedSkill
from reconciler.wire.errors import INVALID_PARAMS, JsonRpcError

__all__ = ["Generation", "ToolPlan", "ValidatorCache", "View", "compile_generation"]


@dataclass(frozen=True, slots=True, eq=False)
class Compiled:
    """What a tool's schemas compile to; shared by every profile that uses the interface version."""

    listing: Mapping[str, Any]
    input: jsonschema_rs.Validator
    output: jsonschema_rs.Validator | None
    files: tuple[FileField, ...]
    deep_output: bool = True  # its outputSchema lets an output nest past MOST_OUTPUT_DEPTH: step 9 measures it


@dataclass(frozen=True, slots=True, eq=False)
class ToolPlan:
    """Everything step 2 resolves a tool name to, for one profile."""

    name: str
    interface: str  # "ocr/v1", or "handler/v1" for the built-ins
    binding: str | None  # None for the built-ins
    compiled: Compiled
    limits: Limits
    errors: frozenset[str]
    price: float
    scope: Scope
    pool_key: PoolKey | None = None  # the binding's connector process, found without a lookup per call
    tells_caller: bool = False  # served by the built-in agent connector, which is told who calls (`runs.AgentRuns`)

    @property
    def builtin(self) -> bool:
        return self.binding is None


@dataclass(frozen=True, slots=True, eq=False)
class View:
    """What a connection of one profile sees through one interface (or through all, when none is named)."""

    profile: str
    interface: str | None  # as the bridge named it: "ocr", "ocr/v1", "handler"; None for all
    key: str | None  # the interface's name/vN ("handler/v1" for the built-ins); None for all
    tools: Mapping[str, ToolPlan]
    list_handshake: bytes  # the tools/list result, serialized
    list_stateless: bytes  # the same with resultType, ttlMs and cacheScope
    instructions: str
    skills: tuple[ServedSkill, ...] = ()
    bare: View | None = None  # the same without the built-in tools (None: this one has none to leave out)


@dataclass(frozen=True, eq=False)
class Generation:
    """One compiled snapshot; never changed once built."""

    number: int
    snapshot: Snapshot
    views: Mapping[tuple[str, str | None], View]
    interfaces_of: Mapping[str, tuple[str, ...]]  # profile → the interface names it uses
    pool_keys: frozenset[PoolKey] = frozenset()  # the connector processes its sessions may use

    def view(self, profile: str, interface: str | None, builtins: bool = True) -> View:
        """What `profile` sees through `interface` (all of them: None); without the built-in tools unless
        `builtins` (another entry of the host's configuration carries them)."""
        found = self.views.get((profile, interface))
        if found is not None:
            return found if builtins or found.bare is None else found.bare
        if profile not in self.interfaces_of:
            raise JsonRpcError(INVALID_PARAMS, f"profile '{profile}' is not in the configuration this session uses")
        uses = ", ".join(self.interfaces_of[profile]) or "nothing"
        raise JsonRpcError(INVALID_PARAMS, f"profile '{profile}' has no binding for interface '{interface}'; it uses: "
                           f"{uses} (and the built-in '{BUILTIN_INTERFACE}')")


class ValidatorCache:
    """Compiled tools by (interface key, content hash), kept across generations."""

    def __init__(self) -> None:
        self._compiled: dict[tuple[str, str, str], Compiled] = {}

    def compiled(self, key: str, content_hash: str, tool: Tool) -> Compiled:
        slot = (key, content_hash, tool.name)
        found = self._compiled.get(slot)
        if found is None:
            found = self._compiled[slot] = compile_tool(tool)
        return found

    def keep_only(self, live: set[tuple[str, str, str]]) -> None:
        self._compiled = {k: v for k, v in self._compiled.items() if k in live}


def compile_tool(tool: Tool) -> Compiled:
    # formats checked as every client checks them (config/formats.py): a bad input is refused, a bad output too.
    output = tool.outputSchema
    most = schema_depth(output) if output else None
    return Compiled(
        listing=MappingProxyType(tool.model_dump(mode="json", exclude_none=True, by_alias=True)),
        input=compile_validator(tool.inputSchema),
        output=compile_validator(output) if output else None,
        files=find_file_fields(tool.inputSchema),
        deep_output=most is None or most > MOST_OUTPUT_DEPTH,
    )


# The deepest output the router passes on: results are serialized with orjson, which stops at 254 levels, and a
# held call's output is wrapped again (its `handler_status`). No interface's output nests half as deep.
MOST_OUTPUT_DEPTH = 128
_BUILTIN_COMPILED = {tool.name: compile_tool(tool) for tool in BUILTIN_TOOLS}


def compile_generation(snapshot: Snapshot, number: int, root: Path, cache: ValidatorCache | None = None) -> Generation:
    """Compile `snapshot` into generation `number`; `root` anchors relative profile scopes."""
    cache = cache or ValidatorCache()
    used: set[tuple[str, str, str]] = set()
    views: dict[tuple[str, str | None], View] = {}
    interfaces_of: dict[str, tuple[str, ...]] = {}
    for profile in snapshot.profiles.values():
        scope = Scope.from_profile(root, profile.spec.scope)
        builtins = {name: ToolPlan(name, BUILTIN_KEY, None, compiled, Limits(), frozenset(ROUTER_ERRORS), 0.0,
                                   scope) for name, compiled in _BUILTIN_COMPILED.items()}
        everything: dict[str, ToolPlan] = {}
        texts: list[str] = []
        skills: list[ServedSkill] = []
        for iface_name, selection in sorted(profile.selections.items()):
            iface = snapshot.interfaces.get(selection.key)
            binding = snapshot.bindings.get(selection.binding)
            if iface is None:
                continue
            limits = effective_limits(iface.spec, binding.spec if binding else None)
            pricing = binding.spec.pricing if binding else {}
            plans: dict[str, ToolPlan] = {}
            for tool in iface.tools:
                used.add((iface.key, iface.content_hash, tool.name))
                compiled = cache.compiled(iface.key, iface.content_hash, tool)
                plans[tool.name] = ToolPlan(tool.name, iface.key, selection.binding, compiled, limits,
                                            iface.error_codes, float(pricing.get(tool.name, 0.0)), scope,
                                            pool_key(snapshot, selection.binding),
                                            _serves_runs(snapshot, selection.binding))
            everything.update(plans)
            served = serve_skill(iface)
            skills.extend(served)
            text = interface_instructions(iface, served)
            texts.append(text)
            view = _view(profile.name, iface_name, iface.key, plans, builtins, text, served)
            views[(profile.name, iface_name)] = views[(profile.name, iface.key)] = view
        interfaces_of[profile.name] = tuple(sorted(profile.selections))
        views[(profile.name, BUILTIN_INTERFACE)] = views[(profile.name, BUILTIN_KEY)] = _view(
            profile.name, BUILTIN_INTERFACE, BUILTIN_KEY, {}, builtins, BUILTIN_INSTRUCTIONS, ())
        views[(profile.name, None)] = _view(profile.name, None, None, everything, builtins,
                                            "\n\n".join([*texts, BUILTIN_INSTRUCTIONS]), tuple(skills))
    cache.keep_only(used)
    keys = frozenset(plan.pool_key for view in views.values() for plan in view.tools.values()
                     if plan.pool_key is not None)
    return Generation(number, snapshot, MappingProxyType(views), MappingProxyType(interfaces_of), keys)


RETRY_WORDS = ('Every result that is not executed says in _meta["handler/retry"] whether calling again can help: '
               "later, never (not as it is), or after_decision (a person decides a held call first).")
BUILTIN_INSTRUCTIONS = ("handler: the status and decisions of held calls. A call held for approval answers "
                        "status pending with a request_id: ask handler_status with it later (not in a tight loop) "
                        "to learn whether it was executed, with its result, rejected or failed, and why. "
                        "handler_decide approves or rejects a hold routed to you, the run that started the held "
                        "agent. " + RETRY_WORDS)


def serve_skill(iface: InterfaceVersion) -> tuple[ServedSkill, ...]:
    """The interface version's skill as a session serves it (none in a tree the checks refused, I016)."""
    if iface.skill is None:
        return ()
    return (ServedSkill(iface.key, skill_uri(iface.key), host_skill_name(iface.name, iface.version),
                        iface.skill.description, iface.skill.text),)


def interface_instructions(iface: InterfaceVersion, served: tuple[ServedSkill, ...]) -> str:
    """What `initialize` and `server/discover` say of an interface: its description, its skill's summary, and where
    the whole skill is (most hosts put instructions in the model's context; few read resources unasked)."""
    text = f"{iface.key}: {iface.spec.description.rstrip('.')}."
    for skill in served:
        text += (f" {skill.description} Before calling its tools, read the whole skill (when to call each tool, "
                 f"what a pending result means, what each error asks of you): the resource {skill.uri} "
                 f"(resources/read), also the prompt {skill.name}.")
    return f"{text} {RETRY_WORDS}"


def _view(profile: str, interface: str | None, key: str | None, plans: dict[str, ToolPlan],
          builtins: dict[str, ToolPlan], instructions: str, skills: tuple[ServedSkill, ...]) -> View:
    """The view with the built-in tools, and its twin without them (`bare`) when it has tools of its own."""
    bare = _listed(profile, interface, key, plans, instructions, skills, None) if plans else None
    return _listed(profile, interface, key, {**plans, **builtins}, instructions, skills, bare)


def _listed(profile: str, interface: str | None, key: str | None, plans: dict[str, ToolPlan], instructions: str,
            skills: tuple[ServedSkill, ...], bare: View | None) -> View:
    tools = [dict(plan.compiled.listing) for plan in plans.values()]
    return View(
        profile=profile,
        interface=interface,
        key=key,
        tools=MappingProxyType(plans),
        list_handshake=orjson.dumps({"tools": tools}),
        list_stateless=orjson.dumps({"tools": tools, "resultType": "complete", "ttlMs": LIST_TTL_MS,
                                     "cacheScope": CACHE_SCOPE}),
        instructions=instructions,
        skills=skills,
        bare=bare,
    )


def _serves_runs(snapshot: Snapshot, binding_name: str) -> bool:
    """The binding's connector is the built-in `agent`: agent runs, served by the router itself."""
    binding = snapshot.bindings.get(binding_name)
    connector = snapshot.connectors.get(binding.connector or "") if binding is not None else None
    return connector is not None and connector.spec.run.builtin == "agent"
