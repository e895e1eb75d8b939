"""Snapshots built in memory for governance tests: fast enough for hypothesis to make hundreds."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from reconciler.config import FolderSource, Loader
from reconciler.config.models import BindingFile, InterfaceFile, OrgFile, ProfileFile, TemplateFile, Tool
from reconciler.config.snapshot import BUILTIN_TEMPLATES, Binding, InterfaceVersion, Profile, Selection, Snapshot
from reconciler.governance.gate import CallRequest
from reconciler.governance.governed import GovernedGate
from reconciler.governance.store import open_store, store_url
from reconciler.governance.store.audit import AUDIT_COLUMNS, AuditRow

__all__ = ["OWNERS_ORG", "PRICES", "TOOLS", "cap_snapshot", "make_snapshot", "priced_call"]

# The interfaces every test snapshot serves: one tool per action class, and a priced search.
TOOLS: Mapping[str, list[tuple[str, str]]] = {
    "mail": [("mail_read", "read"), ("mail_send", "write"), ("mail_delete", "destructive")],
    "search": [("search_query", "read")],
}
PRICES = {"mail": {"mail_send": 0.01}, "search": {"search_query": 0.005}}


def _tool(name: str, cls: str) -> Tool:
    hints = {"read": {"readOnlyHint": True}, "write": {"readOnlyHint": False, "destructiveHint": False},
             "destructive": {"readOnlyHint": False, "destructiveHint": True}}[cls]
    return Tool(name=name, description=name, inputSchema={"type": "object", "additionalProperties": False},
                annotations=hints)


def make_snapshot(
    profiles: Mapping[str, Mapping[str, Any]],
    org: Mapping[str, Any] | None = None,
    templates: Mapping[str, Mapping[str, str]] | None = None,
    revision: str = "r1",
) -> Snapshot:
    """A snapshot of the given profiles (ProfileFile fields) over the `TOOLS` interfaces."""
    interfaces = {}
    bindings = {}
    for name, tools in TOOLS.items():
        spec = InterfaceFile(apiVersion="handler.interface/v1", name=name, version=1, description=name,
                             errors={"unavailable": "down"})
        interfaces[f"{name}/v1"] = InterfaceVersion(f"{name}/v1", spec, tuple(_tool(*t) for t in tools),
                                                    f"catalog/interfaces/{name}/v1")
        bspec = BindingFile(apiVersion="handler.binding/v1", name=f"{name}-b", connector=f"{name}-c",
                            pricing=PRICES[name])
        bindings[f"{name}-b"] = Binding(f"{name}-b", bspec, f"config/bindings/{name}-b.toml")
    built = {}
    for pname, fields in profiles.items():
        spec = ProfileFile.model_validate({"apiVersion": "handler.profile/v1", "name": pname, "scope": "work",
                                           "services": {n: f"{n}-b" for n in TOOLS}, **fields})
        selections = {n: Selection(n, f"{n}/v1", f"{n}-b", False, "profile") for n in TOOLS}
        built[pname] = Profile(pname, spec, f"config/profiles/{pname}.toml", MappingProxyType(selections))
    all_templates = dict(BUILTIN_TEMPLATES)
    for tname, outcomes in (templates or {}).items():
        all_templates[tname] = TemplateFile.model_validate({"apiVersion": "handler.template/v1", "name": tname,
                                                            **outcomes})
    org_file = None
    if org is not None:
        org_file = OrgFile.model_validate({"apiVersion": "handler.org/v1", "name": "acme", **org})
    return Snapshot(revision, MappingProxyType(interfaces), MappingProxyType({}), MappingProxyType(bindings),
                    MappingProxyType(built), MappingProxyType(all_templates), org_file)


OWNERS_ORG: Mapping[str, Any] = {
    "members": {"alice": {"owner": True}, "bob": {}, "carol": {}},
    "slack": {"channels": ["#approvals"]},
}


def cap_snapshot() -> Snapshot:
    """Profile `p` (permissive) under an org cap of $0.25: exactly fifty $0.005 searches fit.

    Profile `h` (balanced, holds routed to the caller) holds every `mail_send`.
    """
    org = {**OWNERS_ORG, "caps": {"monthly_usd": 0.25}}
    return make_snapshot({"p": {"template": "permissive"}, "h": {"template": "balanced", "routing": {"to": "caller"}}},
                         org=org)


def fields(row: AuditRow) -> dict[str, Any]:
    """An audit row as a reader checks it: its fields by the table's column names."""
    return dict(zip(AUDIT_COLUMNS, row, strict=True))


def priced_call(instance: str = "i1", profile: str = "p", tool: str = "search_query", **arguments: Any) -> CallRequest:
    iface = "search" if tool.startswith("search") else "mail"
    return CallRequest(profile, instance, "parent-1", f"{iface}/v1", tool, f"{iface}-b", arguments or {"q": "x"})


def hold_calls(tree: Path, count: int) -> list[str]:
    """`count` held web searches of the auditor (Restrictive: each waits for a person), oldest first."""
    snapshot = Loader().load(FolderSource(tree))
    governor = GovernedGate(open_store(store_url(tree)))
    held = []
    for n in range(count):
        call = priced_call(f"run-{n}", profile="auditor", tool="web_search_query", query=f"q{n}")
        call = type(call)(call.profile, call.instance, None, "web-search/v1", call.tool, "search-brave",
                          call.arguments)
        rid = governor.admit_now(snapshot, call).request_id
        assert rid is not None
        held.append(rid)
    governor.close()
    return held

