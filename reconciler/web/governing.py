"""The profile page's governance forms (docs/governance.md, "Changing governance from the dashboard").

`POST /profiles` makes a profile from a template (optionally copying the page's profile), and
`POST /profiles/<name>/rules|pins|routing|caps` sets or unsets a per-action rule, pins or unpins an interface,
routes the profile's holds, or caps the profile, each of its runs or the org. Each is the edit of the CLI's
command (`config.governing`), checked and planned by the config pages' `propose` (work tree: written; git: a new
branch pushed), signed in as an owner with the session's `csrf` token, like the binding forms. The forms on the
page ask for the plan first: the page that answers shows it, with the decisions the change moves in the words of
`handler explain`, and a button that confirms the same fields.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.config.editing import Edit, EditError
from reconciler.config.governing import (
    OUTCOMES,
    create_profile,
    parse_routing,
    set_cap,
    set_pin,
    set_routing,
    set_rule,
    unset_pin,
    unset_rule,
)
from reconciler.web.editing import ConfigPages, resent

__all__ = ["GovernanceForms"]

# What a form asks: the edit, the topic of its branch in git mode, and the profile whose decisions to explain.
Asked = tuple[Edit, str, str | None]
Reader = Callable[[str, Mapping[str, Any]], Asked]


class GovernanceForms:
    """The governance forms of `config`'s profile pages, through its sign-in, checks and delivery."""

    def __init__(self, config: ConfigPages) -> None:
        self.config = config

    def routes(self) -> list[Route]:
        return [
            Route("/profiles", self.create, methods=["POST"]),
            Route("/profiles/{name}/rules", self.rule, methods=["POST"]),
            Route("/profiles/{name}/pins", self.pin, methods=["POST"]),
            Route("/profiles/{name}/routing", self.routing, methods=["POST"]),
            Route("/profiles/{name}/caps", self.cap, methods=["POST"]),
        ]

    async def create(self, request: Request) -> Response:
        return await self.submit(request, "", _create)

    async def rule(self, request: Request) -> Response:
        return await self.submit(request, request.path_params["name"], _rule)

    async def pin(self, request: Request) -> Response:
        return await self.submit(request, request.path_params["name"], _pin)

    async def routing(self, request: Request) -> Response:
        return await self.submit(request, request.path_params["name"], _routing)

    async def cap(self, request: Request) -> Response:
        return await self.submit(request, request.path_params["name"], _cap)

    async def submit(self, request: Request, profile: str, read: Reader) -> Response:
        """An owner's form: read into an edit, checked, and written or committed when its `action` is apply."""
        signed = await self.config.signed_form(request, "/catalog")
        if isinstance(signed, Response):
            return signed
        form, owner = signed
        source = profile or _field(form, "from")
        back = f"/profiles/{source}#governance" if source else "/catalog"
        try:
            edit, topic, explained = read(profile, form)
        except EditError as exc:
            return self.config.unusable(request, str(exc), back)
        return await self.config.propose(request, owner, edit, topic=topic, back=back,
                                         check_only=form.get("action") != "apply", explained=explained,
                                         confirm=resent(form))


def _field(form: Mapping[str, Any], name: str) -> str:
    return str(form.get(name, "")).strip()


def _create(_: str, form: Mapping[str, Any]) -> Asked:
    """A new profile NAME on a template; `from` (when the box is ticked) copies that profile's governance."""
    name, template = _field(form, "name"), _field(form, "template")
    source = _field(form, "from") if form.get("copy") else ""
    if not template:
        raise EditError("choose the template the profile starts from: permissive, balanced or restrictive")
    return (lambda files: create_profile(files, name, template, source=source or None),
            f"profile-{name}", name or None)


def _rule(profile: str, form: Mapping[str, Any]) -> Asked:
    """`target` is `action:TOOL` or `service:INTERFACE`; `outcome` is allow, approve, block, or unset (no rule)."""
    kind, _, target = _field(form, "target").partition(":")
    outcome = _field(form, "outcome")
    if kind not in ("action", "service") or not target:
        raise EditError("choose the tool (or the whole interface) the rule is for")
    service = kind == "service"
    if outcome == "unset":
        return (lambda files: unset_rule(files, profile, target, service=service), f"profile-{profile}-rule",
                profile)
    if outcome not in OUTCOMES:
        raise EditError(f"a rule's outcome is one of {', '.join(OUTCOMES)}, or unset; not {outcome!r}")
    return (lambda files: set_rule(files, profile, target, outcome, service=service), f"profile-{profile}-rule",
            profile)


def _pin(profile: str, form: Mapping[str, Any]) -> Asked:
    interface, verb = _field(form, "interface"), _field(form, "pin")
    if not interface:
        raise EditError("choose the interface to pin or unpin")
    if verb not in ("set", "unset"):
        raise EditError(f"pin is set or unset, not {verb!r}")
    edit = set_pin if verb == "set" else unset_pin
    return (lambda files: edit(files, profile, interface), f"profile-{profile}-pin", profile)


def _routing(profile: str, form: Mapping[str, Any]) -> Asked:
    routing = parse_routing(_field(form, "to"))
    return (lambda files: set_routing(files, profile, routing), f"profile-{profile}-routing", profile)


def _cap(profile: str, form: Mapping[str, Any]) -> Asked:
    """`scope` is profile (its month), instance (each of its runs' month) or org; `amount` is USD."""
    scope, text = _field(form, "scope"), _field(form, "amount")
    try:
        amount = float(text)
    except ValueError:
        raise EditError(f"a cap is an amount in USD, e.g. 25 or 12.50, not {text!r}") from None
    if not math.isfinite(amount):
        raise EditError(f"a cap is an amount in USD, e.g. 25 or 12.50, not {text!r}")
    if scope not in ("profile", "instance", "org"):
        raise EditError(f"a cap is on the profile, each of its runs, or the org; not {scope!r}")
    target = "org" if scope == "org" else profile
    return (lambda files: set_cap(files, target, amount, per_instance=scope == "instance"), f"cap-{target}",
            None if scope == "org" else profile)
