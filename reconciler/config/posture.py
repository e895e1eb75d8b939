"""What a profile's static governance gives each of its tools: template, then rules, then pins.

This is the config-only part of the decision (design §7, layers 2-4), shared by `handler plan`
and by the governance room, which adds the guardrails, policies and routing that need state.
"""

from __future__ import annotations

from dataclasses import dataclass

from reconciler.config.models import ActionClass, Outcome
from reconciler.config.snapshot import Profile, Snapshot

__all__ = ["ToolPosture", "tool_posture"]


@dataclass(frozen=True, slots=True)
class ToolPosture:
    outcome: Outcome
    layer: str  # "action rule", "service rule", "template", "pin"
    detail: str  # a phrase saying why, for traces and plans


def tool_posture(
    snapshot: Snapshot, profile: Profile, service: str, tool: str, action_class: ActionClass
) -> ToolPosture:
    """The outcome of the rule/template/pin layers for `tool` of `service` on `profile`."""
    spec = profile.spec
    base: ToolPosture | None = None
    action_rule = next((r for r in spec.rules if r.action == tool), None)
    service_rule = next((r for r in spec.rules if r.service == service), None)
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
