"""The dashboard's config pages and their edit forms (docs/governance.md, "Editing from the dashboard").

Pages: `/catalog` (each interface, its connectors, bindings and the profiles each serves), `/profiles/<name>`
(what serves each interface, and a dropdown per interface to pick its binding), `/bindings/<name>`,
`/connectors/<name>` (its secret slots and settings, and a "new binding" form built from them). Links run
profile → binding → connector → interface.

Forms: `POST /profiles/<name>` (`profile use`) and `POST /connectors/<name>/bindings` (`binding create`)
make their change with `config.editing`, the code of the CLI's commands, and hand it to the desk's
`Proposer` (`gitops.proposals`), which checks it where the service reads its tree and, when clean,
writes the files (work tree) or commits a new branch in the mirror and pushes it (git). The page then
shows the findings that keep the change out, each with its `fix:`, or the plan (for a profile, with the
decisions it moves, as `handler explain` gives them) and where it went; after *Check only*, a button that
sends the same fields again to make the change. Each
form needs an owner's sign-in and its session's `csrf` token (`owners.OwnerDoor`); a secret slot takes
an `env` or `file` reference by name alone (`config.editing.FORM_SECRET_KINDS`).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from reconciler.config.editing import (
    FORM_SECRET_KINDS,
    Checked,
    Edit,
    EditError,
    create_binding,
    parse_setting,
    parse_use,
    reference_warnings,
    secret_reference,
    use_bindings,
)
from reconciler.config.errors import HandlerError
from reconciler.config.snapshot import Snapshot
from reconciler.gitops.branches import Identity
from reconciler.governance.explain import moved_decisions
from reconciler.governance.explain import render_text as render_explanation
from reconciler.web.catalog import binding_view, catalog_view, connector_view, profile_view
from reconciler.web.health import binding_health, cannot_start
from reconciler.web.owners import OwnerDoor, Pages

__all__ = ["ConfigPages", "resent"]

log = logging.getLogger("handler.http")


class ConfigPages:
    """The config's pages and forms, on the dashboard's `pages`, signed in through `door`; `status` is the running
    service's (its preflight's findings per binding and its connectors' states: `health`)."""

    def __init__(self, pages: Pages, door: OwnerDoor, status: Callable[[], dict[str, Any]]) -> None:
        self.pages = pages
        self.desk = pages.desk
        self.door = door
        self.status = status

    def routes(self) -> list[Route]:
        return [
            Route("/catalog", self.catalog, methods=["GET"]),
            Route("/profiles/{name}", self.profile_page, methods=["GET"]),
            Route("/profiles/{name}", self.profile_change, methods=["POST"]),
            Route("/bindings/{name}", self.binding_page, methods=["GET"]),
            Route("/connectors/{name}", self.connector_page, methods=["GET"]),
            Route("/connectors/{name}/bindings", self.binding_create, methods=["POST"]),
        ]

    # --- pages ---------------------------------------------------------------------------------------

    async def catalog(self, request: Request) -> Response:
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        listing = await asyncio.to_thread(self.desk.listing)
        return self.pages.page("catalog.html", request, interfaces=catalog_view(self.desk.snapshot(), listing),
                               listed=listing is not None)

    async def profile_page(self, request: Request) -> Response:
        return await self.show(request, "profile.html", profile_view)

    async def binding_page(self, request: Request) -> Response:
        return await self.show(request, "binding.html", binding_view)

    async def connector_page(self, request: Request) -> Response:
        listing = await asyncio.to_thread(self.desk.listing)
        return await self.show(request, "connector.html",
                               lambda snapshot, name: connector_view(snapshot, name, listing))

    async def show(self, request: Request, template: str,
                   view: Callable[[Snapshot, str], dict[str, Any] | None]) -> Response:
        """`template` with the view of the named thing in the live snapshot, and what its forms need."""
        if (refusal := self.pages.locked(request)) is not None:
            return refusal
        name = request.path_params["name"]
        snapshot = self.desk.snapshot()
        found = view(snapshot, name) if snapshot is not None else None
        if found is None:
            what = template.removesuffix(".html")
            message = (f"No {what} {name} in the revision this service serves." if snapshot is not None
                       else "No revision is applied yet.")
            return self.pages.page("change.html", request, status_code=404, outcome="unknown", message=message,
                                   back="/catalog")
        owner, why = self.door.owner(request)
        status = self.status()
        return self.pages.page(template, request, view=found, owner=owner, sign_in=why, csrf=self.door.csrf(request),
                               mode=self.desk.proposer.mode if self.desk.proposer is not None else None,
                               secret_kinds=FORM_SECRET_KINDS, health=binding_health(status, name),
                               down=self.down(snapshot, status))

    def down(self, snapshot: Snapshot | None, status: Mapping[str, Any]) -> dict[str, str]:
        """Per binding of the served revision that cannot start now, why (the service's preflight, its connectors)."""
        names = snapshot.bindings if snapshot is not None else ()
        return {name: why for name in names if (why := cannot_start(status, name)) is not None}

    # --- forms ---------------------------------------------------------------------------------------

    async def profile_change(self, request: Request) -> Response:
        """A profile's dropdowns: each interface whose binding was changed on the page, set as `profile use` sets it."""
        name = request.path_params["name"]
        back = f"/profiles/{name}"
        signed = await self.signed_form(request, back)
        if isinstance(signed, Response):
            return signed
        form, owner = signed
        try:
            uses = [parse_use(f"{key.removeprefix('use.')}={value}") for key, value in _fields(form, "use.")
                    if value and value != form.get(f"was.{key.removeprefix('use.')}", "")]
        except EditError as exc:
            return self.unusable(request, str(exc), back)
        if not uses:
            return self.pages.page("change.html", request, outcome="unchanged", back=back,
                                   message=f"Nothing to change: every interface of {name} keeps its binding.")
        # The running service's preflight: a swap to a binding that cannot start here is said before it is written.
        down = self.down(self.desk.snapshot(), self.status())
        said = [f"{interface} would be served by {binding}, which cannot start on the running service now: "
                f"{down[binding]} (its page, /bindings/{binding}, says how to fix it)"
                for interface, binding in uses if binding in down]
        return await self.propose(request, owner, lambda files: use_bindings(files, name, uses),
                                  topic=f"profile-{name}", back=back, check_only=form.get("action") == "check",
                                  said=said, explained=name, confirm=resent(form))

    async def binding_create(self, request: Request) -> Response:
        """A connector's "new binding" form: `binding create`, with secrets as env or file references only."""
        connector = request.path_params["name"]
        back = f"/connectors/{connector}#new-binding"
        signed = await self.signed_form(request, back)
        if isinstance(signed, Response):
            return signed
        form, owner = signed
        try:
            secrets = _secrets(form)
            settings = dict(parse_setting(f"{k.removeprefix('setting.')}={v.strip()}")
                            for k, v in _fields(form, "setting.") if v.strip())
        except EditError as exc:
            return self.unusable(request, str(exc), back)
        name, description = str(form.get("name", "")).strip(), str(form.get("description", "")).strip()
        # The dashboard runs in the service: its environment is the one an env reference is read from.
        said = [w for slot, ref in secrets.items() for w in reference_warnings(slot, ref, self.tree_root(), os.environ)]
        return await self.propose(
            request, owner,
            lambda files: create_binding(files, name, connector, description=description, secrets=secrets,
                                         settings=settings),
            topic=f"binding-{name}", back=back, check_only=form.get("action") == "check", said=said,
            confirm=resent(form))

    async def signed_form(self, request: Request, back: str) -> tuple[FormData, str] | Response:
        """The posted form and the owner who sent it, or the page refusing it when it is not an owner's."""
        form = await request.form()
        owner, why = self.door.check_form(request, form)
        return (form, owner) if owner is not None else self.refused(request, why, back)

    async def propose(self, request: Request, owner: str, edit: Edit, *, topic: str, back: str,
                      check_only: bool, said: Sequence[str] = (), explained: str | None = None,
                      confirm: Mapping[str, str] | None = None) -> Response:
        """Check the change where the service reads its tree; deliver it when clean and asked to; show what came.
        With `explained`, the decisions of that profile's calls the change moves, as `handler explain` gives them;
        with `confirm`, the fields a checked page's button sends again to make the change."""
        proposer = self.desk.proposer
        if proposer is None:
            return self.unusable(request, "this service does not edit its config (it follows no tree it can write)",
                                 back)
        try:
            checked: Checked = await asyncio.to_thread(proposer.check, edit)
        except EditError as exc:
            return self.unusable(request, str(exc), back)
        page: dict[str, Any] = {
            "checked": checked, "mode": proposer.mode, "back": back, "plan": checked.plan.render_text(),
            "brought": [f.to_dict() for f in checked.brought_errors],
            "standing": [f.to_dict() for f in checked.standing_errors],
            "warnings": [f.to_dict() for f in checked.new_findings if not f.is_error], "said": list(said),
            "decisions": await asyncio.to_thread(_decisions, checked, explained), "explained": explained,
            "confirm": confirm, "csrf": self.door.csrf(request), "target": request.url.path}
        if not checked.ok:
            return self.pages.page("change.html", request, status_code=422, outcome="refused", **page)
        if check_only:
            return self.pages.page("change.html", request, outcome="checked", **page)
        try:
            delivered = await asyncio.to_thread(proposer.deliver, checked, self.identity(owner), topic)
        except HandlerError as exc:
            return self.pages.page("change.html", request, status_code=502, outcome="failed", message=str(exc), **page)
        where = f"branch {delivered.branch} pushed to {delivered.remote}" if delivered.branch else \
            ", ".join(delivered.written)
        log.info("%s: %s (%s)", owner, delivered.summary, where)
        return self.pages.page("change.html", request, outcome="delivered", delivered=delivered, **page)

    def tree_root(self) -> Path:
        """Where relative file references resolve when the service starts a connector: its tree's root."""
        proposer = self.desk.proposer
        return proposer.root if proposer is not None else Path.cwd()

    def identity(self, owner: str) -> Identity:
        """Who a commit made from the dashboard is by: the owner, with the email the org gives them."""
        snapshot = self.desk.snapshot()
        member = snapshot.org.members.get(owner) if snapshot is not None and snapshot.org is not None else None
        return Identity(owner, (member.email if member is not None else None) or "")

    def refused(self, request: Request, why: str, back: str) -> Response:
        return self.pages.page("change.html", request, status_code=403, outcome="forbidden", message=why, back=back)

    def unusable(self, request: Request, why: str, back: str) -> Response:
        return self.pages.page("change.html", request, status_code=400, outcome="unusable", message=why, back=back)


