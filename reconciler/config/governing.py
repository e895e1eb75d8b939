"""Edits of governance: a profile made from a template, its per-action rules, pins, routing and caps, the org's cap.

`handler profile create`, `handler rule|pin|routing|cap set` and the dashboard's profile page make these changes;
each is a pure function from the tree's files to an `editing.Change` (tomlkit keeps every comment and the order
of keys), checked and planned by `editing.check_change` before anything is written, like a binding's edit
(docs/governance.md, "Changing governance").
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import tomlkit
from tomlkit.items import AoT, Array, Table
from tomlkit.toml_document import TOMLDocument

from reconciler.config.editing import Change, EditError, profile_document, valid_name
from reconciler.config.sources import Blob

__all__ = ["OUTCOMES", "create_profile", "parse_routing", "set_cap", "set_pin", "set_routing", "set_rule",
           "unset_pin", "unset_rule"]

OUTCOMES = ("allow", "approve", "block")  # a rule's words, as config/profiles files write them
_ORG = "config/org.toml"


def create_profile(files: Mapping[str, Blob], name: str, template: str, *, source: str | None = None) -> Change:
    """A new `config/profiles/NAME.toml` on `template`, its own work folder `work/NAME`; with `source`, that
    profile's group, services, pins, routing, rules and caps copied (its description and scope are its own)."""
    valid_name(name, "profile", "config/profiles/NAME.toml")
    path = f"config/profiles/{name}.toml"
    if path in files:
        raise EditError(f"profile {name} exists ({path}); choose another name, or change that file")
    doc = tomlkit.document()
    doc["apiVersion"] = "handler.profile/v1"
    doc["name"] = name
    doc["description"] = f"Made from {source}" if source else f"A new agent on the {template} template"
    copied = profile_document(files, source)[1] if source else None
    if copied is not None and "group" in copied:
        doc["group"] = copied["group"]
    doc["scope"] = f"work/{name}"
    doc["template"] = template
    if copied is not None:
        for key, item in copied.body:
            if key is not None and key.key not in ("apiVersion", "name", "description", "group", "scope", "template"):
                doc.append(key.key, item)
    made = f" from {source}" if source else ""
    # Its work folder comes with it (kept in git by an empty file, as the example's are): a scope that does not
    # exist fails every call with a file.
    return Change({path: _text(doc), f"work/{name}/.gitkeep": ""}, f"Add profile {name} on the {template} "
                  f"template{made}")


def set_rule(files: Mapping[str, Blob], profile: str, target: str, outcome: str, *, service: bool = False) -> Change:
    """The profile's rule for action (a tool) or `service` (an interface) `target` set to `outcome`, in place of
    any rule on the same target; a new `[[rules]]` table otherwise."""
    if outcome not in OUTCOMES:
        raise EditError(f"a rule's outcome is one of {', '.join(OUTCOMES)}, not {outcome!r}")
    path, doc = profile_document(files, profile)
    key = "service" if service else "action"
    rules = _rules(doc, path)
    found = next((r for r in rules if r.get(key) == target), None)
    if found is not None and found.get("outcome") == outcome:
        raise EditError(f"profile {profile} has that rule already ({key} {target}: {outcome}); nothing to change")
    if found is not None:
        found["outcome"] = outcome
    else:
        rule = tomlkit.table()
        rule[key] = target
        rule["outcome"] = outcome
        rules.append(rule)
        if "rules" not in doc:
            doc["rules"] = rules
    return Change({path: _text(doc)}, f"Profile {profile}: {key} {target} → {outcome}")


def unset_rule(files: Mapping[str, Blob], profile: str, target: str, *, service: bool = False) -> Change:
    """The profile without its rule on `target`; EditError when it has none, naming the rules it has."""
    path, doc = profile_document(files, profile)
    key = "service" if service else "action"
    rules = _rules(doc, path)
    kept = [r for r in rules if r.get(key) != target]
    if len(kept) == len(rules):
        has = ", ".join(f"{'service' if 'service' in r else 'action'} {r.get('service') or r.get('action')}"
                        for r in rules) or "none"
        raise EditError(f"profile {profile} has no rule on {key} {target} (its rules: {has})")
    if kept:
        doc["rules"] = _aot(kept)
    else:
        del doc["rules"]
    return Change({path: _text(doc)}, f"Profile {profile}: no rule on {key} {target}")


