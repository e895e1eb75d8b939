"""Approver notifications as an outbox in the store: whom a hold notifies, and each notice's life.

`add_notices` runs inside the transaction that stores the hold, so a hold is never stored without
its notices, whichever router made it and whatever happens to that router next. A notifier
(`reconciler.web.notifier`) claims due notices (`claim_due`: one conditional UPDATE each, so of
several notifiers exactly one sends a notice), sends them, and records the outcome: `mark_sent`,
or `mark_failed`, which retries with a growing delay up to `MAX_ATTEMPTS`. Once the hold is
decided, however it was, a sent Slack message is claimed once more (`claim_decided`, state
`closed`) to replace its buttons with the decision. A notice claimed by a
notifier that died is claimable again after `STALE_SECONDS`: notices are sent at least once.

Targets (the channels of docs/architecture.md §7): a hold routed to a member emails that member;
one posted to a Slack channel goes to that channel; one left to the org's owners emails every
owner. A hold routed to the caller is decided over MCP (`handler_decide`) and notifies nobody.
Every hold is also on the dashboard, which needs no notice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from reconciler.config.models import OrgFile
from reconciler.governance.store import Store, Transaction, now
from reconciler.governance.store import notices as rows

__all__ = [
    "MAX_ATTEMPTS",
    "STALE_SECONDS",
    "Notice",
    "Target",
    "add_notices",
    "claim_decided",
    "claim_due",
    "describe",
    "list_notices",
    "mark_failed",
    "mark_sent",
    "mark_skipped",
    "targets_for",
    "troubled_notices",
]

MAX_ATTEMPTS = 8
STALE_SECONDS = 300.0
_FIRST_RETRY_SECONDS = 5.0
_LONGEST_RETRY_SECONDS = 3600.0


@dataclass(frozen=True, slots=True)
class Target:
    channel: str  # email | slack
    target: str  # an address, a channel
    member: str | None = None  # whom an email's link decides as


@dataclass(frozen=True, slots=True)
class Notice:
    id: int
    hold_id: str
    channel: str
    target: str
    member: str | None
    state: str
    attempts: int
    next_at: float
    sent_at: float | None
    ref: str | None
    error: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Notice:
        """A notice from its stored row (which has a column more, `claimed_at`)."""
        return cls(**{f.name: row[f.name] for f in fields(cls)})


def targets_for(approver: Mapping[str, Any] | None, org: OrgFile | None) -> list[Target]:
    """Where a hold with this approver is announced; empty when no channel reaches its approver."""
    if not approver:
        return []
    to = approver.get("to")
    if to == "slack" and isinstance(approver.get("channel"), str):
        allowed = org.slack.channels if org is not None else []
        # The allow-list is checked when the config is saved; a channel off it is never posted to.
        return [Target("slack", approver["channel"])] if not allowed or approver["channel"] in allowed else []
    members = org.members if org is not None else {}
    if to == "member":
        names = [approver.get("member")]
    elif to == "owners":
        names = list(approver.get("members") or [name for name, m in members.items() if m.owner])
    else:
        return []
    out = []
    for name in names:
        member = members.get(name) if isinstance(name, str) else None
        if member is not None and member.email:
            out.append(Target("email", member.email, name))
    return out


def describe(targets: Sequence[Target]) -> str:
    """How the approver hears of a hold, for the agent's pending message ("" when no channel reaches them)."""
    if not targets:
        return ""
    where = ", ".join(f"Slack {t.target}" if t.channel == "slack" else f"{t.member} by email" for t in targets)
    return f"Notifying {where}."


def add_notices(tx: Transaction, hold_id: str, targets: Sequence[Target]) -> None:
    """Queue the hold's notices inside the caller's transaction (the one that inserts the hold)."""
    if targets:
        rows.insert_notices(tx, [{"hold_id": hold_id, "channel": t.channel, "target": t.target, "member": t.member}
                                 for t in targets])


def claim_due(store: Store, channels: Sequence[str], *, limit: int = 20) -> list[Notice]:
    """Take up to `limit` notices due now on these channels; each is claimed by exactly one caller."""
    if not channels:
        return []
    return [Notice.from_row(r) for r in rows.claim_due(store, channels, STALE_SECONDS, limit)]


def mark_sent(store: Store, notice: Notice, ref: str | None = None) -> None:
    rows.update_notice(store, notice.id, state="sent", sent_at=now(), attempts=notice.attempts + 1, ref=ref,
                       error=None)


def mark_skipped(store: Store, notice: Notice, why: str) -> None:
    """Nothing to announce any more (the hold was decided first): the notice is closed unsent."""
    rows.update_notice(store, notice.id, state="skipped", error=why)


def mark_failed(store: Store, notice: Notice, error: str, *, final: bool = False,
                not_before: float | None = None) -> str:
    """Record a failed attempt: retried later, or `failed` for good (after `MAX_ATTEMPTS`, or `final`).

    `not_before` (seconds) is the channel's own word on when to come back (a rate limit's Retry-After).
    """
    attempts = notice.attempts + 1
    state = "failed" if final or attempts >= MAX_ATTEMPTS else "pending"
    delay = min(_FIRST_RETRY_SECONDS * 2 ** (attempts - 1), _LONGEST_RETRY_SECONDS)
    delay = max(delay, min(not_before or 0.0, _LONGEST_RETRY_SECONDS))
    rows.update_notice(store, notice.id, state=state, attempts=attempts, next_at=now() + delay, error=error[:2000])
    return state


def claim_decided(store: Store, channel: str, *, limit: int = 20) -> list[Notice]:
    """Sent notices of holds decided since (for the channel to show the decision); each is taken once.

    A taken notice is `closed`: whatever happens to the update, it is not taken again.
    """
    return [Notice.from_row(r) for r in rows.claim_decided(store, channel, limit)]


def troubled_notices(store: Store, limit: int = 20) -> list[Notice]:
    """Notices that failed for good, or whose last attempt failed: what an operator should look at."""
    return [Notice.from_row(r) for r in rows.fetch_troubled(store, limit)]


def list_notices(store: Store, hold_id: str | None = None, *, states: Sequence[str] = ()) -> list[Notice]:
    return [Notice.from_row(r) for r in rows.fetch_notices(store, hold_id, states)]
