"""A member's sign-in, which every page that reads held calls, spend or status needs, and an owner's, which every
config edit needs (docs/governance.md, "The dashboard").

The pages show held calls' arguments (recipients, bodies), spend and the service's status, so they need a
signed-in member of the org, on loopback too; editing the config is close to running code (a work tree
applies within a second; a binding chooses what runs with a vendor's key), so the edit forms ask for an
owner (`[members.NAME] owner = true`). A member runs `handler dashboard login --member NAME` on the
service's machine (`handler up` prints one for the first owner); it prints a link
(`links.LinkSigner.sign_in_url`) good for `SIGN_IN_MINUTES` and once. Opening it shows a button; its POST
(`/login`) spends the link and sets the member session (a signed cookie, `OWNER_HOURS` long) and, for an
owner, the owner session. A decision link, which travels by email, signs its member in too, but never as
an owner. Every edit needs the owner session, the member still an owner of the live config, and the form's
`csrf` token bound to the session. `/logout` ends both sessions.

Called by `dashboard`, which adds these routes to its own; `editing` asks `OwnerDoor.check_form`.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from reconciler.web.desk import Desk
from reconciler.web.links import OWNER_HOURS, SIGN_IN_MINUTES

__all__ = ["MEMBER_COOKIE", "OWNER_COOKIE", "OwnerDoor", "Pages"]

log = logging.getLogger("handler.http")
OWNER_COOKIE = "handler_owner"
MEMBER_COOKIE = "handler_member"
_HOW = "run `handler dashboard login --member NAME` on the service's machine and open the link it prints"


class Pages(Protocol):
    """What a room of routes needs of the dashboard: its desk, and a page rendered with its headers."""

    desk: Desk

    def page(self, name: str, request: Request, status_code: int = 200, **context: Any) -> Response: ...

    def locked(self, request: Request) -> Response | None: ...


class OwnerDoor:
    """The sign-in routes, and the check every edit passes."""

    def __init__(self, pages: Pages) -> None:
        self.pages = pages
        self.desk = pages.desk

    def routes(self) -> list[Route]:
        return [Route("/login", self.login_page, methods=["GET"]), Route("/login", self.login, methods=["POST"]),
                Route("/logout", self.logout, methods=["POST"])]

    def owner(self, request: Request) -> tuple[str | None, str]:
        """(the owner this request is signed in as, "") or (None, why not)."""
        member = self.desk.owner_session(request.cookies.get(OWNER_COOKIE, ""))
        if member is None:
            return None, f"editing the config needs an owner's sign-in: {_HOW}"
        return self._still_owner(member)

    def csrf(self, request: Request) -> str:
        """The token an edit form carries, bound to the owner session that shows it."""
        return self.desk.signer.csrf("owner\n" + request.cookies.get(OWNER_COOKIE, ""))

    def check_form(self, request: Request, form: Mapping[str, Any]) -> tuple[str | None, str]:
        """(the owner an edit form was sent by, "") or (None, why it is refused)."""
        member, why = self.owner(request)
        if member is None:
            return None, why
        if not hmac.compare_digest(str(form.get("csrf", "")).encode(), self.csrf(request).encode()):
            return None, "the form does not belong to this session; reload the page and send it again"
        return member, ""

    def _still_member(self, member: str) -> tuple[str | None, str]:
        snapshot = self.desk.snapshot()
        org = snapshot.org if snapshot is not None else None
        if org is not None and member in org.members:
            return member, ""
        return None, f"{member} is not a member of the org (config/org.toml); only a member may sign in"

    def _is_owner(self, member: str) -> bool:
        return self._still_owner(member)[0] is not None

    def _still_owner(self, member: str) -> tuple[str | None, str]:
        snapshot = self.desk.snapshot()
        org = snapshot.org if snapshot is not None else None
        owners = sorted(n for n, m in (org.members.items() if org else ()) if m.owner)
        if member in owners:
            return member, ""
        if not owners:
            return None, ("config/org.toml names no owner, so nobody may edit the config here: add one "
                          "([members.NAME] with owner = true) by a pull request")
        return None, f"{member} is not an owner of the org (owners: {', '.join(owners)}); an owner may edit the config"

    def login_view(self, request: Request, status_code: int, *, member: str | None = None,
                   fields: Mapping[str, str] | None = None, message: str = "") -> Response:
        return self.pages.page("login.html", request, status_code=status_code, member=member, fields=fields or {},
                               message=message, hours=OWNER_HOURS, minutes=SIGN_IN_MINUTES,
                               is_owner=member is not None and self._is_owner(member))

    async def login_page(self, request: Request) -> Response:
        """What a sign-in link opens: who it signs in and a button; only the POST spends it."""
        member, why = self.desk.signer.check_sign_in(request.query_params)
        if member is not None:
            member, why = self._still_member(member)
        if member is not None and self.desk.used_sign_ins.spent(request.query_params["nonce"]):
            member, why = None, f"this sign-in link was used already; {_HOW} again"
        if member is None:
            return self.login_view(request, 403 if "sig" in request.query_params else 401, message=why)
        fields = {k: request.query_params.get(k, "") for k in ("member", "expires", "nonce", "sig")}
        return self.login_view(request, 200, member=member, fields=fields)

    def sign_in_page(self, request: Request) -> Response:
        """What a page that needs a member shows a visitor who is not signed in: how to sign in, and nothing else."""
        return self.login_view(request, 401)

    async def login(self, request: Request) -> Response:
        form = await request.form()
        fields = {k: str(form.get(k, "")) for k in ("member", "expires", "nonce", "sig")}
        member, why = self.desk.signer.check_sign_in(fields)
        if member is not None:
            member, why = self._still_member(member)
        if member is not None and not self.desk.used_sign_ins.use(fields["nonce"], int(fields["expires"])):
            member, why = None, f"this sign-in link was used already; {_HOW} again"
        if member is None:
            return self.login_view(request, 403, message=why)
        owner = self._is_owner(member)
        log.info("%s signed in to the dashboard%s", member, " as an owner" if owner else "")
        response = RedirectResponse("/catalog" if owner else "/", status_code=303)
        seconds = int(OWNER_HOURS * 3600)
        if owner:
            response.set_cookie(OWNER_COOKIE, self.desk.signer.owner_session(member), max_age=seconds, httponly=True,
                                samesite="strict")
        response.set_cookie(MEMBER_COOKIE, self.desk.signer.session(member, days=OWNER_HOURS / 24), max_age=seconds,
                            httponly=True, samesite="strict")
        return response

    def logout_token(self, request: Request) -> str:
        """The token of the sign-out form: the owner session's, else the member session's."""
        if request.cookies.get(OWNER_COOKIE):
            return self.csrf(request)
        return self.desk.signer.csrf(request.cookies.get(MEMBER_COOKIE, ""))

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not hmac.compare_digest(str(form.get("csrf", "")).encode(), self.logout_token(request).encode()):
            return self.login_view(request, 403, message="the form does not belong to this session; reload the page")
        for cookie in (OWNER_COOKIE, MEMBER_COOKIE):  # ended here, so a copy of either opens nothing either
            self.desk.end_session(request.cookies.get(cookie, ""))
        response = RedirectResponse("/", status_code=303)
        response.delete_cookie(OWNER_COOKIE, httponly=True, samesite="strict")
        response.delete_cookie(MEMBER_COOKIE, httponly=True, samesite="strict")
        return response
