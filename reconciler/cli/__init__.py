"""The `handler` command: argument parsing and printing only; the work happens in the rooms.

Only this package prints. Its modules: `trees` (validate, plan, mcp-config), `governance`
(explain, approvals, audit, balance, spend, store), `tokens` (token create, list, revoke), `service` (serve, up,
status), `doctor`, `editing` (binding create, profile use), `dashboard` (dashboard login), `connectors`
(connector install), `call` (call a tool from a script; its flags from `flags`), `llm` (`handler-llm`) and
`common` (exit codes, the config root, loading a tree, printing findings).

Every command that reads a config tree takes `--root DIR` (else $HANDLER_ROOT, else the current
folder); those that always took a positional ROOT keep it as an alias.

Exit codes: 0 success, 1 findings (or a failed check), 2 unusable arguments (a missing folder, an
unknown git ref); `handler call` has its own (see `call`). Subcommands of other distributions' parts
(the conformance runner) register through the `handler.commands` entry-point group, so this package
never imports them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points

from reconciler.cli.common import EXIT_FINDINGS, EXIT_USAGE, settle_root
from reconciler.wire.errors import HandlerError

__all__ = ["main"]

EXIT_INTERRUPTED = 130  # as a shell reports a command ended by SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["call"]:
        # Its flags come from the tool's schema, so it parses its own words; and it loads only what a
        # call needs, so a script calling tools in a loop does not pay for the service's rooms each time.
        from reconciler.cli.call import run_call
        return _guarded(lambda: run_call(words[1:]))
    parser = _build_parser()
    args = parser.parse_args(words)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    return _guarded(lambda: _run(args))


def _run(args: argparse.Namespace) -> int:
    settle_root(args)
    return int(args.run(args))


def _guarded(run: Callable[[], int]) -> int:
    """`run`'s exit code; a HandlerError is printed: a tree that cannot be read is 2, any other 1. Ctrl-C before
    the service took its signals is exit 130, and a reader that went away (`| head`) ends the command quietly."""
    from reconciler.config.errors import SourceError
    try:
        return run()
    except SourceError as exc:
        print(f"handler: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except HandlerError as exc:
        print(f"handler: {exc}", file=sys.stderr)
        return EXIT_FINDINGS
    except KeyboardInterrupt:
        print("handler: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that is quiet too.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_FINDINGS


def _build_parser() -> argparse.ArgumentParser:
    from reconciler.cli.agents import add_agent_commands
    from reconciler.cli.call import add_call_command
    from reconciler.cli.connectors import add_connector_commands
    from reconciler.cli.dashboard import add_dashboard_commands
    from reconciler.cli.doctor import add_doctor_command
    from reconciler.cli.editing import add_edit_commands
    from reconciler.cli.governance import add_governance_commands
    from reconciler.cli.service import add_service_commands
    from reconciler.cli.tokens import add_token_commands
    from reconciler.cli.trees import add_tree_commands

    parser = argparse.ArgumentParser(prog="handler", description="Handler services: contracts, bindings, governance.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    add_tree_commands(sub)
    add_governance_commands(sub)
    add_token_commands(sub)
    add_service_commands(sub)
    add_call_command(sub)
    add_doctor_command(sub)
    add_connector_commands(sub)  # `connector install`; the conformance runner adds `connector check` to it
    add_edit_commands(sub)
    add_dashboard_commands(sub)
    add_agent_commands(sub)
    for ep in entry_points(group="handler.commands"):
        ep.load()(sub)
    return parser
