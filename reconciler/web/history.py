"""The dashboard's pages of what happened: `/audit` (the trail, filtered), `/spend` (this month against every cap,
as a chart drawn on the server), `/calls` (the call log: each call's outcome, cause, duration and cost, and
latency percentiles per binding) and, in git mode, `/changes` (the proposals pushed from the dashboard and not
merged yet, with their diff and plan, and the followed branch's history: who changed what, when it was applied
and what it changed for the agents).

Each needs a member signed in, as every page does (`Pages.locked`). The trail and spend come from the store
(`governance.auditing`, `governance.ledger`); the call log from the service's `calls.jsonl`, of which only the
end is read (`TAIL_BYTES`), since it grows for ever. Names, not ids: a spend row of an instance shows its profile
and run apart, and every row of the trail or the log links to its hold (`/approvals/<id>`) when it has one.
Called by `dashboard`, which adds these routes to its own.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.config.snapshot import Snapshot
from reconciler.gitops.history import followed_history, open_proposals
from reconciler.gitops.proposals import MirrorProposer
from reconciler.governance.auditing import AuditFilter, search_audit
from reconciler.governance.decide import usd
from reconciler.governance.ledger import current_month, leased_balance, read_balance, spend_report
from reconciler.web.owners import Pages

__all__ = ["TAIL_BYTES", "HistoryPages", "percentile"]

TAIL_BYTES = 4 * 1024 * 1024  # of calls.jsonl: the last few thousand calls
_LISTED = 200  # rows of the trail or the log a page shows
_FILTERS = ("profile", "tool", "event", "actor", "since", "until")
_CHART_WIDTH = 320  # px of the widest bar


class HistoryPages:
    """The routes of the three pages, reading through the dashboard's desk; `calls` is the call log's path."""

    def __init__(self, pages: Pages, calls: Path | None, status: Callable[[], Mapping[str, Any]]) -> None:
        self.pages = pages
        self.desk = pages.desk
        self.calls = calls
        self.status = status  # the reconciler's: which revisions were applied, when

    def routes(self) -> list[Route]:
        return [Route("/audit", self.audit_page), Route("/spend", self.spend_page), Route("/calls", self.calls_page),
                Route("/changes", self.changes_page)]

    async def audit_page(self, request: Request) -> Response:
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        given = {k: request.query_params.get(k, "").strip() for k in _FILTERS}
        try:
            where = AuditFilter(given["profile"] or None, given["tool"] or None, given["event"] or None,
                                given["actor"] or None, _day(given["since"]), _day(given["until"], end=True))
        except ValueError:
            return self.pages.page("history_audit.html", request, status_code=400, rows=[], given=given,
                                   message="since and until are days, written YYYY-MM-DD")
        rows = await asyncio.to_thread(search_audit, self.desk.store, where, _LISTED)
        return self.pages.page("history_audit.html", request, rows=[_audit_view(r) for r in rows], given=given,
                               listed=_LISTED, message="")

    async def spend_page(self, request: Request) -> Response:
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        snapshot = self.desk.snapshot()
        org = snapshot.org if snapshot is not None else None
        report = await asyncio.to_thread(spend_report, self.desk.store)
        balance = held = None
        if org is not None and org.prepaid:
            balance = await asyncio.to_thread(read_balance, self.desk.store, org.name)
            held = await asyncio.to_thread(leased_balance, self.desk.store, org.name)
        bars = spend_bars(report, snapshot)
        return self.pages.page("history_spend.html", request, month=current_month(), bars=bars, width=_CHART_WIDTH,
                               balance=None if balance is None else usd(balance),
                               leased=usd(held["leased"]) if held and held["leased"] else "",
                               prepaid=bool(org and org.prepaid))

    async def calls_page(self, request: Request) -> Response:
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        calls = await asyncio.to_thread(read_calls, self.calls) if self.calls is not None else []
        failed_only = request.query_params.get("outcome") == "failed"
        shown = [c for c in calls if not failed_only or c.get("outcome") != "executed"][-_LISTED:][::-1]
        return self.pages.page("history_calls.html", request, calls=[_call_view(c) for c in shown],
                               latency=latency_by_binding(calls), read=len(calls), failed_only=failed_only)


    async def changes_page(self, request: Request) -> Response:
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        proposer = self.desk.proposer
        if not isinstance(proposer, MirrorProposer):
            return self.pages.page("history_changes.html", request, git=False, proposals=[], commits=[])
        proposals = await asyncio.to_thread(open_proposals, proposer.mirror)
        commits = await asyncio.to_thread(followed_history, proposer.mirror)
        applied = _applied_by_revision(self.status())
        return self.pages.page("history_changes.html", request, git=True, proposals=proposals,
                               commits=[{"commit": c, "applied": applied.get(c.sha)} for c in commits],
                               ref=proposer.mirror.ref)


def _applied_by_revision(status: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The reconciler's applied attempts by revision: when each was applied and what its plan said."""
    return {str(a["revision"]): a for a in status.get("history") or [] if a.get("result") == "applied"}


