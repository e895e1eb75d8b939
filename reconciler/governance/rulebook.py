"""A snapshot's governance compiled into lookup tables, once per snapshot, for `decide.decide_call`.

Everything that depends only on config is worked out here: the rule/template/pin posture of each
tool of each profile (reusing `config.posture`), the caps that apply to it, its price, and the
policies whose scope matches it, indexed by cost so that finding "the first matching policy" or
"any cost policy that holds this call" is one binary search however many policies the org has.
The router compiles a snapshot when it first sees it; nothing is parsed or scanned per call.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from reconciler.config.models import ActionClass, Routing
from reconciler.config.posture import RuleIndex, ToolPosture, tool_posture
from reconciler.config.snapshot import Profile, Snapshot

__all__ = [
    "SCOPE_RANK",
    "Approver",
    "CapSet",
    "CostIndex",
    "PolicyView",
    "Rulebook",
    "ToolEntry",
    "compile_rulebook",
    "from_micros",
    "to_micros",
]

MICROS = 1_000_000
# Scope rank of approval policies (docs/architecture.md §7 layer 6): a narrower scope names the approver first.
SCOPE_RANK: Mapping[str, int] = MappingProxyType({"action": 0, "service": 1, "profile": 2, "group": 3, "org": 4})


def to_micros(usd: float) -> int:
    """Money is counted in integer micro-dollars, so that fifty calls at $0.005 make exactly $0.25."""
    return round(usd * MICROS)


def from_micros(micros: int) -> float:
    return micros / MICROS


@dataclass(frozen=True, slots=True)
class Approver:
    """Who a hold goes to: `member`, `slack`, `caller`, or `owners` (the org's owners, the fallback)."""

    to: str
    member: str | None = None
    channel: str | None = None
    members: tuple[str, ...] = ()

    @classmethod
    def from_routing(cls, routing: Routing) -> Approver:
        return cls(routing.to, member=routing.member, channel=routing.channel)

    def to_dict(self) -> dict[str, object]:
        if self.to == "member":
            return {"to": "member", "member": self.member}
        if self.to == "slack":
            return {"to": "slack", "channel": self.channel}
        if self.to == "owners":
            return {"to": "owners", "members": list(self.members)}
        return {"to": self.to}

    def describe(self) -> str:
        if self.to == "member":
            return f"member {self.member}"
        if self.to == "slack":
            return f"Slack channel {self.channel}"
        if self.to == "caller":
            return "the instance that started this agent"
        return "the org's owners (" + ", ".join(self.members) + ")" if self.members else "an owner"


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    name: str
    scope: str  # "action web_search_query", "org", ...
    rank: tuple[int, int, int]  # scope rank, -priority, file order
    cost_above: int | None  # micros
    cost_below: int | None
    approver: Approver | None

    @property
    def conditional(self) -> bool:
        return self.cost_above is not None or self.cost_below is not None

    def describe_when(self) -> str:
        parts = []
        if self.cost_above is not None:
            parts.append(f"cost above ${from_micros(self.cost_above):g}")
        if self.cost_below is not None:
            parts.append(f"cost below ${from_micros(self.cost_below):g}")
        return " and ".join(parts) or "always"


class CostIndex:
    """The policies matching one tool, answered per cost in O(log n).

    The cost axis is cut at every `cost_above`/`cost_below` bound into elementary pieces (each bound
    itself, and the open stretches between bounds); on each piece the set of matching policies is
    constant, so the first policy by rank and "is any conditional policy matching" are tabulated.
    """

    __slots__ = ("_any_conditional", "_bounds", "_first_router", "policies")

    def __init__(self, policies: Sequence[CompiledPolicy]) -> None:
        self.policies = tuple(sorted(policies, key=lambda p: p.rank))
        bounds = sorted({b for p in self.policies for b in (p.cost_above, p.cost_below) if b is not None})
        self._bounds = bounds
        pieces = 2 * len(bounds) + 1
        where = {b: i for i, b in enumerate(bounds)}
        # Piece 2i is the open stretch below bounds[i]; piece 2i+1 is bounds[i] itself.
        spans: list[tuple[int, int, int, CompiledPolicy]] = []
        for order, p in enumerate(self.policies):
            start = 0 if p.cost_above is None else 2 * where[p.cost_above] + 2
            end = pieces - 1 if p.cost_below is None else 2 * where[p.cost_below]
            if start <= end:
                spans.append((start, end, order, p))
        self._first_router: list[CompiledPolicy | None] = [None] * pieces
        self._any_conditional: list[CompiledPolicy | None] = [None] * pieces
        self._sweep(spans, pieces, routers=True)
        self._sweep(spans, pieces, routers=False)

    def _sweep(self, spans: list[tuple[int, int, int, CompiledPolicy]], pieces: int, *, routers: bool) -> None:
        wanted = [s for s in spans if (s[3].approver is not None if routers else s[3].conditional)]
        wanted.sort()
        table = self._first_router if routers else self._any_conditional
        active: list[tuple[int, int, CompiledPolicy]] = []  # (order, end, policy): the heap's top ranks first
        nxt = 0
        for piece in range(pieces):
            while nxt < len(wanted) and wanted[nxt][0] == piece:
                _, end, order, policy = wanted[nxt]
                heapq.heappush(active, (order, end, policy))
                nxt += 1
            while active and active[0][1] < piece:
                heapq.heappop(active)
            table[piece] = active[0][2] if active else None

    def piece(self, cost: int) -> int:
        """Which elementary piece of the cost axis `cost` falls in."""
        i = bisect_left(self._bounds, cost)
        return 2 * i + 1 if i < len(self._bounds) and self._bounds[i] == cost else 2 * i

    def first_router(self, cost: int) -> CompiledPolicy | None:
        """The first policy by scope rank and priority that matches `cost` and names an approver."""
        return self._first_router[self.piece(cost)]

    def holding(self, cost: int) -> CompiledPolicy | None:
        """The first conditional policy matching `cost`: it turns an auto into an approve (layer 5)."""
        return self._any_conditional[self.piece(cost)]


_EMPTY = CostIndex(())


def _first(a: CompiledPolicy | None, b: CompiledPolicy | None) -> CompiledPolicy | None:
    if a is None:
        return b
    if b is None:
        return a
    return a if a.rank < b.rank else b


class PolicyView:
    """The policies matching one tool: the profile's shared ones (profile, group, org scope) and the
    tool's own (action, service scope), each a `CostIndex`; a lookup asks both and keeps the better rank."""

    __slots__ = ("own", "shared")

    def __init__(self, shared: CostIndex, own: CostIndex) -> None:
        self.shared = shared
        self.own = own

    def key(self, cost: int) -> tuple[int, int]:
        """Costs with the same key meet the same policies: decisions are cached per key."""
        return (self.shared.piece(cost), self.own.piece(cost))

    def first_router(self, cost: int) -> CompiledPolicy | None:
        return _first(self.shared.first_router(cost), self.own.first_router(cost))

    def holding(self, cost: int) -> CompiledPolicy | None:
        return _first(self.shared.holding(cost), self.own.holding(cost))

    @property
    def policies(self) -> tuple[CompiledPolicy, ...]:
        return tuple(sorted((*self.shared.policies, *self.own.policies), key=lambda p: p.rank))


@dataclass(frozen=True, slots=True)
class CapSet:
    """The caps (micros) over one profile's calls; None where no cap is set."""

    org_name: str
    org: int | None
    profile: int | None
    instance: int | None
    prepaid: bool
    suspended: bool
    profile_file: str


@dataclass(frozen=True, slots=True)
class ToolEntry:
    """Everything static about one tool of one profile."""

    profile: str
    service: str  # the interface name, as rules, pins and policy scopes name it
    key: str  # "web-search/v1"
    tool: str
    action_class: ActionClass
    posture: ToolPosture
    rule: str | None  # the rule that applied ("action send_email_send"), or None
    rule_word: str  # what it says in the file: allow / approve / block
    template_detail: str
    template_outcome: str
    pinned: bool
    routing: Approver | None  # None: routing unset
    policies: PolicyView
    owners: Approver | None
    caps: CapSet
    price: int  # the binding's [pricing]: the most one call may cost, reserved at admission, micros
    binding: str
    guard_text: str  # what the guardrail layer found when nothing blocks
    # Decisions already worked out, per `PolicyView.key(cost)`: filled on first use by `decide_call`.
    memo: dict[tuple[int, int], Any] = field(default_factory=dict, compare=False, repr=False)


@dataclass(frozen=True)
class Rulebook:
    """One snapshot's governance as tables: (profile, tool) → `ToolEntry`."""

    revision: str
    entries: Mapping[tuple[str, str], ToolEntry]
    profiles: Mapping[str, tuple[str, ...]]  # profile → its tools, for "did you mean"
    # The lanes of calls nothing limits or holds, by (profile, tool, price): filled on first use by `lanes`.
    lanes: dict[tuple[str, str, float], Any] = field(default_factory=dict, compare=False, repr=False)

    def entry(self, profile: str, tool: str) -> ToolEntry | None:
        return self.entries.get((profile, tool))


def _compile_policies(snapshot: Snapshot) -> _PolicyBuckets:
    out = []
    scopes: list[tuple[str, str | None]] = []
    policies = snapshot.org.policies if snapshot.org else []
    for order, p in enumerate(policies):
        kind = p.scope.kind
        value = getattr(p.scope, kind)
        when = p.when
        scopes.append((kind, None if kind == "org" else str(value)) if value else (kind, "\0"))
        out.append(CompiledPolicy(
            name=p.name,
            scope="org" if kind == "org" else f"{kind} {value}",
            rank=(SCOPE_RANK[kind], -p.priority, order),
            cost_above=to_micros(when.cost_above) if when and when.cost_above is not None else None,
            cost_below=to_micros(when.cost_below) if when and when.cost_below is not None else None,
            approver=Approver.from_routing(p.approver) if p.approver else None,
        ))
    return _PolicyBuckets(out, scopes)


class _PolicyBuckets:
    """The org's policies by scope, so each tool finds its own without scanning them all."""

    def __init__(self, policies: list[CompiledPolicy], scopes: list[tuple[str, str | None]]) -> None:
        self.by: dict[tuple[str, str | None], list[CompiledPolicy]] = {}
        for policy, scope in zip(policies, scopes, strict=True):
            self.by.setdefault(scope, []).append(policy)
        self._own: dict[tuple[str, str], CostIndex] = {}

    def shared(self, profile: Profile) -> CostIndex:
        found = [*self.by.get(("profile", profile.name), []), *self.by.get(("org", None), [])]
        if profile.spec.group is not None:
            found.extend(self.by.get(("group", profile.spec.group), []))
        return CostIndex(found) if found else _EMPTY

    def own(self, service: str, tool: str) -> CostIndex:
        key = (service, tool)
        found = [*self.by.get(("service", service), []), *self.by.get(("action", tool), [])]
        if not found:
            return _EMPTY
        if key not in self._own:
            self._own[key] = CostIndex(found)
        return self._own[key]


def _caps(snapshot: Snapshot, profile: Profile) -> CapSet:
    org = snapshot.org
    caps = profile.spec.caps
    return CapSet(
        org_name=org.name if org else "",
        org=to_micros(org.caps.monthly_usd) if org and org.caps.monthly_usd is not None else None,
        profile=to_micros(caps.monthly_usd) if caps.monthly_usd is not None else None,
        instance=to_micros(caps.instance_usd) if caps.instance_usd is not None else None,
        prepaid=bool(org and org.prepaid),
        suspended=bool(org and org.suspended),
        profile_file=profile.file,
    )


def _guard_text(caps: CapSet) -> str:
    if caps.suspended:
        return "the org is suspended"
    named = [n for n, c in (("org", caps.org), ("profile", caps.profile), ("instance", caps.instance)) if c is not None]
    parts = ["not suspended", f"within the {', '.join(named)} cap(s)" if named else "no cap"]
    if caps.prepaid:
        parts.append("the prepaid balance covers it")
    return "; ".join(parts)


def _owners(snapshot: Snapshot) -> Approver | None:
    if snapshot.org is None:
        return None
    owners = tuple(sorted(m for m, spec in snapshot.org.members.items() if spec.owner))
    return Approver("owners", members=owners) if owners else None


def compile_rulebook(snapshot: Snapshot) -> Rulebook:
    """Compile every (profile, tool) the snapshot serves into a `ToolEntry`."""
    policies = _compile_policies(snapshot)
    owners = _owners(snapshot)
    entries: dict[tuple[str, str], ToolEntry] = {}
    tools_of: dict[str, tuple[str, ...]] = {}
    for profile in snapshot.profiles.values():
        spec = profile.spec
        caps = _caps(snapshot, profile)
        routing = Approver.from_routing(spec.routing) if spec.routing else None
        template = snapshot.template_for(profile)
        rules = RuleIndex.from_profile(profile)
        shared = policies.shared(profile)
        guard_text = _guard_text(caps)
        names: list[str] = []
        for service, selection in profile.selections.items():
            iface = snapshot.interfaces.get(selection.key)
            if iface is None:
                continue
            binding = snapshot.bindings.get(selection.binding)
            pricing = binding.spec.pricing if binding else {}
            for tool in iface.tools:
                cls = tool.action_class
                posture = tool_posture(snapshot, profile, service, tool.name, cls, rules)
                outcome = template.outcome_for(cls)
                rule = rules.actions.get(tool.name) or rules.services.get(service)
                entries[(profile.name, tool.name)] = ToolEntry(
                    profile=profile.name,
                    service=service,
                    key=selection.key,
                    tool=tool.name,
                    action_class=cls,
                    posture=posture,
                    rule=(f"action {rule.action}" if rule.action else f"service {rule.service}") if rule else None,
                    rule_word=rule.outcome if rule else "",
                    template_detail=f"the {template.name} template maps {cls.value} to {outcome.value}",
                    template_outcome=outcome.value,
                    pinned=service in spec.pins,
                    routing=routing,
                    policies=PolicyView(shared, policies.own(service, tool.name)),
                    owners=owners,
                    caps=caps,
                    price=to_micros(pricing.get(tool.name, 0.0)),
                    binding=selection.binding,
                    guard_text=guard_text,
                )
                names.append(tool.name)
        tools_of[profile.name] = tuple(names)
    return Rulebook(snapshot.revision, MappingProxyType(entries), MappingProxyType(tools_of))
