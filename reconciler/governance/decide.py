"""The decision: executed now, held for a person, or blocked — with a trace of every layer (docs/architecture.md §7).

`decide_call` is a pure function of a compiled `Rulebook` entry, the call's estimated cost and the
spend state; it reads lookup tables only. The layers, top-down, each recorded in the trace:

1. guardrails — suspension, the org/profile/instance monthly caps, the prepaid balance → block;
2. rule — an explicit rule on the profile (an action rule beats a service rule);
3. template — the profile's, else the org default, else Balanced, by action class;
4. pin — turns auto into approve, never lifts a block;
5. cost policy — a policy whose `cost_above`/`cost_below` matches turns auto into approve;
6. routing — `none` → auto; `member`/`slack`/`caller` → that approver; unset → the first
   matching policy by scope rank then priority, else the org's owners;
7. default — nothing decided → auto.

Layers 2-4 come precomputed from `config.posture` (shared with `handler plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from reconciler.config.models import Outcome
from reconciler.governance.rulebook import Approver, CapSet, ToolEntry, from_micros

__all__ = ["LAYERS", "Decision", "SpendState", "Step", "decide_call", "guardrail_block", "usd"]

LAYERS = ("guardrails", "rule", "template", "pin", "cost policy", "routing", "default")
Status = Literal["executed", "pending", "blocked"]
_STATUS: dict[Outcome, Status] = {Outcome.AUTO: "executed", Outcome.APPROVE: "pending", Outcome.BLOCK: "blocked"}
_CLASS_WORD = {"read": "Reads", "write": "Writes", "destructive": "Destructive actions"}


def usd(micros: int) -> str:
    """$0.005, $12.50, -$0.03: money as people read it."""
    value = from_micros(abs(micros))
    sign = "-" if micros < 0 else ""
    return sign + (f"${value:.2f}" if value == round(value, 2) else f"${value:.6f}".rstrip("0"))


@dataclass(frozen=True, slots=True)
class SpendState:
    """What has been spent this calendar month (UTC), in micros, and the prepaid balance if any."""

    org: int = 0
    profile: int = 0
    instance: int = 0
    balance: int | None = None
    leased: bool = False  # what other routers hold in budget leases is counted as spent (`leases`)


@dataclass(frozen=True, slots=True)
class Step:
    layer: str
    found: str
    decided: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "found": self.found, "decided": self.decided}


class Decision(NamedTuple):
    """The outcome, who approves, why, and the trace (a tuple: built per call, so it must be cheap)."""

    outcome: Outcome
    approver: Approver | None
    reason: str
    trace: tuple[Step, ...]
    # The trace as holds, the audit trail and `Admission.trace` carry it: built with the decision, so
    # a decision reused from the memo (see `decide_call`) brings its wire form along at no cost.
    wire_trace: tuple[Mapping[str, Any], ...]
    cost: int  # the estimate decided on, micros
    cap: str | None = None  # the guardrail that blocked, e.g. "profile monthly cap"

    @property
    def status(self) -> Status:
        return _STATUS[self.outcome]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.outcome.value,
            "status": self.status,
            "approver": self.approver.to_dict() if self.approver else None,
            "reason": self.reason,
            "cost": from_micros(self.cost),
            "trace": [dict(s) for s in self.wire_trace],
        }


def _decision(outcome: Outcome, approver: Approver | None, reason: str, steps: Sequence[Step], cost: int,
              cap: str | None = None) -> Decision:
    trace = tuple(steps)
    return Decision(outcome, approver, reason, trace, tuple(s.to_dict() for s in trace), cost, cap)


def _refused(caps: CapSet, cost: int, state: SpendState) -> bool:
    """The guardrails' test alone, on integers: the hot path formats nothing."""
    return (caps.suspended
            or (caps.org is not None and state.org + cost > caps.org)
            or (caps.profile is not None and state.profile + cost > caps.profile)
            or (caps.instance is not None and state.instance + cost > caps.instance)
            or (caps.prepaid and cost > (state.balance or 0)))


def guardrail_block(caps: CapSet, profile: str, instance: str, cost: int, state: SpendState) -> tuple[str, str] | None:
    """The guardrail that refuses this call — (cap name, reason) — or None. Layer 1, also used by the ledger.

    A cap refuses a call it cannot cover (spent + estimate > cap); an estimate of zero passes a full
    cap. A prepaid org with an empty balance refuses every priced call.
    """
    if not _refused(caps, cost, state):
        return None
    if caps.suspended:
        return ("org suspended", f"The org {caps.org_name} is suspended: no call runs until an owner sets "
                                 "suspended = false in config/org.toml.")
    checks = (
        ("org monthly cap", caps.org, state.org),
        ("profile monthly cap", caps.profile, state.profile),
        ("instance cap", caps.instance, state.instance),
    )
    for name, cap, spent in checks:
        if cap is not None and spent + cost > cap:
            whose, where = {
                "org monthly cap": (f"the org {caps.org_name}", "[caps] monthly_usd in config/org.toml"),
                "profile monthly cap": (f"profile {profile}", f"[caps] monthly_usd in {caps.profile_file}"),
                "instance cap": (f"instance {instance} of profile {profile}",
                                 f"[caps] instance_usd in {caps.profile_file}"),
            }[name]
            held = " or held in other routers' budget leases" if state.leased else ""
            return (name, f"Blocked by the {name} of {whose}: {usd(spent)} of {usd(cap)} spent{held} this month "
                          f"(UTC), this call needs {usd(cost)}. Raise {where} or wait for the next month.")
    if state.balance is None:
        return ("prepaid balance", f"Blocked by the prepaid balance: the org has none yet and this call needs "
                                   f"{usd(cost)}. An owner tops it up with `handler balance add`.")
    return ("prepaid balance", f"Blocked by the prepaid balance: {usd(state.balance)} left cannot cover this "
                               f"call ({usd(cost)}). An owner tops it up with `handler balance add`.")