def read_calls(path: Path) -> list[dict[str, Any]]:
    """The calls at the end of the call log, oldest first; a line cut by the start of the tail, or not JSON, is
    skipped (the log is written by whole lines, so only the first can be cut)."""
    try:
        with path.open("rb") as log:
            size = os.fstat(log.fileno()).st_size
            log.seek(max(0, size - TAIL_BYTES))
            data = log.read(TAIL_BYTES)
    except FileNotFoundError:
        return []
    calls = []
    for line in data.splitlines()[1 if size > TAIL_BYTES else 0:]:
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(record, dict):
            calls.append(record)
    return calls


def percentile(values: list[float], share: float) -> float:
    """The `share` (0 to 1) percentile of `values` by the nearest rank; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * share // 1))  # the ceiling, at least the first
    return ordered[int(rank) - 1]


def latency_by_binding(calls: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per binding: how many calls, how many did not execute, and the p50, p95 and p99 of their durations."""
    by: dict[str, list[Mapping[str, Any]]] = {}
    for call in calls:
        by.setdefault(str(call.get("binding") or "(none)"), []).append(call)
    out = []
    for binding, made in sorted(by.items()):
        took = [float(c["duration_ms"]) for c in made if isinstance(c.get("duration_ms"), int | float)]
        out.append({"binding": binding, "calls": len(made),
                    "failed": sum(1 for c in made if c.get("outcome") not in ("executed", "pending")),
                    **{f"p{int(q * 100)}": f"{percentile(took, q):,.1f}" for q in (0.5, 0.95, 0.99)}})
    return out


def spend_bars(report: Sequence[Mapping[str, Any]], snapshot: Snapshot | None) -> list[dict[str, Any]]:
    """Each scope's spend this month beside its cap, as bars: the spend's width, the cap's, and their words."""
    named = [_scope_names(str(r["scope"])) for r in report]
    spent = [int(r["micros"]) for r in report]
    caps = [_cap_of(n, snapshot) for n in named]
    capped = [None if cap is None else round(cap * 1_000_000) for cap in caps]
    top = max([1, *spent, *(c or 0 for c in capped)])
    return [{**names, "spent": usd(micros), "cap_usd": "" if cap is None else usd(cap),
             "bar": round(_CHART_WIDTH * micros / top),
             "cap_at": None if cap is None else round(_CHART_WIDTH * cap / top),
             "over": cap is not None and micros >= cap}
            for names, micros, cap in zip(named, spent, capped, strict=True)]


def _scope_names(scope: str) -> dict[str, str]:
    """`instance:researcher/run-7` → kind instance, profile researcher, run run-7: what a person reads."""
    kind, _, rest = scope.partition(":")
    if kind == "instance":
        profile, _, run = rest.partition("/")
        return {"kind": kind, "profile": profile, "run": run, "name": f"{profile} · run {run}"}
    return {"kind": kind, "profile": rest if kind == "profile" else "", "run": "", "name": rest or scope}


def _cap_of(row: Mapping[str, str], snapshot: Snapshot | None) -> float | None:
    if snapshot is None:
        return None
    if row["kind"] == "org":
        return snapshot.org.caps.monthly_usd if snapshot.org is not None else None
    profile = snapshot.profiles.get(row["profile"])
    if profile is None:
        return None
    return profile.spec.caps.monthly_usd if row["kind"] == "profile" else profile.spec.caps.instance_usd


def _audit_view(row: Mapping[str, Any]) -> dict[str, Any]:
    detail = row.get("detail") or {}
    if isinstance(detail, str | bytes):
        detail = orjson.loads(detail)
    return {**row, "reason": str(detail.get("reason") or detail.get("message") or ""),
            "cost": usd(int(detail["cost"])) if isinstance(detail.get("cost"), int) else ""}


def _call_view(call: Mapping[str, Any]) -> dict[str, Any]:
    cost = call.get("cost")
    return {**call, "cost_usd": "" if cost is None else f"${float(cost):.4f}",
            "took": f"{float(call.get('duration_ms') or 0):,.1f}"}


def _day(text: str, *, end: bool = False) -> float | None:
    """A day written YYYY-MM-DD as a Unix time, its start (or, with `end`, its last second); None when empty."""
    if not text:
        return None
    day = dt.datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=dt.UTC)
    return (day + dt.timedelta(days=1, seconds=-1) if end else day).timestamp()

