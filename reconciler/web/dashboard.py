"""The dashboard and the decision endpoints of the channels (docs/architecture.md §7).

Pages: `/` (status: the applied revision, the last attempt and its findings with their fixes,
this month's spend with what budget leases hold of it, profiles, connectors) and `/approvals`
(holds waiting, decisions made), both reloading themselves every `REFRESH_SECONDS`;
`/approvals/<id>` (one hold in full, its arguments included, and its notices); the config's pages
and edit forms (`editing`: `/catalog`, `/profiles/<name>`, `/bindings/<name>`, `/connectors/<name>`); what
happened (`history`: `/audit`, `/spend`, `/calls`, `/changes`).
Every page needs a member of the org signed in (`owners`: `/login`), on loopback too, since they show
held calls' arguments, spend and status; the edit forms need an owner. A visitor who is not gets the
sign-in page and nothing else. `HANDLER_DASHBOARD_TOKEN` opens no page: it is the bearer token of
`/status` and `/metrics` for machines, and what lets the listener bind beyond loopback.

Decisions: a signed link (`links`) opens `/approvals/<id>` as its member with Approve and Reject
buttons; only the POST decides, and it needs the link's signature, not the token. Opening a valid
link also signs its member in (a signed cookie): they may then browse the dashboard and decide,
from each hold's page, the holds they are entitled to (the form carries a token bound to the
session). Slack posts clicks to `/hooks/slack`; the Slack user is the org member whose `slack` id
it is. Every way, the decision goes through `decide_hold` with `may_decide`, as the CLI's does.
"""

from __future__ import annotations

import asyncio
import datetime
import hmac
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from reconciler.governance.alerts import list_alerts
from reconciler.governance.auditing import pricing_violations_this_month, set_aside_this_month
from reconciler.governance.decide import usd
from reconciler.governance.errors import GovernanceError, HoldNotFoundError, NotAllowedError
from reconciler.governance.holds import (
    Hold,
    count_holds,
    decide_hold,
    get_hold,
    listed_holds,
    may_decide,
    recent_decisions,
)
from reconciler.governance.ledger import spend_report
from reconciler.governance.notices import list_notices, troubled_notices
from reconciler.web.desk import Desk
from reconciler.web.editing import ConfigPages
from reconciler.web.governing import GovernanceForms
from reconciler.web.health import cannot_start, profile_badges
from reconciler.web.history import HistoryPages
from reconciler.web.links import LINK_DAYS
from reconciler.web.notifier import decision_text
from reconciler.web.owners import MEMBER_COOKIE, OwnerDoor
from reconciler.web.slack import SlackAction, parse_interaction, verify_request

__all__ = ["PAGE_HEADERS", "REFRESH_SECONDS", "Dashboard", "Desk"]

