"""Held calls: created pending, decided once, claimed once, finished once.

A hold never expires. Each transition is one conditional UPDATE in the store (`store.holds`), so
when two routers, or a router and the CLI, race on the same hold exactly one wins: a hold is
decided once and an approved hold is claimed — and run — exactly once. Every transition writes
an audit row in the same transaction. Who may decide a hold is answered here too (`may_decide`
for people, `caller_refusal` over MCP). Called by the governed gate, `handler approvals` and the dashboard.
"""

from __future__ import annotations

import itertools
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

from reconciler.config.snapshot import Snapshot
from reconciler.governance.errors import GovernanceError, HoldNotFoundError, NotAllowedError
from reconciler.governance.gate import CallRequest, HoldStatus
from reconciler.governance.rulebook import from_micros
from reconciler.governance.store import Store
from reconciler.governance.store import holds as rows
from reconciler.governance.store.audit import record

__all__ = [
    "FINAL_HINT",
    "LISTED_HOLDS",
    "PENDING_HINT",
    "REASON_LIMIT",
    "Hold",
    "approved_ids",
    "caller_refusal",
    "claim_hold",
    "clean_reason",
    "count_holds",
    "decide_hold",
    "finish_hold",
    "get_hold",
    "hold_status",
    "list_holds",
    "listed_holds",
    "may_decide",
    "new_request_id",
    "recent_decisions",
]

HoldState = Literal["pending", "approved", "rejected", "running", "executed", "failed"]


PENDING_HINT = "It stays pending until a person decides; ask handler_status with this request_id."
FINAL_HINT = "This is final: the hold is never run again."
REASON_LIMIT = 2000  # characters of a decision's reason
# The router's default call timeout (docs/architecture.md §6): a hold running longer may have lost its router, and
# a reservation older is charged as one a stopped router never settled (`ledger.RECONCILE_AFTER_SECONDS`).
STRANDED_AFTER_SECONDS = 300.0


# A random prefix per process and a counter: unique across routers sharing a store, and cheap (the
# kernel's random source costs tens of microseconds a call on some machines). Ids are not secrets:
# `handler_status` and `handler_decide` check who asks.
_PREFIX = secrets.token_hex(5)
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    return f"req_{_PREFIX}{next(_COUNTER):08x}"


@dataclass(frozen=True, slots=True)
class Hold:
    id: str
    created_at: float
    revision: str
    profile: str
    instance: str
    parent_instance: str | None
    interface: str
    tool: str
    binding: str
    arguments: Mapping[str, Any]
    cost: int
    approver: Mapping[str, Any] | None
    reason: str
    trace: Sequence[Mapping[str, Any]]
    state: str
    decided_by: str | None
    decided_at: float | None
    claimed_by: str | None
    finished_at: float | None
    result: Mapping[str, Any] | None
    message: str
    charged: int | None
    decision_reason: str | None  # why the approver decided so, in their words (the held agent reads it)
    cause: str | None  # why an approved run failed, for people (never shown to the agent)
    claimed_at: float | None = None  # when a router took it to run (state running)

    def long_running(self, at: float | None = None) -> bool:
        """Running for longer than any call is let run by default: its router may have stopped mid-run."""
        return (self.state == "running" and self.claimed_at is not None
                and (time.time() if at is None else at) - self.claimed_at > STRANDED_AFTER_SECONDS)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Hold:
        """A hold from its stored row (which has a few columns more, such as `claimed_at`)."""
        return cls(**{name: row[name] for name in _FIELDS})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


_FIELDS = tuple(f.name for f in fields(Hold))


def get_hold(store: Store, request_id: str) -> Hold:
    found = rows.fetch_hold(store, request_id)
    if found is None:
        raise HoldNotFoundError(f"no hold '{request_id}': `handler approvals list` shows the holds")
    return Hold.from_row(found)


LISTED_HOLDS = 200  # what a listing shows unless asked for more; each says how many it leaves out