def resent(form: Mapping[str, Any]) -> dict[str, str]:
    """A form's fields, sent again by the button of its checked page that makes the change the plan showed."""
    return {k: v for k, v in form.items() if isinstance(v, str) and k not in ("csrf", "action")}


def _decisions(checked: Checked, profile: str | None) -> list[str] | None:
    """Each call of `profile` whose decision the change moves, in `handler explain`'s words (None: not asked)."""
    if profile is None:
        return None
    return [render_explanation(decision, profile, tool)
            for tool, decision in moved_decisions(checked.before, checked.after, profile)]


def _fields(form: FormData, prefix: str) -> list[tuple[str, str]]:
    """The form's fields whose names start with `prefix`, as strings (a file upload is not one)."""
    return [(k, v) for k, v in form.multi_items() if k.startswith(prefix) and isinstance(v, str)]


def _secrets(form: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """`secret.<slot>.kind` and `secret.<slot>.name` → the slot's reference; a slot left empty is left out."""
    slots = {k.removeprefix("secret.").rpartition(".")[0] for k in form if k.startswith("secret.")}
    out = {}
    for slot in sorted(s for s in slots if s):
        target = str(form.get(f"secret.{slot}.name", "")).strip()
        if target:
            out[slot] = secret_reference(slot, str(form.get(f"secret.{slot}.kind", "")), target, FORM_SECRET_KINDS)
    return out