log = logging.getLogger("handler.http")
_SESSION = MEMBER_COOKIE
REFRESH_SECONDS = 10  # the overview and the approvals reload themselves (a form page never does)
# Pages carry decision buttons: no framing (clickjacking), no scripts, forms post only here.
PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                "frame-ancestors 'none'", "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                "Cache-Control": "no-store"}


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=select_autoescape(["html"]), auto_reload=False)
    env.filters["utc"] = lambda t: "" if t is None else datetime.datetime.fromtimestamp(
        t, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
    env.filters["pretty"] = lambda v: orjson.dumps(v, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode()
    env.filters["approver"] = _approver_text
    return env


def _approver_text(approver: Mapping[str, Any] | None) -> str:
    if not approver:
        return "any member"
    to = approver.get("to")
    if to == "member":
        return f"member {approver.get('member')}"
    if to == "slack":
        return f"Slack {approver.get('channel')}"
    if to == "owners":
        return "the owners (" + ", ".join(approver.get("members") or []) + ")"
    return "the instance that started the agent" if to == "caller" else str(to)


class Dashboard:
    """The pages and the decision endpoints (`routes`), reading and deciding through `desk`, sharing it, the
    reconciler's `status` and the templates; `signed_in` says which member a request is signed in as."""

    def __init__(self, desk: Desk, status: Callable[[], dict[str, Any]]) -> None:
        self.desk = desk
        self.status = status
        self.env = _templates()
        self.door = OwnerDoor(self)

    def routes(self) -> list[Route]:
        config = ConfigPages(self, self.door, self.status)
        return [
            Route("/", self.overview),
            Route("/approvals", self.approvals),
            Route("/approvals/{hold_id}", self.hold_page, methods=["GET"]),
            Route("/approvals/{hold_id}", self.decide_route, methods=["POST"]),
            Route("/hooks/slack", self.slack_hook, methods=["POST"]),
            *self.door.routes(),
            *config.routes(),
            *GovernanceForms(config).routes(),
            *HistoryPages(self, self.desk.call_log, self.status).routes(),
        ]

    def page(self, name: str, request: Request, status_code: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("who", self.signed_in(request))
        context.setdefault("owner", self.door.owner(request)[0])
        context.setdefault("logout_csrf", self.door.logout_token(request))
        return HTMLResponse(self.env.get_template(name).render(**context), status_code=status_code,
                            headers=PAGE_HEADERS)

    async def not_found(self, request: Request, exc: Exception) -> Response:
        """A path (or a method) nothing serves: the styled page, with the pages' security headers."""
        status = getattr(exc, "status_code", 404)
        return self.page("not_found.html", request, status_code=status, path=request.url.path, method=request.method)

    def signed_in(self, request: Request) -> str | None:
        return self.still_member(self.desk.member_session(request.cookies.get(_SESSION, "")))[0]

    def linked(self, hold_id: str, params: Mapping[str, str]) -> tuple[str | None, str]:
        """(the member a decision link decides as, "") or (None, why it does not)."""
        member, why = self.desk.signer.check(hold_id, params)
        return self.still_member(member) if member is not None else (None, why)

    def still_member(self, member: str | None) -> tuple[str | None, str]:
        """`member` while the live config names them a member of the org, else (None, why): a link and a session are
        signed for days, and must stop opening the dashboard once the member is removed by a pull request."""
        if member is None:
            return None, "sign in first: open a decision link"
        snapshot = self.desk.snapshot()
        if snapshot is not None and snapshot.org is not None and member in snapshot.org.members:
            return member, ""
        return None, (f"{member} is no longer a member of the org (config/org.toml): their links and sessions no "
                      "longer open the dashboard")

    def locked(self, request: Request) -> Response | None:
        """The sign-in page for a visitor who is not a signed-in member of the org, or None to let them in."""
        if self.signed_in(request) is not None:
            return None
        return self.door.sign_in_page(request)

    async def overview(self, request: Request) -> Response:
        if (refusal := self.locked(request)) is not None:
            return refusal
        pending = await asyncio.to_thread(count_holds, self.desk.store)
        troubled = await asyncio.to_thread(troubled_notices, self.desk.store)
        violations = await asyncio.to_thread(pricing_violations_this_month, self.desk.store)
        set_aside = await asyncio.to_thread(set_aside_this_month, self.desk.store)
        alerts = await asyncio.to_thread(list_alerts, self.desk.store)
        spent = [{"scope": r["scope"], "spent": usd(r["micros"]), "leased": usd(r["leased"]) if r["leased"] else "",
                  "stale": usd(r["stale"]) if r["stale"] else ""}
                 for r in await asyncio.to_thread(spend_report, self.desk.store)]
        status = self.status()
        return self.page("overview.html", request, status=status, pending=pending, troubled=troubled,
                         violations=violations, set_aside=set_aside, alerts=alerts, spent=spent,
                         refresh_every=REFRESH_SECONDS, badges=profile_badges(self.desk.snapshot(), status))

    async def approvals(self, request: Request) -> Response:
        if (refusal := self.locked(request)) is not None:
            return refusal
        pending, waiting = await asyncio.to_thread(listed_holds, self.desk.store)
        decided = await asyncio.to_thread(recent_decisions, self.desk.store, 50)
        status = self.status()
        down = {h.binding: why for h in pending if (why := cannot_start(status, h.binding)) is not None}
        return self.page("approvals.html", request, pending=pending, waiting=waiting, decided=decided,
                         refresh_every=REFRESH_SECONDS, down=down)

    async def hold_page(self, request: Request) -> Response:
        hold_id = request.path_params["hold_id"]
        linked, why = self.linked(hold_id, request.query_params)
        if linked is None and (refusal := self.locked(request)) is not None:
            if "sig" in request.query_params:  # a link that does not hold: say why, show nothing
                return self.page("hold_refused.html", request, status_code=403, message=why)
            return refusal
        try:
            hold = await asyncio.to_thread(get_hold, self.desk.store, hold_id)
        except HoldNotFoundError as exc:
            return self.page("hold_refused.html", request, status_code=404, message=str(exc))
        message = why if linked is None and "sig" in request.query_params else ""
        member = linked or self.signed_in(request)
        response = await self.hold_view(request, hold, member, message, failed=bool(message),
                                        link=request.query_params if linked else None)
        if linked is not None:  # the link signs its member in, for the other holds they may decide
            response.set_cookie(_SESSION, self.desk.signer.session(linked), max_age=LINK_DAYS * 86400, httponly=True,
                                samesite="strict")
        return response

    async def hold_view(self, request: Request, hold: Hold, member: str | None, message: str, *,
                        failed: bool = False, status_code: int = 200,
                        link: Mapping[str, str] | None = None) -> HTMLResponse:
        notices = await asyncio.to_thread(list_notices, self.desk.store, hold.id)
        decide_as = member if member is not None and hold.state == "pending" else None
        if decide_as is not None and (refusal := may_decide(hold, self.desk.snapshot(), decide_as)) is not None:
            decide_as, message, failed = None, refusal, True
        session = request.cookies.get(_SESSION, "")
        proof = ({k: link.get(k, "") for k in ("member", "expires", "sig")} if link is not None
                 else {"csrf": self.desk.signer.csrf(session)})
        who = link.get("member") if link is not None else None  # a link signs in with this very response
        # Approving a call its binding cannot run fails it for good: the page says so, and offers the reject.
        down = cannot_start(self.status(), hold.binding) if hold.state == "pending" else None
        return self.page("hold.html", request, status_code=status_code, hold=hold, notices=notices,
                         decide_as=decide_as, proof=proof, message=message, failed=failed, down=down,
                         down_reason=_down_reason(hold, down), refresh=_refresh_url(hold, link),
                         **({"who": who} if who else {}))

    async def decide_route(self, request: Request) -> Response:
        hold_id = request.path_params["hold_id"]
        form = await request.form()
        fields = {k: str(form.get(k, "")) for k in ("member", "expires", "sig", "csrf", "decision", "reason")}
        member, why, how = self.form_member(request, hold_id, fields)
        if member is None:
            return self.page("hold_refused.html", request, status_code=403, message=why)
        if fields["decision"] not in ("approve", "reject"):
            return self.page("hold_refused.html", request, status_code=400, message="the form names no decision")
        link = fields if fields["sig"] else None
        reason = fields["reason"] if fields["decision"] == "reject" else None
        try:
            hold = await asyncio.to_thread(_decide, self.desk, hold_id, fields["decision"], member, reason)
        except HoldNotFoundError as exc:
            return self.page("hold_refused.html", request, status_code=404, message=str(exc))
        except NotAllowedError as exc:
            hold = await asyncio.to_thread(get_hold, self.desk.store, hold_id)
            return await self.hold_view(request, hold, None, str(exc), failed=True, status_code=409, link=link)
        except GovernanceError as exc:  # a reason too long to store: the hold stays pending, the form too
            hold = await asyncio.to_thread(get_hold, self.desk.store, hold_id)
            return await self.hold_view(request, hold, member, str(exc), failed=True, status_code=400, link=link)
        # The decision made, not the state read back: a router woken by it may have claimed or run the hold already.
        decided = "approved" if fields["decision"] == "approve" else "rejected"
        log.info("hold %s %s by %s (%s)", hold_id, decided, member, how)
        if self.desk.on_decision is not None:
            self.desk.on_decision()
        said = f"{decided.capitalize()} by {member}" + (f": {hold.decision_reason}" if hold.decision_reason else "")
        return await self.hold_view(request, hold, None, said if said.endswith((".", "!", "?")) else said + ".",
                                    link=link)

    def form_member(self, request: Request, hold_id: str, fields: Mapping[str, str]) -> tuple[str | None, str, str]:
        """Who a decision form decides as (None: nobody, and why), and how they proved it."""
        if fields["sig"]:  # a signed link's form
            member, why = self.linked(hold_id, fields)
            return member, why, "signed link"
        session = request.cookies.get(_SESSION, "")  # a signed-in member's form
        member, why = self.still_member(self.desk.member_session(session))
        if member is not None and not hmac.compare_digest(fields["csrf"].encode(),
                                                          self.desk.signer.csrf(session).encode()):
            member, why = None, "the form does not belong to this session; reload the page"
        return member, why, "dashboard"

    async def slack_hook(self, request: Request) -> Response:
        body = await request.body()
        desk = self.desk
        if desk.slack.signing_secret is None:
            return JSONResponse({"error": "Slack is off: set HANDLER_SLACK_SIGNING_SECRET"}, status_code=403)
        problem = verify_request(desk.slack.signing_secret, request.headers.get("x-slack-request-timestamp"), body,
                                 request.headers.get("x-slack-signature"))
        if problem is not None:
            log.warning("slack: refused a request from %s: %s", request.client.host if request.client else "?",
                        problem)
            return JSONResponse({"error": problem}, status_code=401)
        try:
            action = parse_interaction(body)
        except ValueError as exc:
            return JSONResponse({"error": str(exc)}, status_code=400)
        text, decided = await asyncio.to_thread(_decide_from_slack, desk, action)
        if decided and desk.on_decision is not None:
            desk.on_decision()
        if desk.slack_client is not None and action.response_url:
            # A decision replaces the message for everyone; only the clicker sees why nothing happened.
            await desk.slack_client.respond(action.response_url, text, replace=decided)
        return Response(status_code=200)


def _down_reason(hold: Hold, down: str | None) -> str:
    """The reason a reject is prefilled with when the hold's binding cannot start (the agent reads it)."""
    if down is None:
        return ""
    return (f"Not run: binding {hold.binding} cannot start on the service now ({down}); ask again once it is "
            "fixed.")[:2000]


def _refresh_url(hold: Hold, link: Mapping[str, str] | None) -> str | None:
    """Where the hold page reloads itself while an approved run is not final (None: it stays).

    A plain GET of the same hold (a link's signature kept, so a member who came by link still sees it):
    it decides nothing, however often it runs.
    """
    if hold.state not in ("approved", "running"):
        return None
    query = urlencode({k: link.get(k, "") for k in ("member", "expires", "sig")}) if link is not None else ""
    return f"/approvals/{quote(hold.id)}" + (f"?{query}" if query else "")


def _decide(desk: Desk, hold_id: str, decision: str, member: str, reason: str | None = None) -> Hold:
    snapshot = desk.snapshot()

    def check(hold: Hold) -> None:
        if (refusal := may_decide(hold, snapshot, member)) is not None:
            raise NotAllowedError(refusal)

    return decide_hold(desk.store, hold_id, "approve" if decision == "approve" else "reject", member, check,
                       reason=reason)


def _decide_from_slack(desk: Desk, action: SlackAction) -> tuple[str, bool]:
    """(what to tell the channel, whether the hold was decided)."""
    snapshot = desk.snapshot()
    org = snapshot.org if snapshot is not None else None
    member = next((name for name, m in (org.members.items() if org else ()) if m.slack == action.user_id), None)
    if member is None:
        return (f"<@{action.user_id}> is not an org member with this Slack id (members.<name>.slack in org.toml), "
                "so the click decided nothing."), False
    try:
        hold = _decide(desk, action.hold_id, action.decision, member)
    except (HoldNotFoundError, NotAllowedError) as exc:
        return f"Nothing decided: {exc}", False
    log.info("hold %s %s by %s (Slack)", hold.id, hold.state, member)
    return f"{decision_text(hold)} (<@{action.user_id}>)", True
