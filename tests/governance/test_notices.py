"""The notices outbox: whom a hold notifies, written with the hold, claimed once, retried, given up."""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa

from reconciler.governance.governed import GovernedGate
from reconciler.governance.notices import (
    MAX_ATTEMPTS,
    Reach,
    Target,
    claim_due,
    list_notices,
    mark_failed,
    mark_sent,
    mark_unsendable,
    pending_news,
    targets_for,
    troubled_notices,
)
from reconciler.governance.store import Store
from reconciler.governance.store.tables import notices
from tests.governance.builders import make_snapshot, priced_call

ORG = {
    "members": {"alice": {"owner": True, "email": "alice@example.org"}, "bob": {"email": "bob@example.org"},
                "carol": {}, "dan": {"owner": True, "email": "dan@example.org"}},
    "slack": {"channels": ["#approvals"]},
}


def hold_for(store: Store, routing: dict[str, str] | None) -> str:
    """Hold one `mail_send` of a balanced profile routed as given; returns its request id."""
    fields = {"template": "balanced", **({"routing": routing} if routing else {})}
    snapshot = make_snapshot({"p": fields}, org=ORG)

    async def admit() -> str:
        governor = GovernedGate(store, owns_store=False)
        try:
            admission = await governor.admit(snapshot, priced_call(profile="p", tool="mail_send", to="x@example.org"))
        finally:
            await governor.aclose()
        assert admission.status == "pending"
        assert admission.request_id is not None
        return admission.request_id

    return asyncio.run(admit())


def test_each_routing_notifies_its_approver(store: Store) -> None:
    cases = [
        ({"to": "member", "member": "bob"}, [("email", "bob@example.org", "bob")]),
        ({"to": "slack", "channel": "#approvals"}, [("slack", "#approvals", None)]),
        (None, [("email", "alice@example.org", "alice"), ("email", "dan@example.org", "dan")]),  # the owners
        ({"to": "caller"}, []),  # decided over MCP by the parent instance
        ({"to": "member", "member": "carol"}, []),  # no address: the dashboard is the only way
        ({"to": "slack", "channel": "#random"}, []),  # not on the org's allow-list: never posted to
    ]
    for routing, expected in cases:
        rid = hold_for(store, routing)
        got = [(n.channel, n.target, n.member) for n in list_notices(store, rid)]
        assert got == expected, routing
        assert all(n.state == "pending" and n.attempts == 0 for n in list_notices(store, rid))


def test_no_org_no_targets() -> None:
    assert targets_for({"to": "owners", "members": []}, None) == []
    assert targets_for({"to": "slack", "channel": "#x"}, None) == [Target("slack", "#x")]


def test_a_notice_is_claimed_by_exactly_one_of_many_notifiers(store: Store) -> None:
    rid = hold_for(store, {"to": "member", "member": "bob"})
    claims: list[int] = []
    start = threading.Barrier(6)

    def claim() -> None:
        start.wait()
        claims.extend(n.id for n in claim_due(store, ["email"]))

    threads = [threading.Thread(target=claim) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claims) == 1
    (notice,) = list_notices(store, rid)
    assert notice.state == "sending"
    assert claim_due(store, ["email"]) == []  # claimed: not due for anyone else
    assert claim_due(store, ["slack"]) == []  # and a notifier only takes its own channels
    mark_sent(store, notice, ref="msg-1")
    (sent,) = list_notices(store, rid)
    assert (sent.state, sent.attempts, sent.ref) == ("sent", 1, "msg-1")
    assert sent.sent_at is not None


def test_a_failed_send_is_retried_later_then_given_up(store: Store) -> None:
    rid = hold_for(store, {"to": "member", "member": "bob"})
    (notice,) = claim_due(store, ["email"])
    assert mark_failed(store, notice, "connection refused") == "pending"
    (again,) = list_notices(store, rid)
    assert again.error == "connection refused"
    assert again.next_at > notice.next_at  # not due at once: it waits its backoff
    assert claim_due(store, ["email"]) == []
    for attempt in range(2, MAX_ATTEMPTS + 1):
        with store.begin() as conn:  # let the backoff pass
            conn.execute(sa.update(notices).where(notices.c.hold_id == rid).values(next_at=0))
        (notice,) = claim_due(store, ["email"])
        state = mark_failed(store, notice, f"attempt {attempt}")
    assert state == "failed"
    assert list_notices(store, rid)[0].attempts == MAX_ATTEMPTS
    with store.begin() as conn:
        conn.execute(sa.update(notices).where(notices.c.hold_id == rid).values(next_at=0))
    assert claim_due(store, ["email"]) == []  # failed for good: never sent again


def test_a_notice_whose_notifier_died_is_claimed_again(store: Store) -> None:
    rid = hold_for(store, {"to": "slack", "channel": "#approvals"})
    (first,) = claim_due(store, ["slack"])
    assert claim_due(store, ["slack"]) == []
    with store.begin() as conn:  # the notifier that claimed it died long ago
        conn.execute(sa.update(notices).where(notices.c.id == first.id).values(claimed_at=1.0))
    (again,) = claim_due(store, ["slack"])
    assert (again.id, again.hold_id) == (first.id, rid)


