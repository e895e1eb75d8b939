"""The `handler` command: argument parsing and printing only; the work happens in the rooms.

Exit codes: 0 success, 1 findings (or a failed check), 2 unusable arguments (a missing folder, an
unknown git ref). Subcommands of other distributions' parts (the conformance runner) register
through the `handler.commands` entry-point group, so this module never imports them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path

from reconciler.config import (
    CODES,
    FolderSource,
    GitSource,
    HandlerError,
    Loader,
    Snapshot,
    SourceError,
    check_frozen,
    plan_changes,
)
from reconciler.config.findings import Finding, sort_findings

__all__ = ["main"]

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    try:
        code: int = args.run(args)
    except SourceError as exc:
        print(f"handler: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HandlerError as exc:
        print(f"handler: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    return code


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="handler", description="Handler services: contracts, bindings, governance.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")

    validate = sub.add_parser("validate", help="run the save-time checks on a config tree")
    validate.add_argument("root", nargs="?", default=".", help="the config root (holds config/); default: .")
    validate.add_argument("--base", metavar="REF", help="freeze the interface versions that exist at this git ref")
    validate.add_argument("--format", choices=["text", "json", "github"], default="text")
    validate.add_argument("--codes", action="store_true", help="list every finding code and exit")
    validate.set_defaults(run=_validate)

    plan = sub.add_parser("plan", help="what changes for each profile between a git ref and the tree")
    plan.add_argument("root", nargs="?", default=".")
    plan.add_argument("--base", metavar="REF", help="compare with this git ref (default: HEAD, or nothing)")
    plan.add_argument("--format", choices=["text", "json"], default="text")
    plan.set_defaults(run=_plan)

    for ep in entry_points(group="handler.commands"):
        ep.load()(sub)
    return parser


def _load(root: str) -> Snapshot:
    if not Path(root, "config").is_dir() and not Path(root, "catalog").is_dir():
        raise SourceError(f"{root} holds neither config/ nor catalog/; give the root of a config tree")
    return Loader().load(FolderSource(root))


def _load_base(root: str, ref: str) -> Snapshot:
    return Loader().load(GitSource.for_folder(root, ref))


def _validate(args: argparse.Namespace) -> int:
    if args.codes:
        for code in CODES.values():
            print(f"{code.id}  {code.severity.value:7}  {code.title}")
        return EXIT_OK
    head = _load(args.root)
    findings = list(head.findings)
    if args.base:
        findings = sort_findings([*findings, *check_frozen(_load_base(args.root, args.base), head)])
    _print_findings(findings, args.format, head)
    return EXIT_FINDINGS if any(f.is_error for f in findings) else EXIT_OK


def _print_findings(findings: list[Finding], fmt: str, head: Snapshot) -> None:
    errors = sum(1 for f in findings if f.is_error)
    warnings = len(findings) - errors
    if fmt == "json":
        print(
            json.dumps(
                {
                    "revision": head.revision,
                    "errors": errors,
                    "warnings": warnings,
                    "findings": [f.to_dict() for f in findings],
                },
                indent=2,
            )
        )
        return
    for f in findings:
        print(f.render_github() if fmt == "github" else f.render_text())
    summary = (
        f"{len(head.interfaces)} interface versions, {len(head.connectors)} connectors, "
        f"{len(head.bindings)} bindings, {len(head.profiles)} profiles"
    )
    if fmt == "github":
        print(f"handler validate: {errors} error(s), {warnings} warning(s) in {summary}")
    elif findings:
        print(f"\n{errors} error(s), {warnings} warning(s) in {summary}.")
    else:
        print(f"OK: {summary}; no findings.")


def _plan(args: argparse.Namespace) -> int:
    head = _load(args.root)
    if head.errors:
        _print_findings(list(head.errors), "text", head)
        return EXIT_FINDINGS
    base = _load_base(args.root, args.base) if args.base else None
    plan = plan_changes(base, head)
    if args.format == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    else:
        print(plan.render_text())
    return EXIT_OK
