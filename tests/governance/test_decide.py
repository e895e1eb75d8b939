"""The decision: a table over every layer and every routing, then the properties docs/architecture.md §7 promises."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.governance.decide import LAYERS, Decision, SpendState, decide_call
from reconciler.governance.rulebook import compile_rulebook, to_micros
from tests.governance.builders import OWNERS_ORG, make_snapshot

ALICE = {"to": "member", "member": "alice"}
OWNERS = {"to": "owners", "members": ["alice"]}


def decide(profile: dict[str, Any], tool: str, *, org: dict[str, Any] | None = None, cost: float | None = None,
           state: SpendState | None = None, templates: dict[str, Any] | None = None,
           instance: str = "i1") -> Decision:
    snapshot = make_snapshot({"p": profile}, org=org, templates=templates)
    entry = compile_rulebook(snapshot).entry("p", tool)
    assert entry is not None
    return decide_call(entry, instance, None if cost is None else to_micros(cost), state or SpendState())


def policy(name: str, scope: dict[str, Any], approver: dict[str, Any] | None = None, priority: int = 0,
           **when: float) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "scope": scope, "priority": priority}
    if approver:
        out["approver"] = approver
    if when:
        out["when"] = when
    return out


ORG = dict(OWNERS_ORG)
BOB = {"to": "member", "member": "bob"}
SLACK = {"to": "slack", "channel": "#approvals"}

# (id, profile, org, tool, cost, state, decision, approver, deciding layer)
TABLE: list[tuple[str, dict[str, Any], dict[str, Any] | None, str, float | None, SpendState | None, str,
                  dict[str, Any] | None, str]] = [
    ("no template no org: write held", {}, None, "mail_send", None, None, "approve", None, "template"),
    ("no template no org: read runs", {}, None, "mail_read", None, None, "auto", None, "template"),
    ("no template: destructive held, owners", {}, ORG, "mail_delete", None, None, "approve", OWNERS, "template"),
    ("balanced write → owners", {"template": "balanced"}, ORG, "mail_send", None, None, "approve", OWNERS,
     "template"),
    ("restrictive write blocked", {"template": "restrictive"}, ORG, "mail_send", None, None, "block", None,
     "template"),
    ("restrictive read runs", {"template": "restrictive"}, ORG, "mail_read", None, None, "auto", None, "template"),
    ("permissive destructive runs", {"template": "permissive"}, ORG, "mail_delete", None, None, "auto", None,
     "template"),
    ("org default template applies", {}, {**ORG, "defaults": {"template": "restrictive"}}, "mail_send", None, None,
     "block", None, "template"),
    ("profile template beats org default", {"template": "permissive"}, {**ORG, "defaults": {"template":
     "restrictive"}}, "mail_send", None, None, "auto", None, "template"),
    ("action rule allow beats template", {"template": "balanced", "rules": [{"action": "mail_send",
     "outcome": "allow"}]}, ORG, "mail_send", None, None, "auto", None, "rule"),
    ("action rule beats service rule", {"rules": [{"service": "mail", "outcome": "block"},
     {"action": "mail_send", "outcome": "allow"}]}, ORG, "mail_send", None, None, "auto", None, "rule"),
    ("service rule applies to the others", {"rules": [{"service": "mail", "outcome": "block"},
     {"action": "mail_send", "outcome": "allow"}]}, ORG, "mail_read", None, None, "block", None, "rule"),
    ("rule approve on a read", {"template": "permissive", "rules": [{"service": "search", "outcome": "approve"}]},
     ORG, "search_query", None, None, "approve", OWNERS, "rule"),
    ("pin turns auto into approve", {"template": "permissive", "pins": ["mail"]}, ORG, "mail_read", None, None,
     "approve", OWNERS, "pin"),
    ("pin never lifts a template block", {"template": "restrictive", "pins": ["mail"]}, ORG, "mail_send", None, None,
     "block", None, "template"),
    ("pin never lifts a rule block", {"template": "permissive", "pins": ["mail"], "rules": [{"action": "mail_read",
     "outcome": "block"}]}, ORG, "mail_read", None, None, "block", None, "rule"),
    ("pin over an allow rule", {"pins": ["mail"], "rules": [{"action": "mail_send", "outcome": "allow"}]}, ORG,
     "mail_send", None, None, "approve", OWNERS, "pin"),
    ("cost policy holds above", {"template": "permissive"}, {**ORG, "policies": [policy("big", {"org": True}, ALICE,
     cost_above=1.0)]}, "search_query", 2.0, None, "approve", ALICE, "cost policy"),
    ("cost policy silent below", {"template": "permissive"}, {**ORG, "policies": [policy("big", {"org": True}, ALICE,
     cost_above=1.0)]}, "search_query", 0.5, None, "auto", None, "template"),
    ("cost policy at the bound does not hold", {"template": "permissive"}, {**ORG, "policies": [policy("big",
     {"org": True}, ALICE, cost_above=1.0)]}, "search_query", 1.0, None, "auto", None, "template"),
    ("cost_below holds cheap calls", {"template": "permissive"}, {**ORG, "policies": [policy("cheap",
     {"service": "search"}, BOB, cost_below=0.01)]}, "search_query", None, None, "approve", BOB, "cost policy"),
    ("routing none: full trust", {"template": "balanced", "routing": {"to": "none"}}, ORG, "mail_delete", None, None,
     "auto", None, "routing"),
    ("routing none skips cost policies", {"template": "permissive", "routing": {"to": "none"}}, {**ORG, "policies":
     [policy("big", {"org": True}, ALICE, cost_above=1.0)]}, "search_query", 5.0, None, "auto", None, "template"),
    ("routing none never lifts a block", {"template": "restrictive", "routing": {"to": "none"}}, ORG, "mail_send",
     None, None, "block", None, "template"),
    ("routing member", {"routing": BOB}, ORG, "mail_send", None, None, "approve", BOB, "routing"),
    ("routing slack", {"routing": SLACK}, ORG, "mail_send", None, None, "approve", SLACK, "routing"),
    ("routing caller", {"routing": {"to": "caller"}}, ORG, "mail_send", None, None, "approve", {"to": "caller"},
     "routing"),
    ("routing beats policies", {"routing": BOB}, {**ORG, "policies": [policy("s", {"service": "mail"}, SLACK)]},
     "mail_send", None, None, "approve", BOB, "routing"),
    ("unset routing: service policy outranks org policy", {}, {**ORG, "policies": [
        policy("o", {"org": True}, ALICE, priority=100), policy("s", {"service": "mail"}, SLACK, priority=1)]},
     "mail_send", None, None, "approve", SLACK, "routing"),
    ("unset routing: action policy outranks service policy", {}, {**ORG, "policies": [
        policy("s", {"service": "mail"}, SLACK), policy("a", {"action": "mail_send"}, BOB)]},
     "mail_send", None, None, "approve", BOB, "routing"),
    ("unset routing: profile outranks group", {"group": "g"}, {**ORG, "groups": {"g": {"members": ["bob"]}},
     "policies": [policy("g", {"group": "g"}, BOB), policy("p", {"profile": "p"}, SLACK)]},
     "mail_send", None, None, "approve", SLACK, "routing"),
    ("unset routing: group outranks org", {"group": "g"}, {**ORG, "groups": {"g": {"members": ["bob"]}},
     "policies": [policy("o", {"org": True}, ALICE), policy("g", {"group": "g"}, BOB)]},
     "mail_send", None, None, "approve", BOB, "routing"),
    ("unset routing: higher priority first in a scope", {}, {**ORG, "policies": [
        policy("low", {"org": True}, ALICE, priority=1), policy("high", {"org": True}, BOB, priority=9)]},
     "mail_send", None, None, "approve", BOB, "routing"),
    ("unset routing: a policy of another scope does not apply", {"group": "g"}, {**ORG, "policies": [
        policy("other", {"service": "search"}, BOB)]}, "mail_send", None, None, "approve", OWNERS, "routing"),
    ("unset routing: a cost condition not met does not route", {}, {**ORG, "policies": [
        policy("big", {"org": True}, BOB, cost_above=1.0)]}, "mail_send", 0.01, None, "approve", OWNERS, "routing"),
    ("custom template", {"template": "careful"}, ORG, "mail_read", None, None, "approve", OWNERS, "template"),
    ("suspended org blocks everything", {"template": "permissive"}, {**ORG, "suspended": True}, "mail_read", None,
     None, "block", None, "guardrails"),
    ("org cap", {"template": "permissive"}, {**ORG, "caps": {"monthly_usd": 1.0}}, "search_query", 0.02,
     SpendState(org=to_micros(0.99)), "block", None, "guardrails"),
    ("org cap exactly reached is allowed", {"template": "permissive"}, {**ORG, "caps": {"monthly_usd": 1.0}},
     "search_query", 0.01, SpendState(org=to_micros(0.99)), "auto", None, "template"),
    ("profile cap", {"template": "permissive", "caps": {"monthly_usd": 0.1}}, ORG, "search_query", None,
     SpendState(profile=to_micros(0.1)), "block", None, "guardrails"),
    ("instance cap", {"template": "permissive", "caps": {"instance_usd": 0.1}}, ORG, "search_query", None,
     SpendState(instance=to_micros(0.098)), "block", None, "guardrails"),
    ("empty prepaid balance", {"template": "permissive"}, {**ORG, "prepaid": True}, "search_query", None,
     SpendState(balance=0), "block", None, "guardrails"),
    ("prepaid balance covers", {"template": "permissive"}, {**ORG, "prepaid": True}, "search_query", None,
     SpendState(balance=to_micros(1.0)), "auto", None, "template"),
    ("guardrails beat an allow rule", {"rules": [{"action": "search_query", "outcome": "allow"}]},
     {**ORG, "suspended": True}, "search_query", None, None, "block", None, "guardrails"),
]


@pytest.mark.parametrize(("profile", "org", "tool", "cost", "state", "expected", "approver", "layer"),
                         [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_decision_table(profile: dict[str, Any], org: dict[str, Any] | None, tool: str, cost: float | None,
                        state: SpendState | None, expected: str, approver: dict[str, Any] | None, layer: str) -> None:
    templates = {"careful": {"read": "approve", "write": "block", "destructive": "block"}}
    d = decide(profile, tool, org=org, cost=cost, state=state, templates=templates)
    assert d.outcome.value == expected, d.reason
    assert (d.approver.to_dict() if d.approver else None) == approver
    assert [s.layer for s in d.trace] == list(LAYERS)
    decided = [s.layer for s in d.trace if s.decided]
    assert layer in decided, (decided, d.trace)
    assert d.status == {"auto": "executed", "approve": "pending", "block": "blocked"}[expected]
    assert d.reason.endswith(".")


def test_a_blocked_guardrail_names_the_cap() -> None:
    d = decide({"caps": {"monthly_usd": 0.1}}, "search_query", org=ORG, state=SpendState(profile=to_micros(0.1)))
    assert d.cap == "profile monthly cap"
    assert "profile p" in d.reason
    assert "$0.10" in d.reason
    d = decide({}, "search_query", org={**ORG, "prepaid": True}, state=SpendState(balance=0))
    assert d.cap == "prepaid balance"
    assert "handler balance add" in d.reason


def test_restrictive_block_reads_like_the_seed() -> None:
    d = decide({"template": "restrictive"}, "mail_send", org=ORG)
    assert d.reason == "Writes are not allowed for this agent (Restrictive template)."


def test_the_estimate_defaults_to_the_binding_price() -> None:
    assert decide({}, "search_query").cost == to_micros(0.005)
    assert decide({}, "search_query", cost=0.5).cost == to_micros(0.5)


# --- properties ----------------------------------------------------------------------------------

OUTCOMES = st.sampled_from(["allow", "approve", "block"])
TEMPLATES = st.sampled_from([None, "permissive", "balanced", "restrictive"])
TOOLS = ["mail_read", "mail_send", "mail_delete", "search_query"]
ROUTINGS = st.sampled_from([None, {"to": "none"}, BOB, SLACK, {"to": "caller"}])


@st.composite
def rules(draw: st.DrawFn) -> list[dict[str, str]]:
    out = []
    for _ in range(draw(st.integers(0, 3))):
        if draw(st.booleans()):
            out.append({"action": draw(st.sampled_from(TOOLS)), "outcome": draw(OUTCOMES)})
        else:
            out.append({"service": draw(st.sampled_from(["mail", "search"])), "outcome": draw(OUTCOMES)})
    return out


@st.composite
def policies(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0, 3))):
        scope = draw(st.sampled_from([{"org": True}, {"service": "mail"}, {"action": "search_query"},
                                      {"profile": "p"}]))
        when = draw(st.sampled_from([{}, {"cost_above": 0.5}, {"cost_below": 0.01}]))
        out.append(policy(f"p{i}", scope, draw(st.sampled_from([None, ALICE, BOB])), draw(st.integers(0, 5)), **when))
    return out


@st.composite
def configs(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, Any], str, float]:
    profile: dict[str, Any] = {"rules": draw(rules()), "pins": draw(st.lists(st.sampled_from(["mail", "search"]),
                                                                              unique=True))}
    template = draw(TEMPLATES)
    if template:
        profile["template"] = template
    routing = draw(ROUTINGS)
    if routing:
        profile["routing"] = routing
    org = {**ORG, "policies": draw(policies())}
    default = draw(TEMPLATES)
    if default:
        org["defaults"] = {"template": default}
    return profile, org, draw(st.sampled_from(TOOLS)), draw(st.sampled_from([0.0, 0.005, 0.01, 0.5, 2.0]))


FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(configs())
def test_a_pin_never_lifts_a_block(config: tuple[dict[str, Any], dict[str, Any], str, float]) -> None:
    profile, org, tool, cost = config
    unpinned = decide({**profile, "pins": []}, tool, org=org, cost=cost)
    pinned = decide({**profile, "pins": ["mail", "search"]}, tool, org=org, cost=cost)
    assert (unpinned.outcome.value == "block") == (pinned.outcome.value == "block")


@FAST
@given(configs())
def test_routing_none_never_holds(config: tuple[dict[str, Any], dict[str, Any], str, float]) -> None:
    profile, org, tool, cost = config
    profile = {**profile, "routing": {"to": "none"}, "pins": []}
    profile["rules"] = [r for r in profile["rules"] if r["outcome"] != "approve"]
    assert decide(profile, tool, org=org, cost=cost).outcome.value != "approve"


@FAST
@given(configs(), OUTCOMES, OUTCOMES)
def test_an_action_rule_beats_a_service_rule(config: tuple[dict[str, Any], dict[str, Any], str, float],
                                             action: str, service: str) -> None:
    profile, org, tool, cost = config
    svc = "search" if tool.startswith("search") else "mail"
    profile = {**profile, "pins": [], "routing": BOB, "rules": [{"service": svc, "outcome": service},
                                                                   {"action": tool, "outcome": action}]}
    org = {**org, "policies": []}
    d = decide(profile, tool, org=org, cost=cost)
    assert d.outcome.value == {"allow": "auto"}.get(action, action)
    assert d.trace[1].found.startswith(f"the rule for action {tool}")


@FAST
@given(configs())
def test_restrictive_never_auto_runs_a_write(config: tuple[dict[str, Any], dict[str, Any], str, float]) -> None:
    profile, org, _, cost = config
    profile = {**profile, "template": "restrictive",
               "rules": [r for r in profile["rules"] if r.get("action") != "mail_send" and r.get("service") != "mail"]}
    d = decide(profile, "mail_send", org=org, cost=cost)
    assert d.outcome.value == "block"


@FAST
@given(configs())
def test_no_template_no_routing_no_rule_holds_a_write(
        config: tuple[dict[str, Any], dict[str, Any], str, float]) -> None:
    profile, org, _, cost = config
    profile = {k: v for k, v in profile.items() if k not in ("template", "routing")}
    profile["rules"] = []
    org = {k: v for k, v in org.items() if k != "defaults"}
    d = decide(profile, "mail_send", org=org, cost=cost)
    assert d.outcome.value == "approve"
    assert d.approver is not None


def test_money_reads_as_people_write_it_below_zero_too() -> None:
    from reconciler.governance.decide import usd

    assert [usd(m) for m in (12_500_000, 5_000, 0, -30_000, -5_000)] == ["$12.50", "$0.005", "$0.00", "-$0.03",
                                                                          "-$0.005"]


def test_a_block_decided_on_budget_leases_says_they_are_counted() -> None:
    """Another router's lease counted as spent read '$0.25 of $0.25 spent' while $0.05 was."""
    from reconciler.governance.decide import SpendState, guardrail_block
    from reconciler.governance.rulebook import CapSet

    caps = CapSet(org=None, profile=250_000, instance=None, prepaid=False, suspended=False, org_name="acme",
                  profile_file="config/profiles/tester.toml")
    for state, said in ((SpendState(profile=250_000, leased=True), "$0.25 of $0.25 spent or held in other routers' "
                         "budget leases this month (UTC)"), (SpendState(profile=250_000), "$0.25 of $0.25 spent this "
                                                             "month (UTC)")):
        blocked = guardrail_block(caps, "tester", "run-1", 5_000, state)
        assert blocked is not None
        assert said in blocked[1]
