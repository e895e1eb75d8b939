"""What org.toml names exists: its default template, its groups' members, an owner, and what each
policy scopes and routes to. O002, O004, O005, O007, and O003 with `routing`; the default
template's O006 comes from `selections`. Run by `check_tree` on every load, after the profiles.
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.checks.tree.routing import check_routing
from reconciler.config.checks.tree.selections import check_template
from reconciler.config.findings import Finding, suggest
from reconciler.config.models import OrgFile, Policy
from reconciler.config.snapshot import Snapshot

__all__ = ["check_org"]

_FILE = "config/org.toml"


def check_org(snapshot: Snapshot) -> Iterator[Finding]:
    """Every check of org.toml; policy scopes name profiles, so `snapshot` holds the resolved ones."""
    org = snapshot.org
    if org is None:
        if _FILE not in snapshot.documents:  # a file there that did not load has findings of its own
            yield Finding(
                "O007",
                _FILE,
                1,
                "config/org.toml is missing",
                "an org.toml naming the org and its owners",
                'apiVersion = "handler.org/v1"\nname = "<org>"\n[members.<id>]\nowner = true',
            )
        return
    yield from check_template(snapshot, _FILE, ("defaults", "template"), org.defaults.template)
    yield from _check_groups(snapshot, org)
    if not any(m.owner for m in org.members.values()):
        yield Finding(
            "O005",
            _FILE,
            snapshot.line_of(_FILE, "members"),
            "no member has owner = true, so holds that no routing or policy sends anywhere have no approver",
            "at least one owner",
            "[members.<id>]\nowner = true",
        )
    names = {
        "action": snapshot.tool_names(snapshot.interfaces),
        "service": {i.name for i in snapshot.interfaces.values()},
        "profile": set(snapshot.profiles),
        "group": set(org.groups),
    }
    for i, policy in enumerate(org.policies):
        yield from _check_policy(snapshot, i, policy, names)


def _check_groups(snapshot: Snapshot, org: OrgFile) -> Iterator[Finding]:
    for group, spec in org.groups.items():
        for i, member in enumerate(spec.members):
            if member not in org.members:
                hint = suggest(member, org.members, none="(no members)")
                yield Finding(
                    "O004",
                    _FILE,
                    snapshot.line_of(_FILE, "groups", group, "members", i),
                    f"group '{group}' lists '{member}', who is not a member{hint.did_you_mean}",
                    hint.one_of,
                    f"add [members.{member}]",
                )


def _check_policy(snapshot: Snapshot, index: int, policy: Policy, names: dict[str, set[str]]) -> Iterator[Finding]:
    """The policy at `index` scopes something that exists (`names`: kind → what exists) and routes to someone."""
    kind = policy.scope.kind
    value = getattr(policy.scope, kind)
    if kind != "org" and value not in names[kind]:
        yield Finding(
            "O002",
            _FILE,
            snapshot.line_of(_FILE, "policies", index, "scope"),
            f"policy '{policy.name}' scopes "
            f"{kind} '{value}', which does not exist{suggest(str(value), names[kind]).did_you_mean}",
            f"an existing {kind}",
            "correct the scope",
        )
    if policy.approver is None:
        return
    if policy.approver.to == "none":
        yield Finding(
            "O003",
            _FILE,
            snapshot.line_of(_FILE, "policies", index, "approver"),
            f"policy '{policy.name}' routes to none, which names no approver",
            "to = member, slack or caller",
            'approver = { to = "member", member = "<id>" }',
        )
    yield from check_routing(snapshot, _FILE, ("policies", index, "approver"), policy.approver)