def list_holds(store: Store, states: Sequence[str] = ("pending",), limit: int | None = LISTED_HOLDS) -> list[Hold]:
    """Holds in these states (every hold when `states` is empty), oldest first; `limit` None: all of them."""
    return [Hold.from_row(r) for r in rows.fetch_holds(store, states, limit)]


def listed_holds(store: Store, states: Sequence[str] = ("pending",),
                 limit: int | None = LISTED_HOLDS) -> tuple[list[Hold], int]:
    """`list_holds`, with how many holds are in these states in all: counted only when the list is full."""
    found = list_holds(store, states, limit)
    return found, count_holds(store, states) if limit is not None and len(found) >= limit else len(found)


def recent_decisions(store: Store, limit: int = 50) -> list[Hold]:
    """The holds decided most recently, newest first (the dashboard's history)."""
    return [Hold.from_row(r) for r in rows.fetch_recent_decisions(store, limit)]


def count_holds(store: Store, states: Sequence[str] = ("pending",)) -> int:
    """How many holds are in these states (every hold when `states` is empty)."""
    return rows.count_holds(store, states)


def approved_ids(store: Store, limit: int = 50) -> list[str]:
    return rows.approved_ids(store, limit)


def may_decide(hold: Hold, snapshot: Snapshot | None, member: str) -> str | None:
    """Why `member` may not decide `hold` from the command line or dashboard, or None if they may.

    The org's owners may decide any hold; a hold routed to a member, that member; a hold posted to a
    Slack channel, any member. A hold routed to the caller belongs to the orchestrator
    (`handler_decide`), or an owner. With no org members configured, anyone at the machine may decide.
    """
    org = snapshot.org if snapshot else None
    if org is None or not org.members:
        return None
    if member not in org.members:
        return f"'{member}' is not a member of the org (members: {', '.join(sorted(org.members))})"
    if org.members[member].owner:
        return None
    approver = hold.approver or {}
    to = approver.get("to")
    if to == "member" and approver.get("member") == member:
        return None
    if to == "slack":
        return None
    whom = {"member": f"member {approver.get('member')}", "caller": "the instance that started the agent",
            "owners": "the org's owners"}.get(str(to), "an owner")
    return f"this hold is routed to {whom}; {member} is not an owner"


def clean_reason(reason: str | None) -> str | None:
    """A decision's reason as it is stored: trimmed, None when empty; refused when too long to read."""
    text = " ".join((reason or "").split())
    if len(text) > REASON_LIMIT:
        raise GovernanceError(f"the reason is {len(text)} characters long; give at most {REASON_LIMIT} "
                              "(the agent and the audit trail read it whole)")
    return text or None


def decide_hold(store: Store, request_id: str, decision: Literal["approve", "reject"], actor: str,
                check: Any = None, *, reason: str | None = None) -> Hold:
    """Move a pending hold to approved or rejected, once, with the decider's reason if they give one.

    `check(hold)` may raise `NotAllowedError` first.
    """
    reason = clean_reason(reason)
    hold = get_hold(store, request_id)
    if check is not None:
        check(hold)
    if hold.state != "pending":
        raise NotAllowedError(f"hold {request_id} was already decided: it is {hold.state}"
                              + (f" (by {hold.decided_by})" if hold.decided_by else ""))
    state = "approved" if decision == "approve" else "rejected"
    said = f"{state} by {actor}" + (f": {reason}" if reason else "")
    with store.begin() as tx:
        if not rows.set_decided(tx, request_id, state, actor, said if state == "rejected" else "", reason):
            raise NotAllowedError(f"hold {request_id} was decided by someone else just now")
        record(tx, state, request_id=request_id, profile=hold.profile, instance=hold.instance, tool=hold.tool,
               actor=actor, status=state, detail={"reason": said})
        store.notify(tx, request_id)
    return get_hold(store, request_id)


