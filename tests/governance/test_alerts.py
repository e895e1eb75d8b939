"""governance.alerts: a binding that cannot start is one alert per cause, and its owners' notices are queued once,
however many calls and routers report it (docs/router.md "Retrying")."""

from __future__ import annotations

import asyncio
import threading

from reconciler.config.models import OrgFile
from reconciler.governance.alerts import alert_id, list_alerts, record_alert
from reconciler.governance.governed import GovernedGate
from reconciler.governance.notices import Reach, list_notices
from reconciler.governance.store import Store
from tests.governance.builders import make_snapshot

ORG = {"members": {"alice": {"owner": True, "email": "alice@example.org"}, "bob": {"email": "bob@example.org"},
                   "dan": {"owner": True, "email": "dan@example.org"}}}
MISSING = "binding 'mail-b': secret slot 'token': the router's environment has no MAIL_TOKEN"


def org() -> OrgFile:
    return OrgFile.model_validate({"apiVersion": "handler.org/v1", "name": "acme", **ORG})


def test_the_first_report_of_a_cause_queues_one_notice_per_owner_and_later_ones_only_count(store: Store) -> None:
    assert record_alert(store, org(), None, "mail-b", "not_set_up", MISSING) is True
    assert record_alert(store, org(), None, "mail-b", "not_set_up", MISSING, calls=4) is False
    ident = alert_id("mail-b", "not_set_up", MISSING)
    assert [(n.target, n.state) for n in list_notices(store, ident)] == [("alice@example.org", "pending"),
                                                                          ("dan@example.org", "pending")]
    [alert] = list_alerts(store)
    assert (alert.id, alert.binding, alert.message, alert.calls) == (ident, "mail-b", MISSING, 5)
    assert record_alert(store, org(), None, "mail-b", "not_set_up", "another cause") is True  # its own alert
    assert len(list_alerts(store)) == 2


def test_without_a_mail_server_the_notice_is_stored_unsent_saying_why(store: Store) -> None:
    reach = Reach({"email": "HANDLER_SMTP_URL is not set"})
    record_alert(store, org(), reach, "mail-b", "not_set_up", MISSING)
    notices = list_notices(store, alert_id("mail-b", "not_set_up", MISSING))
    assert {(n.state, n.error) for n in notices} == {("unsent", "HANDLER_SMTP_URL is not set")}


def test_routers_reporting_at_once_record_one_alert(store: Store) -> None:
    start = threading.Barrier(4)
    added: list[bool] = []

    def report() -> None:
        start.wait()
        added.append(record_alert(store, org(), None, "mail-b", "not_set_up", MISSING))

    threads = [threading.Thread(target=report) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(added) == [False, False, False, True]
    assert list_alerts(store)[0].calls == 4
    assert len(list_notices(store, alert_id("mail-b", "not_set_up", MISSING))) == 2


def test_the_governor_records_a_burst_of_failed_calls_on_one_alert_and_wakes_the_notifier(store: Store) -> None:
    snapshot = make_snapshot({"p": {"template": "balanced"}}, org=ORG)
    woken: list[int] = []

    async def burst() -> None:
        governor = GovernedGate(store, owns_store=False)
        governor.on_hold = lambda: woken.append(1)
        try:
            for _ in range(25):
                governor.report_unready(snapshot, "mail-b", "not_set_up", MISSING)
        finally:
            await governor.aclose()  # waits for what it was writing

    asyncio.run(burst())
    [alert] = list_alerts(store)
    assert alert.calls == 25
    assert len(list_notices(store, alert.id)) == 2
    assert woken == [1]  # once: the first report queued the notices