def set_pin(files: Mapping[str, Blob], profile: str, interface: str) -> Change:
    """The profile with `interface` pinned: its auto calls wait for a person (a pin never unblocks)."""
    path, doc = profile_document(files, profile)
    pins = doc.get("pins")
    if pins is None:
        doc["pins"] = tomlkit.array()
        pins = doc["pins"]
    if not isinstance(pins, Array):
        raise EditError(f"{path}: pins is not a list; `handler validate` shows where")
    if interface in pins:
        raise EditError(f"profile {profile} pins {interface} already")
    pins.append(interface)
    return Change({path: _text(doc)}, f"Profile {profile}: pin {interface}")


def unset_pin(files: Mapping[str, Blob], profile: str, interface: str) -> Change:
    """The profile without its pin on `interface`."""
    path, doc = profile_document(files, profile)
    pins = doc.get("pins")
    if not isinstance(pins, Array) or interface not in pins:
        has = ", ".join(str(p) for p in pins) if isinstance(pins, Array) and pins else "none"
        raise EditError(f"profile {profile} does not pin {interface} (its pins: {has})")
    pins.remove(interface)
    if not pins:
        del doc["pins"]
    return Change({path: _text(doc)}, f"Profile {profile}: unpin {interface}")


def parse_routing(text: str) -> dict[str, str] | None:
    """`member:NAME`, `slack:#CHANNEL`, `caller` or `none` → the routing table; `default` → None (no routing: the
    org's policies, else its owners); EditError for anything else."""
    kind, _, target = text.partition(":")
    if text in ("caller", "none"):
        return {"to": text}
    if text == "default":
        return None
    if kind == "member" and target:
        return {"to": "member", "member": target}
    if kind == "slack" and target:
        return {"to": "slack", "channel": target}
    raise EditError(f"routing {text!r}: give member:NAME, slack:#CHANNEL, caller, none, or default (the org's "
                    "policies decide)")


def set_routing(files: Mapping[str, Blob], profile: str, routing: Mapping[str, str] | None) -> Change:
    """The profile's holds routed as `routing` says (None: no routing key, the default)."""
    path, doc = profile_document(files, profile)
    if routing is None:
        if "routing" in doc:
            del doc["routing"]
        said = "default (the org's policies, else its owners)"
    else:
        table = tomlkit.inline_table()
        table.update(routing)
        doc["routing"] = table
        said = " ".join(routing.values())
    return Change({path: _text(doc)}, f"Profile {profile}: holds go to {said}")


def set_cap(files: Mapping[str, Blob], scope: str, amount: float, *, per_instance: bool = False) -> Change:
    """A monthly cap in USD on the org (`scope` "org") or on profile `scope` (`per_instance`: on each of its runs)."""
    if not math.isfinite(amount) or amount < 0:
        raise EditError(f"a cap is an amount in USD, 0 or more, not {amount}")
    if scope == "org":
        if per_instance:
            raise EditError("--per-instance caps a profile's runs; the org's cap is one monthly_usd")
        path, doc = _org_document(files)
        key = "monthly_usd"
    else:
        path, doc = profile_document(files, scope)
        key = "instance_usd" if per_instance else "monthly_usd"
    caps = doc.get("caps")
    if caps is None:
        doc["caps"] = tomlkit.table()
        caps = doc["caps"]
    if not isinstance(caps, Table | dict):
        raise EditError(f"{path}: caps is not a table; `handler validate` shows where")
    caps[key] = amount
    what = "the org" if scope == "org" else f"profile {scope}" + (", each run" if per_instance else "")
    return Change({path: _text(doc)}, f"Cap {what} at ${amount:,.2f} a month")


def _rules(doc: TOMLDocument, path: str) -> list[Table]:
    rules = doc.get("rules")
    if rules is None:
        return tomlkit.aot()
    if not isinstance(rules, AoT | list) or not all(isinstance(r, Table | dict) for r in rules):
        raise EditError(f"{path}: rules is not a list of [[rules]] tables; `handler validate` shows where")
    return rules


def _aot(tables: list[Table]) -> AoT:
    kept = tomlkit.aot()
    for table in tables:
        kept.append(table)
    return kept


def _org_document(files: Mapping[str, Blob]) -> tuple[str, TOMLDocument]:
    blob = files.get(_ORG)
    if blob is None:
        raise EditError(f"there is no {_ORG}; write one (apiVersion = \"handler.org/v1\", name = ...) first")
    try:
        return _ORG, tomlkit.parse(blob.data.decode("utf-8"))
    except (UnicodeDecodeError, tomlkit.exceptions.ParseError) as exc:
        raise EditError(f"{_ORG} cannot be edited: {exc}; `handler validate` shows where") from exc


def _text(doc: TOMLDocument) -> str:
    text = doc.as_string()
    return text if text.endswith("\n") else text + "\n"
