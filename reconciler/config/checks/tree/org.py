"""What org.toml names exists: its default template, its groups' members, an owner, and what each
policy scopes and routes to, and that `[http.auth]` names its identity provider by https URLs. O002, O004, O005,
O007, O008, and O003 with `routing`; the default template's O006 comes from `selections`. Run by `check_tree` on
every load, after the profiles.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from urllib.parse import urlsplit

from reconciler.config.checks.tree.routing import check_routing
from reconciler.config.checks.tree.selections import check_template
from reconciler.config.findings import Finding, suggest
from reconciler.config.models import HttpAuth, OrgFile, Policy
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
    if org.http.auth is not None:
        yield from _check_http_auth(snapshot, org.http.auth)


def _check_http_auth(snapshot: Snapshot, auth: HttpAuth) -> Iterator[Finding]:
    """The issuer and its key set are https URLs (http on loopback, for a provider on this machine): keys fetched
    over plain HTTP from elsewhere could be anyone's, and then so could every credential."""
    for key, url in (("issuer", auth.issuer), ("jwksUri", auth.jwksUri)):
        if url is not None and (problem := _url_problem(url, issuer=key == "issuer")) is not None:
            yield Finding(
                "O008",
                _FILE,
                snapshot.line_of(_FILE, "http", "auth", key),
                f"[http.auth] {key} {url[:200]!r} {problem}",
                "an https URL (http only for a provider on loopback)",
                f'{key} = "https://id.example.org/realms/agents"' if key == "issuer" else
                f'{key} = "https://id.example.org/realms/agents/protocol/openid-connect/certs"',
            )


def _url_problem(url: str, *, issuer: bool) -> str | None:
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "is not an absolute http(s) URL"
    if issuer and (parts.query or parts.fragment):  # RFC 8414 §2: an issuer identifier has neither
        return "has a query or fragment, which an issuer identifier never has"
    if parts.scheme == "http" and not _loopback(parts.hostname):
        return "is plain http beyond this machine: its keys could be replaced on the way"
    return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
