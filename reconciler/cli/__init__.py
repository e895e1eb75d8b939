"""The `handler` command: argument parsing and printing only; the work happens in the rooms.

Only this package prints. Its modules: `trees` (validate, plan, mcp-config), `governance`
(explain, approvals, audit, balance, spend, store), `service` (serve, up, status), `connectors`
(connector install) and `common`
(exit codes, loading a tree, printing findings).

Exit codes: 0 success, 1 findings (or a failed check), 2 unusable arguments (a missing folder, an
unknown git ref). Subcommands of other distributions' parts (the conformance runner) register
through the `handler.commands` entry-point group, so this package never imports them.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from importlib.metadata import entry_points

from reconciler.cli.common import EXIT_FINDINGS, EXIT_USAGE
from reconciler.cli.connectors import add_connector_commands
from reconciler.cli.governance import add_governance_commands
from reconciler.cli.service import add_service_commands
from reconciler.cli.trees import add_tree_commands
from reconciler.config import HandlerError, SourceError

__all__ = ["main"]


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
    add_tree_commands(sub)
    add_governance_commands(sub)
    add_service_commands(sub)
    add_connector_commands(sub)  # `connector install`; the conformance runner adds `connector check` to it
    for ep in entry_points(group="handler.commands"):
        ep.load()(sub)
    return parser