def test_a_channels_retry_after_is_honoured(store: Store) -> None:
    rid = hold_for(store, {"to": "slack", "channel": "#approvals"})
    (notice,) = claim_due(store, ["slack"])
    mark_failed(store, notice, "Slack is rate limiting this app", not_before=120.0)
    (waiting,) = list_notices(store, rid)
    assert waiting.state == "pending"
    assert waiting.next_at - notice.next_at >= 120.0  # not the first backoff's 5 s


def test_what_the_agent_is_told_follows_the_notices(store: Store) -> None:
    """Who was really told of a pending hold, or that nobody was, why, and how an owner decides."""
    nowhere = Reach({"email": "HANDLER_SMTP_URL is not set", "slack": "HANDLER_SLACK_TOKEN is not set"},
                    "http://dash:8765/")
    email_only = Reach({"slack": "HANDLER_SLACK_TOKEN is not set"}, None)
    bob = Target("email", "bob@example.org", "bob")
    slack = Target("slack", "#approvals")
    member_bob = {"to": "member", "member": "bob"}
    assert pending_news("req_1", member_bob, [bob], email_only) == "Waiting for approval; bob is being emailed."
    assert pending_news("req_1", member_bob, [bob], None) == "Waiting for approval; bob is being emailed."
    told = pending_news("req_1", {"to": "slack", "channel": "#approvals"}, [slack], nowhere)
    assert told == ("No channel is configured to tell anyone (HANDLER_SLACK_TOKEN is not set): an owner decides "
                    "on the dashboard at http://dash:8765/approvals/req_1 or with "
                    "`handler approvals approve req_1 --as MEMBER` (or reject).")
    assert "dashboard" not in pending_news("req_1", {"to": "slack", "channel": "#approvals"}, [slack], email_only)
    assert "(member carol has no email address in config/org.toml)" in pending_news(
        "req_1", {"to": "member", "member": "carol"}, [], email_only)
    assert "(Slack #random is not among the org's [slack] channels)" in pending_news(
        "req_1", {"to": "slack", "channel": "#random"}, [], email_only)
    assert pending_news("req_1", {"to": "caller"}, [], nowhere).startswith("The instance that started this agent")

    rid = hold_for(store, member_bob)
    (notice,) = claim_due(store, ["email"])
    mark_failed(store, notice, "connection refused")
    (notice,) = list_notices(store, rid)
    assert pending_news(rid, member_bob, [notice], email_only) == (
        "Waiting for approval; emailing bob failed so far and is tried again: connection refused.")
    mark_sent(store, notice)
    sent = list_notices(store, rid)
    assert pending_news(rid, member_bob, sent, email_only) == "Waiting for approval; bob was emailed."
    mark_failed(store, notice, "550 no such user", final=True)
    assert pending_news(rid, member_bob, list_notices(store, rid), email_only).startswith(
        "Nobody could be told (emailing bob failed: 550 no such user): an owner decides with")


def test_a_notice_on_a_channel_not_configured_is_stored_unsent_and_sent_by_a_service_that_has_it(
        store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "balanced", "routing": {"to": "slack", "channel": "#approvals"}}},
                             org=ORG)

    async def admit() -> tuple[str, str]:
        governor = GovernedGate(store, owns_store=False)
        governor.reach = Reach({"slack": "HANDLER_SLACK_TOKEN is not set"}, "http://dash:8765")
        try:
            admission = await governor.admit(snapshot, priced_call(profile="p", tool="mail_send", to="x@example.org"))
            assert admission.request_id is not None
            status = await governor.status(admission.request_id, priced_call(profile="p"))
        finally:
            await governor.aclose()
        assert "(HANDLER_SLACK_TOKEN is not set)" in admission.message
        assert status.message == admission.message  # handler_status says the same, from the notices
        return admission.request_id, status.message

    rid, _ = asyncio.run(admit())
    (notice,) = list_notices(store, rid)
    assert (notice.state, notice.error, notice.attempts) == ("unsent", "HANDLER_SLACK_TOKEN is not set", 0)
    assert [n.id for n in troubled_notices(store)] == [notice.id]  # on the overview: did not go out
    assert claim_due(store, ["email"]) == []
    (claimed,) = claim_due(store, ["slack"])  # a notifier with a Slack token sends it while the hold waits
    assert claimed.id == notice.id
    old = hold_for(store, {"to": "slack", "channel": "#approvals"})  # stored without a reach: queued as pending
    assert mark_unsendable(store, {"slack": "HANDLER_SLACK_TOKEN is not set"}) == 1
    (swept,) = list_notices(store, old)
    assert (swept.state, swept.error) == ("unsent", "HANDLER_SLACK_TOKEN is not set")
