"""Held calls in the store: created pending, decided once, claimed once, finished once.

A hold never expires. Each transition is one conditional UPDATE (`WHERE state = <expected>`), so
when two routers, or a router and the CLI, race on the same hold exactly one wins: a hold is
decided once and an approved hold is claimed — and run — exactly once. Every transition writes
an audit row in the same transaction. Called by the governor and by `handler approvals`.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from reconciler.config.snapshot import Snapshot
from reconciler.governance.auditing import record
from reconciler.governance.errors import HoldNotFoundError, NotAllowedError
from reconciler.governance.gate import CallRequest, HoldStatus
from reconciler.governance.rulebook import from_micros
from reconciler.governance.store import Store, holds, now

__all__ = [
    "PENDING_HINT",
    "Hold",
    "approved_ids",
    "caller_refusal",
    "claim_hold",
    "count_holds",
    "decide_hold",
    "finish_hold",
    "get_hold",
    "hold_status",
    "insert_hold",
    "list_holds",
    "may_decide",
    "new_request_id",
    "recent_decisions",
]

HoldState = Literal["pending", "approved", "rejected", "running", "executed", "failed"]


PENDING_HINT = "It stays pending until a person decides; ask handler_status with this request_id."


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

    @classmethod
    def from_row(cls, row: Any) -> Hold:
        m = row._mapping
        return cls(**{f.name: m[f.name] for f in fields(cls)})

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def insert_hold(conn: Connection, values: Mapping[str, Any]) -> None:
    conn.execute(sa.insert(holds).values(created_at=now(), state="pending", message="", **values))


def get_hold(store: Store, request_id: str) -> Hold:
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(holds).where(holds.c.id == request_id)).first()
    if row is None:
        raise HoldNotFoundError(f"no hold '{request_id}': `handler approvals list` shows the holds")
    return Hold.from_row(row)


def list_holds(store: Store, states: Sequence[str] = ("pending",), limit: int = 200) -> list[Hold]:
    query = sa.select(holds).order_by(holds.c.created_at).limit(limit)
    if states:
        query = query.where(holds.c.state.in_(states))
    with store.engine.connect() as conn:
        return [Hold.from_row(r) for r in conn.execute(query)]


def recent_decisions(store: Store, limit: int = 50) -> list[Hold]:
    """The holds decided most recently, newest first (the dashboard's history)."""
    query = (sa.select(holds).where(holds.c.state != "pending").order_by(holds.c.decided_at.desc()).limit(limit))
    with store.engine.connect() as conn:
        return [Hold.from_row(r) for r in conn.execute(query)]


def count_holds(store: Store, state: str = "pending") -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.select(sa.func.count()).select_from(holds).where(holds.c.state == state)).scalar()
                   or 0)


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


def decide_hold(store: Store, request_id: str, decision: Literal["approve", "reject"], actor: str,
                check: Any = None) -> Hold:
    """Move a pending hold to approved or rejected, once. `check(hold)` may raise `NotAllowedError` first."""
    hold = get_hold(store, request_id)
    if check is not None:
        check(hold)
    if hold.state != "pending":
        raise NotAllowedError(f"hold {request_id} was already decided: it is {hold.state}"
                         + (f" (by {hold.decided_by})" if hold.decided_by else ""))
    state = "approved" if decision == "approve" else "rejected"
    with store.begin() as conn:
        done = conn.execute(sa.update(holds).where(holds.c.id == request_id, holds.c.state == "pending")
                            .values(state=state, decided_by=actor, decided_at=now(),
                                    message="rejected by " + actor if state == "rejected" else ""))
        if done.rowcount != 1:
            raise NotAllowedError(f"hold {request_id} was decided by someone else just now")
        record(conn, state, request_id=request_id, profile=hold.profile, instance=hold.instance, tool=hold.tool,
               actor=actor, status=state)
        store.notify(conn, request_id)
    return get_hold(store, request_id)


def claim_hold(store: Store, request_id: str, runner: str) -> bool:
    """Take an approved hold to run it; True for exactly one caller, however many routers ask."""
    with store.begin() as conn:
        done = conn.execute(sa.update(holds).where(holds.c.id == request_id, holds.c.state == "approved")
                            .values(state="running", claimed_by=runner, claimed_at=now()))
        if done.rowcount == 1:
            record(conn, "claimed", request_id=request_id, actor=runner, status="running")
            return True
    return False


def approved_ids(store: Store, limit: int = 50) -> list[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(holds.c.id).where(holds.c.state == "approved")
                            .order_by(holds.c.decided_at).limit(limit))
        return [r[0] for r in rows]


def finish_hold(store: Store, request_id: str, *, ok: bool, result: Mapping[str, Any] | None, message: str,
                charged: int | None) -> None:
    """Record how a claimed hold ended: executed with its result, or failed with the reason."""
    state = "executed" if ok else "failed"
    with store.begin() as conn:
        conn.execute(sa.update(holds).where(holds.c.id == request_id, holds.c.state == "running")
                     .values(state=state, finished_at=now(), result=dict(result) if result is not None else None,
                             message=message, charged=charged))
        record(conn, state, request_id=request_id, status=state,
               detail={"message": message, "charged": charged})
        store.notify(conn, request_id)


def caller_refusal(hold: Hold, caller: CallRequest) -> str | None:
    """Why this MCP caller may not decide the hold: only the parent instance may, never the agent itself
    (docs/architecture.md §6)."""
    to = (hold.approver or {}).get("to")
    if to != "caller":
        return (f"Blocked: hold {hold.id} is routed to {to or 'a person'}, not to a calling instance; "
                "it is decided with `handler approvals` or the dashboard.")
    if caller.instance == hold.instance:
        return f"Blocked: an agent cannot decide its own hold {hold.id}."
    if hold.parent_instance is None or caller.instance != hold.parent_instance:
        return f"Blocked: only the instance that started the held agent may decide hold {hold.id}."
    return None


def hold_status(hold: Hold) -> HoldStatus:
    charged = None if hold.charged is None else from_micros(hold.charged)
    if hold.state == "pending":
        return HoldStatus("pending", f"{hold.reason} {PENDING_HINT}")
    if hold.state in ("approved", "running"):
        return HoldStatus("pending", f"Approved by {hold.decided_by}; it is running now.")
    if hold.state == "rejected":
        return HoldStatus("rejected", f"Rejected by {hold.decided_by}.")
    if hold.state == "executed":
        return HoldStatus("executed", f"Approved by {hold.decided_by} and executed.", hold.result, charged)
    return HoldStatus("failed", hold.message or "the call failed", hold.result, charged)
