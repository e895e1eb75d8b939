"""Owners told, once per cause, of a binding that cannot start until a person sets it up (docs/router.md "Retrying").

A call whose binding cannot start (a secret its reference does not find, a program that is not installed) is
`unavailable` with `handler/retry = never`, and the router reports it here (`GovernedGate.report_unready`).
`record_alert` keeps one row per binding and cause, and only the transaction that adds it queues the notices to
the org's owners (an email to each, and the Slack channel of the org's owners' routing when there is one), so
however many calls fail, on however many routers, they are told once. The dashboard and `handler status` list
the alerts (`list_alerts`). What the owners read names the binding and what is missing, never a secret's value;
what the agent reads names neither.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.config.models import OrgFile
from reconciler.governance.notices import Reach, add_notices, targets_for
from reconciler.governance.store import Store, now
from reconciler.governance.store import alerts as rows

__all__ = ["ALERT_PREFIX", "Alert", "alert_id", "get_alert", "list_alerts", "record_alert"]

ALERT_PREFIX = "alert_"  # the id of an alert, which its notices carry where a hold's carry the hold's


@dataclass(frozen=True, slots=True)
class Alert:
    id: str
    binding: str
    cause: str
    message: str
    first_at: float
    last_at: float
    calls: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Alert:
        return cls(row["id"], row["binding"], row["cause"], row["message"], row["first_at"], row["last_at"],
                   row["calls"])


def alert_id(binding: str, cause: str, message: str) -> str:
    """One id per binding and cause: the same failure reported by any router, at any call, is one alert."""
    digest = hashlib.sha256(f"{binding}\0{cause}\0{message}".encode()).hexdigest()[:32]
    return ALERT_PREFIX + digest


def record_alert(store: Store, org: OrgFile | None, reach: Reach | None, binding: str, cause: str, message: str,
                 calls: int = 1) -> bool:
    """Record `calls` failed calls of `binding` for `cause`; True when this is the first report of it, whose
    transaction queued the owners' notices."""
    at = now()
    ident = alert_id(binding, cause, message)
    with store.begin() as tx:
        added = rows.insert_alert(tx, {"id": ident, "binding": binding, "cause": cause, "message": message[:4000],
                                       "first_at": at, "last_at": at, "calls": calls})
        if added:
            add_notices(tx, ident, targets_for({"to": "owners"}, org), reach)
        else:
            rows.count_calls(tx, ident, calls, at)
    return added


def get_alert(store: Store, ident: str) -> Alert | None:
    row = rows.fetch_alert(store, ident)
    return Alert.from_row(row) if row is not None else None


def list_alerts(store: Store, limit: int = 20) -> list[Alert]:
    """The alerts seen most recently first (the dashboard, `handler status`)."""
    return [Alert.from_row(r) for r in rows.fetch_alerts(store, limit)]
