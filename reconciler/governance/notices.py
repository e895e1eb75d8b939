"""Approver notifications as an outbox in the store: whom a hold notifies, and each notice's life.

`add_notices` runs inside the transaction that stores the hold, so a hold is never stored without
its notices, whichever router made it and whatever happens to that router next. A notifier
(`reconciler.web.notifier`) claims due notices (`claim_due`: one conditional UPDATE each, so of
several notifiers exactly one sends a notice), sends them, and records the outcome: `mark_sent`,
or `mark_failed`, which retries with a growing delay up to `MAX_ATTEMPTS`. Once the hold is
decided, however it was, a sent Slack message is claimed once more (`claim_decided`, state
`closed`) to replace its buttons with the decision. A notice claimed by a
notifier that died is claimable again after `STALE_SECONDS`: notices are sent at least once.

A notice on a channel the service that stores the hold cannot send on (no Slack token, no mail
server: its `Reach`) is stored `unsent`, with the reason, instead of waiting at 0 attempts for a
notifier that never comes; a notifier that has the channel still sends it while the hold is
pending. What the agent is told follows the notices (`pending_news`): who was really told, or that
nobody was and how an owner decides.

Targets (the channels of docs/architecture.md §7): a hold routed to a member emails that member;
one posted to a Slack channel goes to that channel; one left to the org's owners emails every
owner. A hold routed to the caller is decided over MCP (`handler_decide`) and notifies nobody.
Every hold is also on the dashboard, which needs no notice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from reconciler.config.models import OrgFile
from reconciler.governance.store import Store, Transaction, now
from reconciler.governance.store import notices as rows

__all__ = [
    "MAX_ATTEMPTS",
    "STALE_SECONDS",
    "Notice",
    "Reach",
    "Target",
    "add_notices",
    "claim_decided",
    "claim_due",
    "list_notices",
    "mark_failed",
    "mark_sent",
    "mark_skipped",
    "mark_unsendable",
    "pending_news",
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
class Reach:
    """Which channels the service storing a hold can send on, and where owners decide without one.

    `missing` maps a channel (email, slack) to why this service sends nothing on it
    ("HANDLER_SLACK_TOKEN is not set"); `dashboard` is the dashboard's address as approvers reach it,
    None when this service has none.
    """

    missing: Mapping[str, str] = field(default_factory=dict)
    dashboard: str | None = None


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


def add_notices(tx: Transaction, hold_id: str, targets: Sequence[Target], reach: Reach | None = None) -> None:
    """Queue the hold's notices inside the caller's transaction (the one that inserts the hold).

    With a `reach`, a notice on a channel it is missing is stored `unsent`, with the reason.
    """
    missing = reach.missing if reach is not None else {}
    if targets:
        rows.insert_notices(tx, [{"hold_id": hold_id, "channel": t.channel, "target": t.target, "member": t.member,
                                  **({"state": "unsent", "error": missing[t.channel]} if t.channel in missing else {})}
                                 for t in targets])


def pending_news(hold_id: str, approver: Mapping[str, Any] | None, notices: Sequence[Notice | Target],
                 reach: Reach | None) -> str:
    """What the agent is told of who hears of its pending hold: who was (or is being) told, or that nobody
    was, why, and how an owner decides. `notices` are the hold's notices, or its targets as it is stored."""
    if (approver or {}).get("to") == "caller":
        return "The instance that started this agent decides it (handler_decide)."
    told, untold, reasons = [], [], []
    for notice in notices:
        state, error = _state_of(notice, reach)
        if state == "skipped":
            continue
        news = _news(notice, state, error)
        if state not in ("unsent", "failed"):
            told.append(news)
            continue
        untold.append(news)
        reason = error if state == "unsent" else news
        if reason and reason not in reasons:
            reasons.append(reason)
    if told:
        return f"Waiting for approval; {'; '.join(told + untold)}."
    reasons = reasons or [_no_target_reason(approver)]
    unconfigured = all(_state_of(n, reach)[0] in ("unsent", "skipped") for n in notices)
    lead = "No channel is configured to tell anyone" if unconfigured else "Nobody could be told"
    where = (f"on the dashboard at {reach.dashboard.rstrip('/')}/approvals/{hold_id} or "
             if reach is not None and reach.dashboard else "")
    return (f"{lead} ({'; '.join(reasons)}): an owner decides {where}with "
            f"`handler approvals approve {hold_id} --as MEMBER` (or reject).")


def _state_of(notice: Notice | Target, reach: Reach | None) -> tuple[str, str | None]:
    """A notice's state and error; a target about to be stored is pending, or unsent on a missing channel."""
    if isinstance(notice, Notice):
        return notice.state, notice.error
    missing = reach.missing if reach is not None else {}
    return ("unsent", missing[notice.channel]) if notice.channel in missing else ("pending", None)


def _news(notice: Notice | Target, state: str, error: str | None) -> str:
    """One notice as the agent reads it: "bob was emailed", "posting to Slack #approvals failed (...)"."""
    email = notice.channel == "email"
    whom = notice.member or notice.target
    if state in ("sent", "closed"):
        return f"{whom} was emailed" if email else f"it was posted to Slack {notice.target}"
    if state == "unsent":
        return f"{whom} was not emailed ({error})" if email else f"it was not posted to Slack {notice.target} ({error})"
    doing = f"emailing {whom}" if email else f"posting to Slack {notice.target}"
    if state == "failed":
        return f"{doing} failed: {error}"
    if error:  # pending again after a failed attempt
        return f"{doing} failed so far and is tried again: {error}"
    return f"{whom} is being emailed" if email else f"it is being posted to Slack {notice.target}"


def _no_target_reason(approver: Mapping[str, Any] | None) -> str:
    """Why a hold has no notice at all."""
    approver = approver or {}
    to = approver.get("to")
    if to == "slack":
        return f"Slack {approver.get('channel')} is not among the org's [slack] channels"
    if to == "member":
        return f"member {approver.get('member')} has no email address in config/org.toml"
    if to == "owners" and approver.get("members"):
        return "none of the org's owners has an email address in config/org.toml"
    return "the org names no owner to tell"


def claim_due(store: Store, channels: Sequence[str], *, limit: int = 20) -> list[Notice]:
    """Take up to `limit` notices due now on these channels; each is claimed by exactly one caller."""
    if not channels:
        return []
    return [Notice.from_row(r) for r in rows.claim_due(store, channels, STALE_SECONDS, limit)]


def mark_sent(store: Store, notice: Notice, ref: str | None = None) -> None:
    rows.update_notice(store, notice.id, state="sent", sent_at=now(), attempts=notice.attempts + 1, ref=ref,
                       error=None)


def mark_unsendable(store: Store, missing: Mapping[str, str]) -> int:
    """Notices queued (never tried) on the channels this service is missing: `unsent`, with the reason, rather
    than waiting at 0 attempts (stored before their router knew better). Returns how many."""
    return sum(rows.mark_unsent(store, channel, why) for channel, why in sorted(missing.items()))


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
    """Notices not sent (their channel is not configured), failed for good, or whose last attempt failed:
    what an operator should look at."""
    return [Notice.from_row(r) for r in rows.fetch_troubled(store, limit)]


def list_notices(store: Store, hold_id: str | None = None, *, states: Sequence[str] = ()) -> list[Notice]:
    return [Notice.from_row(r) for r in rows.fetch_notices(store, hold_id, states)]
