"""`handler binding create`, `profile create|use`, `rule`, `pin`, `routing` and `cap`: change the config tree the way
a pull request would.

The edit itself is `reconciler.config.editing` (shared with the dashboard); this module reads the tree
(the folder, or with `--branch` the commit the branch starts from), prints the findings that keep a
change out or the plan it makes, and writes the files or commits them to a new branch
(`reconciler.gitops.branches`). Registered on the parser by `reconciler.cli`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, TypeVar

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, add_root_options, require_tree
from reconciler.config import FolderSource, GitSource
from reconciler.config.editing import (
    Checked,
    Edit,
    EditError,
    check_edit,
    create_binding,
    parse_secret,
    parse_setting,
    parse_use,
    reference_warnings,
    use_bindings,
    write_change,
)
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
from reconciler.config.snapshot import Snapshot
from reconciler.gitops.branches import GitTree, commit_to_new_branch
from reconciler.governance.explain import moved_decisions
from reconciler.governance.explain import render_text as render_explanation

__all__ = ["add_edit_commands"]

T = TypeVar("T")


def add_edit_commands(sub: Any) -> None:
    binding = sub.add_parser("binding", help="add a binding to the config tree")
    bsub = binding.add_subparsers(title="binding commands", metavar="ACTION", required=True)
    create = bsub.add_parser(
        "create", help="write config/bindings/NAME.toml for a connector, checked first",
        description="Writes a new binding, after running every save-time check on the tree as it would be and "
                    "printing the plan; a change with errors is not written. Secrets are references only.")
    create.add_argument("name", help="the binding's name (its file is config/bindings/NAME.toml)")
    create.add_argument("--connector", required=True, help="the connector it configures (catalog/connectors/NAME)")
    create.add_argument("--description", default="", help="one line saying what this binding is for")
    create.add_argument("--secret", action="append", default=[], metavar="SLOT=REF",
                        help="fill a secret slot by reference: SLOT=env:VARIABLE, SLOT=file:PATH or "
                             "SLOT=command:'ARGV' (never a value); repeat for each slot")
    create.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="set one of the connector's settings; repeat for each")
    _add_common(create)
    create.set_defaults(run=_binding_create)

    profile = sub.add_parser("profile", help="change which binding serves an interface for a profile")
    psub = profile.add_subparsers(title="profile commands", metavar="ACTION", required=True)
    use = psub.add_parser(
        "use", help="make PROFILE use BINDING for INTERFACE, checked first",
        description="Sets services.INTERFACE = BINDING in config/profiles/PROFILE.toml (comments and key order "
                    "kept), after running every save-time check on the tree as it would be and printing the plan; "
                    "a change with errors is not written.")
    use.add_argument("profile", help="the profile (config/profiles/PROFILE.toml)")
    use.add_argument("uses", nargs="+", metavar="INTERFACE=BINDING",
                     help="the interface (ocr, or ocr/v1 to pin a version) and the binding to serve it")
    _add_common(use)
    use.set_defaults(run=_profile_use)
    _add_governance_commands(sub, psub)


def _add_governance_commands(sub: Any, psub: Any) -> None:
    """`profile create` and the `rule`, `pin`, `routing` and `cap` commands: governance as commits."""
    made = psub.add_parser("create", help="write config/profiles/NAME.toml on a template, checked first",
                           description="A new agent: its profile on a template, with a work folder of its own "
                           "(work/NAME); --from copies another profile's services, pins, routing, rules and caps.")
    made.add_argument("name", help="the profile's name (its file is config/profiles/NAME.toml)")
    made.add_argument("--template", required=True, help="permissive, balanced, restrictive or a template of "
                      "config/templates/")
    made.add_argument("--from", dest="source", metavar="PROFILE", help="copy this profile's governance and services")
    _add_common(made, base_flag="--base")  # --from names the profile copied here
    made.set_defaults(run=lambda a: _apply(a, lambda f: create_profile(f, a.name, a.template, source=a.source),
                                           a.name))

    rule = _actions(sub, "rule", "a per-action rule of a profile: allow, approve or block one tool (or interface)")
    for verb in ("set", "unset"):
        act = rule.add_parser(verb, help=f"{verb} PROFILE's rule on ACTION")
        act.add_argument("profile", help="the profile (config/profiles/PROFILE.toml)")
        act.add_argument("target", metavar="ACTION", help="a tool, e.g. send_email_send (with --service, an "
                         "interface, e.g. send-email)")
        if verb == "set":
            act.add_argument("outcome", choices=OUTCOMES, help="allow: runs at once; approve: waits for a person; "
                             "block: refused")
        act.add_argument("--service", action="store_true", help="ACTION names an interface: the rule covers its tools")
        _add_common(act)
    rule.choices["set"].set_defaults(run=lambda a: _apply(a, lambda f: set_rule(
        f, a.profile, a.target, a.outcome, service=a.service), a.profile))
    rule.choices["unset"].set_defaults(run=lambda a: _apply(a, lambda f: unset_rule(
        f, a.profile, a.target, service=a.service), a.profile))

    pin = _actions(sub, "pin", "pin an interface of a profile: its automatic calls wait for a person")
    for verb, edit in (("set", set_pin), ("unset", unset_pin)):
        act = pin.add_parser(verb, help=f"{verb} PROFILE's pin on INTERFACE")
        act.add_argument("profile", help="the profile (config/profiles/PROFILE.toml)")
        act.add_argument("interface", help="an interface the profile uses, e.g. send-email")
        _add_common(act)
        act.set_defaults(run=lambda a, edit=edit: _apply(a, lambda f: edit(f, a.profile, a.interface), a.profile))

    routing = _actions(sub, "routing", "where a profile's holds go")
    act = routing.add_parser("set", help="route PROFILE's holds")
    act.add_argument("profile", help="the profile (config/profiles/PROFILE.toml)")
    act.add_argument("to", metavar="member:NAME|slack:#CHANNEL|caller|none|default",
                     help="who decides its holds: a member, an allow-listed Slack channel, the run that started it, "
                     "nobody (full trust), or the org's policies (default)")
    _add_common(act)
    act.set_defaults(run=_routing_set)

    cap = _actions(sub, "cap", "a monthly spend cap in USD")
    act = cap.add_parser("set", help="cap the org (SCOPE org) or a profile at AMOUNT USD a month")
    act.add_argument("scope", metavar="org|PROFILE", help="org, or the profile to cap")
    act.add_argument("amount", type=float, metavar="AMOUNT", help="USD a calendar month (UTC)")
    act.add_argument("--per-instance", action="store_true", help="cap each run of the profile, not the profile")
    _add_common(act)
    act.set_defaults(run=lambda a: _apply(a, lambda f: set_cap(f, a.scope, a.amount, per_instance=a.per_instance),
                                          None if a.scope == "org" else a.scope))


def _actions(sub: Any, name: str, what: str) -> Any:
    return sub.add_parser(name, help=what).add_subparsers(title=f"{name} commands", metavar="ACTION", required=True)


def _routing_set(args: argparse.Namespace) -> int:
    try:
        routing = parse_routing(args.to)
    except EditError as exc:
        return _usage(exc)
    return _apply(args, lambda files: set_routing(files, args.profile, routing), args.profile)


def _add_common(parser: argparse.ArgumentParser, base_flag: str = "--from") -> None:
    add_root_options(parser, positional=False)
    parser.add_argument("--branch", metavar="NAME", help="commit the change to this new branch of the config "
                        "root's git repository, for a pull request, instead of writing the files; the work tree, "
                        "HEAD and every existing branch stay as they are")
    parser.add_argument(base_flag, dest="base", default="HEAD", metavar="REF", help="with --branch: the commit the "
                        "branch starts from (default: HEAD)")
    parser.add_argument("--check", action="store_true", help="check the change and print its plan; write nothing")


def _binding_create(args: argparse.Namespace) -> int:
    try:
        secrets = _keyed([parse_secret(s) for s in args.secret], "--secret", "slot")
        settings = _keyed([parse_setting(s) for s in args.setting], "--setting", "setting")
    except EditError as exc:
        return _usage(exc)
    for slot, reference in secrets.items():  # this shell's environment is not the service's: files only
        for warning in reference_warnings(slot, reference, Path(args.root)):
            print(f"warning: {warning}", file=sys.stderr)
    return _apply(args, lambda files: create_binding(files, args.name, args.connector, description=args.description,
                                                     secrets=secrets, settings=settings))


def _profile_use(args: argparse.Namespace) -> int:
    try:
        uses = [parse_use(u) for u in args.uses]
        _keyed([(interface.partition("/")[0], binding) for interface, binding in uses], "interface", "interface")
    except EditError as exc:
        return _usage(exc)
    return _apply(args, lambda files: use_bindings(files, args.profile, uses))


def _keyed(pairs: list[tuple[str, T]], named: str, what: str) -> dict[str, T]:
    """`pairs` as a dict; EditError for a key given twice, where the second silently replaced the first."""
    found: dict[str, T] = {}
    for key, value in pairs:
        if key in found:
            raise EditError(f"{named} {key} is given twice; give each {what} once")
        found[key] = value
    return found


def _usage(exc: Exception) -> int:
    print(f"handler: {exc}", file=sys.stderr)
    return EXIT_USAGE


def _apply(args: argparse.Namespace, edit: Edit, explained: str | None = None) -> int:
    """Make the change on the tree (or the branch's base commit), check it, and write or commit it when clean;
    with `explained`, what each call of that profile whose decision changes would now get, as `handler explain`
    says it."""
    root = require_tree(args.root)
    repository = GitTree.of(root) if args.branch else None  # first: not in git is said in --branch's words
    source = GitSource.for_folder(root, args.base) if repository else FolderSource(root)
    try:
        checked = check_edit(source, edit)
    except EditError as exc:
        return _usage(exc)
    change = checked.change
    if not checked.ok:
        _print_refusal(checked)
        return EXIT_FINDINGS
    for finding in checked.new_findings:  # warnings the change brings: it goes ahead, but they are shown
        print(finding.render_text())
    print(checked.plan.render_text())
    if explained is not None:
        _print_decisions(checked.before, checked.after, explained)
    if args.check:
        print(f"checked: {change.summary}; nothing written (--check)")
    elif repository is not None:
        done = commit_to_new_branch(repository, args.base, args.branch, change.files, change.summary)
        print(f"committed {done.commit[:12]} to new branch {done.branch} (from {done.base[:12]}): {change.summary}")
        print(f"  push it for a pull request: {done.push_hint()}")
    else:
        for path in write_change(root, change):
            print(f"wrote {path}: {change.summary}")
    return EXIT_OK


def _print_decisions(before: Snapshot, after: Snapshot, profile: str) -> None:
    """`handler explain`'s account of each of `profile`'s calls whose decision the change moves."""
    moved = moved_decisions(before, after, profile)
    if not moved:
        print(f"no call of {profile} is decided otherwise")
    for tool, decision in moved:
        print(render_explanation(decision, profile, tool))


def _print_refusal(checked: Checked) -> None:
    """The errors that keep the change out, those it brings first; nothing was written."""
    already = checked.standing_errors
    for finding in checked.brought_errors:
        print(finding.render_text())
    if already:
        print(f"the tree already has {len(already)} error(s) the change does not fix "
              "(`handler validate` shows them):")
        for finding in already:
            print(finding.render_text())
    print(f"\nnot written: {checked.change.summary} would leave {len(checked.errors)} error(s) the service refuses")

