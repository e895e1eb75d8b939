"""Health where an operator acts: what the running service's preflight and its connectors say of a binding and a
profile, read by the dashboard's binding, profile, hold and overview pages (docs/governance.md, "Health on the
dashboard").

The findings come from the service's status (`Status.binding_checks`, `preflight`, `connectors`): judged in the
service's own environment and sandbox, on the revision it serves, again at each applied revision. Nothing here
resolves a secret or starts a program; a page reads what was judged last, with when (`Status.checked`).

A profile's badge:
- `blocked`: no call of it can run: the org is suspended, or every binding it uses cannot start;
- `degraded`: some of its calls fail: a binding it uses cannot start (a secret that does not resolve, a
  missing program) or its connector has failed, or the profile itself has an error (its work folder is
  missing, its socket does not fit the run folder);
- `serving`: neither; warnings (nobody told of a hold) leave a profile serving and are listed on the overview.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from reconciler.config.snapshot import Snapshot

__all__ = ["binding_health", "cannot_start", "profile_badges"]


def binding_health(status: Mapping[str, Any], name: str) -> dict[str, Any]:
    """What the service says of binding `name`: its preflight's errors and warnings, its connector's state, and
    `ok` (nothing keeps it from starting, and its connector has not failed)."""
    found = (status.get("bindingChecks") or {}).get(name) or []
    connector = (status.get("connectors") or {}).get(name)
    errors = [p for p in found if p.get("level") == "error"]
    failed = connector is not None and connector.get("state") == "failed"
    return {"errors": errors, "warnings": [p for p in found if p.get("level") != "error"], "connector": connector,
            "ok": not errors and not failed, "checked": status.get("checked")}


def cannot_start(status: Mapping[str, Any], name: str) -> str | None:
    """Why binding `name` cannot start now (its preflight's errors, or its connector's failure), or None."""
    health = binding_health(status, name)
    if health["errors"]:
        return "; ".join(p["message"] for p in health["errors"])
    connector = health["connector"]
    if connector is not None and connector.get("state") == "failed":
        return str(connector.get("message") or "its connector failed")
    return None


def profile_badges(snapshot: Snapshot | None, status: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per profile of the served revision: {"badge": serving|degraded|blocked, "why": a sentence}."""
    if snapshot is None:
        return {}
    if snapshot.org is not None and snapshot.org.suspended:
        why = "the org is suspended (suspended = true in config/org.toml): no call runs"
        return {name: {"badge": "blocked", "why": why} for name in snapshot.profiles}
    own: dict[str, str] = {}
    for p in status.get("preflight") or []:
        if p.get("level") == "error" and str(p.get("subject", "")).startswith("profile "):
            own.setdefault(str(p["subject"]).removeprefix("profile "), p["message"])
    badges = {}
    for name, profile in sorted(snapshot.profiles.items()):
        used = sorted({s.binding for s in profile.selections.values() if s.binding})
        down = {b: reason for b in used if (reason := cannot_start(status, b)) is not None}
        if used and len(down) == len(used):
            badges[name] = {"badge": "blocked", "why": "no binding it uses can start: " + _named(down)}
        elif down:
            badges[name] = {"badge": "degraded", "why": "cannot start: " + _named(down)}
        elif name in own:
            badges[name] = {"badge": "degraded", "why": own[name]}
        else:
            badges[name] = {"badge": "serving", "why": "every binding it uses can start"}
    return badges


def _named(down: Mapping[str, str]) -> str:
    return "; ".join(f"{binding} ({why})" for binding, why in down.items())