def _skip(layer: str, why: str) -> Step:
    return Step(layer, why, False)


def decide_call(entry: ToolEntry, instance: str, cost: int | None, state: SpendState) -> Decision:
    """Decide one call of `entry.tool` on `entry.profile` by `instance` at `cost` micros (None: its price).

    Only the guardrails depend on the spend state; layers 2-7 depend on the entry and on which
    policies the cost meets, so their outcome is worked out once per entry and cost band and reused.
    """
    est = entry.price if cost is None else cost
    if _refused(entry.caps, est, state):
        blocked = guardrail_block(entry.caps, entry.profile, instance, est, state)
        assert blocked is not None  # noqa: S101 - _refused said so
        cap, reason = blocked
        skipped = (_skip(name, "not reached: a guardrail blocked") for name in LAYERS[1:])
        return _decision(Outcome.BLOCK, None, reason, (Step("guardrails", reason, True), *skipped), est, cap)
    key = entry.policies.key(est)
    done: Decision | None = entry.memo.get(key)
    if done is None:
        done = entry.memo[key] = _decide_layers(entry, est)
    return done if done.cost == est else done._replace(cost=est)


def _decide_layers(entry: ToolEntry, est: int) -> Decision:
    """Layers 2-7 for a call the guardrails let through."""
    steps = [Step("guardrails", entry.guard_text)]
    posture = entry.posture
    outcome = posture.outcome
    base_layer = "rule" if posture.layer in ("action rule", "service rule") else "template"
    if entry.rule is not None:
        steps.append(Step("rule", f"the rule for {entry.rule} says {entry.rule_word}", True))
        steps.append(_skip("template", f"not consulted: the rule decided ({entry.template_detail})"))
    else:
        steps.append(_skip("rule", f"no rule for action {entry.tool} or service {entry.service}"))
        steps.append(Step("template", entry.template_detail, True))
    if outcome is Outcome.BLOCK:
        reason = _block_reason(entry, base_layer)
        steps.extend(_skip(name, "not reached: the call is blocked") for name in LAYERS[3:])
        return _decision(Outcome.BLOCK, None, reason, steps, est)
    why = posture.detail
    if posture.layer == "pin":
        steps.append(Step("pin", f"service {entry.service} is pinned: auto becomes approve", True))
    elif entry.pinned:
        steps.append(Step("pin", f"service {entry.service} is pinned; the outcome is already {outcome.value}"))
    else:
        steps.append(_skip("pin", f"service {entry.service} is not pinned"))

    routing = entry.routing
    if routing is not None and routing.to == "none":
        steps.append(_skip("cost policy", "skipped: routing is none (full trust)"))
        found = "routing is none: full trust, the call runs"
        if outcome is Outcome.APPROVE:
            found += " (it would have waited for approval)"
        steps.append(Step("routing", found, outcome is Outcome.APPROVE))
        steps.append(_skip("default", "not reached"))
        return _decision(Outcome.AUTO, None, f"Runs now: {why}; routing is none (full trust).", steps, est)

    holding = entry.policies.holding(est)
    if holding is None:
        steps.append(_skip("cost policy", "no cost-conditioned policy matches this cost"))
    elif outcome is Outcome.AUTO:
        outcome = Outcome.APPROVE
        why = f"policy '{holding.name}' holds calls with {holding.describe_when()}"
        steps.append(Step("cost policy", f"{why} ({holding.scope}): auto becomes approve", True))
    else:
        steps.append(Step("cost policy", f"policy '{holding.name}' matches; the outcome is already approve"))

    if outcome is Outcome.AUTO:
        steps.append(_skip("routing", "not needed: nothing to approve"))
        steps.append(_skip("default", "not reached: the outcome is auto"))
        return _decision(Outcome.AUTO, None, f"Runs now: {why}.", steps, est)

    approver, found = _route(entry, est)
    steps.append(Step("routing", found, True))
    steps.append(_skip("default", "not reached: the call is held"))
    who = approver.describe() if approver else "an org member"
    return _decision(Outcome.APPROVE, approver, f"Held for approval by {who}: {why}.", steps, est)


def _route(entry: ToolEntry, est: int) -> tuple[Approver | None, str]:
    if entry.routing is not None:
        return entry.routing, f"the profile routes holds to {entry.routing.describe()}"
    policy = entry.policies.first_router(est)
    if policy is not None and policy.approver is not None:
        return policy.approver, (f"routing unset; policy '{policy.name}' ({policy.scope}) names "
                                 f"{policy.approver.describe()}")
    if entry.owners is not None:
        return entry.owners, f"routing unset and no policy names an approver: {entry.owners.describe()}"
    return None, "routing unset, no policy names an approver and the org has no owners: any member may decide"


def _block_reason(entry: ToolEntry, layer: str) -> str:
    if layer == "rule":
        return (f"Blocked: a rule for {entry.rule} refuses {entry.tool} for this agent (profile {entry.profile}). "
                "Use another tool, or ask an owner to change the rule.")
    template = entry.template_detail.split(" ")[1]
    word = _CLASS_WORD[entry.action_class.value]
    return f"{word} are not allowed for this agent ({template.capitalize()} template)."