def claim_hold(store: Store, request_id: str, runner: str) -> bool:
    """Take an approved hold to run it; True for exactly one caller, however many routers ask."""
    with store.begin() as tx:
        if not rows.set_claimed(tx, request_id, runner):
            return False
        record(tx, "claimed", request_id=request_id, actor=runner, status="running")
    return True


def finish_hold(store: Store, request_id: str, *, ok: bool, result: Mapping[str, Any] | None, message: str,
                charged: int | None, cause: str | None = None, approved_by: str | None = None) -> None:
    """Record how a claimed hold ended: executed with its result, or failed with the agent's message and,
    for people, its cause ("approved by bob; the run failed: ..." in the audit trail). Once: a hold finished
    already (a retry whose first try was written after all) is left as it is."""
    state = "executed" if ok else "failed"
    cause = None if ok else (cause or message)
    approved = f"approved by {approved_by}" if approved_by else "approved"
    said = f"{approved}; executed" if ok else f"{approved}; the run failed: {cause}"
    with store.begin() as tx:
        if not rows.set_finished(tx, request_id, state, result, message, charged, cause):
            return
        record(tx, state, request_id=request_id, status=state,
               detail={"reason": said, "message": message, "cause": cause, "charged": charged})
        store.notify(tx, request_id)


def caller_refusal(hold: Hold, caller: CallRequest) -> str | None:
    """Why this MCP caller may not decide the hold: only the parent instance may, never the agent itself
    (docs/architecture.md §6)."""
    to = (hold.approver or {}).get("to")
    if to != "caller":
        return (f"Blocked: hold {hold.id} is routed to {to or 'a person'}, not to a calling instance; "
                "it is decided with `handler approvals` or the dashboard.")
    if caller.instance == hold.instance:
        return f"Blocked: an agent cannot decide its own hold {hold.id}."
    if not caller.proven:
        return (f"Blocked: hold {hold.id} is decided by the run that started the held agent, proven by the secret "
                "the router gave that run; this session presented none, so it cannot decide it.")
    if hold.parent_instance is None or caller.instance != hold.parent_instance:
        return f"Blocked: only the instance that started the held agent may decide hold {hold.id}."
    return None


def hold_status(hold: Hold, news: str = "") -> HoldStatus:
    """What `handler_status` tells the agent of its hold; a final state carries no advice to wait or retry.

    `news`, of a pending hold: who was told of it (`notices.pending_news`).
    """
    charged = None if hold.charged is None else from_micros(hold.charged)
    if hold.state == "pending":
        return HoldStatus("pending", " ".join(filter(None, (hold.reason, news, PENDING_HINT))))
    if hold.long_running():
        return HoldStatus("pending", f"Approved by {hold.decided_by}; it has run for longer than a call may by "
                          "default, so the router running it may have stopped, and then no one knows whether it ran: "
                          "it is not run again. Ask for it again if it is still needed and you can tell it did not "
                          "run.")
    if hold.state in ("approved", "running"):
        return HoldStatus("pending", f"Approved by {hold.decided_by}; it is running now.")
    if hold.state == "rejected":
        why = f": {hold.decision_reason}" if hold.decision_reason else " (no reason given)"
        return HoldStatus("rejected", f"{_sentence(f'Rejected by {hold.decided_by}{why}')} {FINAL_HINT}")
    if hold.state == "executed":
        why = f" ({_sentence(hold.decision_reason)[:-1]})" if hold.decision_reason else ""
        return HoldStatus("executed", f"Approved by {hold.decided_by}{why} and executed.", hold.result, charged)
    failed = _sentence(f"Approved by {hold.decided_by}; the run failed: {hold.message or 'the call failed'}")
    return HoldStatus("failed", f"{failed} {FINAL_HINT}", hold.result, charged)


def _sentence(text: str) -> str:
    """`text` ending in one full stop (or its own question or exclamation mark), whatever it quotes."""
    return text if text.endswith(("!", "?", ".")) else text + "."
