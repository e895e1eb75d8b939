"""What a profile's static governance gives each of its tools: template, then rules, then pins.

This is the config-only part of the decision (docs/architecture.md §7, layers 2-4), shared by `handler plan`
and by the governance room, which adds the guardrails, policies and routing that need state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from reconciler.config.models import ActionClass, Outcome, Rule
from reconciler.config.snapshot import Profile, Snapshot

__all__ = ["RuleIndex", "ToolPosture", "tool_posture"]


@dataclass(frozen=True, slots=True)
class RuleIndex:
    """A profile's rules by action and by service (the first rule for a name wins), built once."""

    actions: Mapping[str, Rule]
    services: Mapping[str, Rule]

    @classmethod
    def from_profile(cls, profile: Profile) -> RuleIndex:
        actions: dict[str, Rule] = {}
        services: dict[str, Rule] = {}
        for rule in profile.spec.rules:
            if rule.action is not None:
                actions.setdefault(rule.action, rule)
            elif rule.service is not None:
                services.setdefault(rule.service, rule)
        return cls(actions, services)


@dataclass(frozen=True, slots=True)
class ToolPosture:
    outcome: Outcome
    layer: str  # "action rule", "service rule", "template", "pin"
    detail: str  # a phrase saying why, for traces and plans


def tool_posture(
    snapshot: Snapshot,
    profile: Profile,
    service: str,
    tool: str,
    action_class: ActionClass,
    rules: RuleIndex | None = None,
) -> ToolPosture:
    """The outcome of the rule/template/pin layers for `tool` of `service` on `profile`.

    Pass the profile's `RuleIndex` when asking for many tools: it saves a scan of the rules per tool.
    """
    spec = profile.spec
    base: ToolPosture | None = None
    index = rules or RuleIndex.from_profile(profile)
    action_rule = index.actions.get(tool)
    service_rule = index.services.get(service)
    if action_rule is not None:
        base = ToolPosture(
            action_rule.decision, "action rule", f"the rule for action {tool} says {action_rule.outcome}"
        )
    elif service_rule is not None:
        base = ToolPosture(
            service_rule.decision, "service rule", f"the rule for service {service} says {service_rule.outcome}"
        )
    else:
        template = snapshot.template_for(profile)
        base = ToolPosture(
            template.outcome_for(action_class),
            "template",
            f"the {template.name} template maps {action_class.value} to {template.outcome_for(action_class).value}",
        )
    if base.outcome is Outcome.AUTO and service in spec.pins:
        return ToolPosture(Outcome.APPROVE, "pin", f"service {service} is pinned: every call waits for approval")
    return base
