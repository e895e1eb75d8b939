"""`handler explain`: what a call would get now, with the trace of every layer, as text or JSON.

The CLI calls `explain_call` with a loaded snapshot and the spend state read from the store (or an
empty one when no store exists yet) and prints `render_text` or `Decision.to_dict`.
"""

from __future__ import annotations

from reconciler.config.findings import did_you_mean
from reconciler.config.snapshot import Snapshot
from reconciler.governance.decide import Decision, SpendState, decide_call, usd
from reconciler.governance.errors import UnknownCallError
from reconciler.governance.ledger import read_state
from reconciler.governance.rulebook import Rulebook, ToolEntry, compile_rulebook, to_micros
from reconciler.governance.store import Store

__all__ = ["current_state", "explain_call", "find_entry", "moved_decisions", "render_text"]


def find_entry(rulebook: Rulebook, profile: str, tool: str) -> ToolEntry:
    """The compiled entry for (profile, tool), or `UnknownCallError` saying what exists."""
    if profile not in rulebook.profiles:
        raise UnknownCallError(f"no profile '{profile}'{did_you_mean(profile, rulebook.profiles)}"
                               f"; profiles: {', '.join(sorted(rulebook.profiles)) or 'none'}")
    entry = rulebook.entry(profile, tool)
    if entry is None:
        tools = rulebook.profiles[profile]
        raise UnknownCallError(f"profile '{profile}' serves no tool '{tool}'{did_you_mean(tool, tools)}"
                               f"; its tools: {', '.join(sorted(tools)) or 'none'}")
    return entry


def explain_call(
    snapshot: Snapshot,
    profile: str,
    tool: str,
    *,
    cost_usd: float | None = None,
    instance: str = "(any instance)",
    store: Store | None = None,
) -> Decision:
    """Decide a hypothetical call now, on the store's spend this month if given; nothing is written."""
    entry = find_entry(compile_rulebook(snapshot), profile, tool)
    cost = None if cost_usd is None else to_micros(cost_usd)
    state = current_state(store, entry, instance) if store is not None else SpendState()
    return decide_call(entry, instance, cost, state)


def render_text(decision: Decision, profile: str, tool: str) -> str:
    """The decision as a person reads it: the verdict, who approves, why, then the trace."""
    lines = [
        f"{tool} on profile {profile} at {usd(decision.cost)}: {decision.status} (decision: {decision.outcome.value})",
    ]
    if decision.approver is not None:
        lines.append(f"  approver: {decision.approver.describe()}")
    lines.append(f"  reason:   {decision.reason}")
    lines.append("  trace:")
    width = max(len(s.layer) for s in decision.trace)
    for step in decision.trace:
        mark = "*" if step.decided else " "
        lines.append(f"   {mark} {step.layer:<{width}}  {step.found}")
    lines.append("  (* = the layer set or changed the outcome)")
    return "\n".join(lines)


def moved_decisions(before: Snapshot, after: Snapshot, profile: str) -> list[tuple[str, Decision]]:
    """Each of `profile`'s tools whose decision a change from `before` to `after` moves (its status, outcome or
    approver), with its decision after, as `handler explain` gives it at no cost with nothing spent (the caps' own
    effect shows in the plan); every tool when `before` has no such profile."""
    old, new = _decisions(before, profile), _decisions(after, profile)
    return [(tool, decision) for tool, decision in new.items()
            if tool not in old or _verdict(old[tool]) != _verdict(decision)]


def _decisions(snapshot: Snapshot, profile: str) -> dict[str, Decision]:
    rulebook = compile_rulebook(snapshot)
    entries = {tool: rulebook.entry(profile, tool) for tool in sorted(rulebook.profiles.get(profile, ()))}
    return {tool: decide_call(entry, "(any instance)", None, SpendState())
            for tool, entry in entries.items() if entry is not None}


def _verdict(decision: Decision) -> tuple[str, str, str]:
    approver = decision.approver.describe() if decision.approver is not None else ""
    return decision.status, decision.outcome.value, approver


def current_state(store: Store, entry: ToolEntry, instance: str) -> SpendState:
    """This month's spend for the call's scopes, read without locking (for `handler explain`)."""
    with store.begin() as tx:
        return read_state(store, tx, entry.caps, entry.profile, instance, lock=False)
