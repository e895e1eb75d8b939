"""`handler connector install [NAME ...]`: build the environments connectors declare in `[needs]` (docs/config.md).

Registered on the parser by `reconciler.cli`, which makes the `connector` command; the conformance runner adds
`handler connector check` to the same command through its entry point (`connector_actions`). The service
itself never installs anything: `handler up` refuses to start a connector whose environment this command has
not built, naming it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE, load_tree
from reconciler.config.findings import suggest
from reconciler.config.snapshot import Connector
from reconciler.connectors.environments import build_environment, environment_path, missing_on_machine
from reconciler.connectors.errors import ConnectorStartError
from reconciler.connectors.sandbox import SYSTEM_PATH

__all__ = ["add_connector_commands", "connector_actions"]


def connector_actions(sub: Any) -> Any:
    """The `connector` command's own subcommands (install, and check when the conformance runner is installed):
    made once, whichever registers first."""
    parser = sub.choices.get("connector")
    if parser is None:
        parser = sub.add_parser("connector", help="install what connectors need; check them against their interfaces")
        return parser.add_subparsers(title="connector commands", metavar="ACTION", required=True)
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def add_connector_commands(sub: Any) -> None:
    install = connector_actions(sub).add_parser(
        "install", help="build the Python environments connectors declare in [needs]",
        description="Build each named connector's own Python environment (every connector declaring Python "
                    "packages when none is named) in the cache, $XDG_CACHE_HOME/handler/envs; one already built is "
                    "kept. Package builds and setup commands run in a sandbox: another user, none of this shell's "
                    "environment but its pip configuration, the package registries its pip and npm use as the only "
                    "network, and the environment's own folder as the only one written. Also says which Debian "
                    "packages and programs they need are missing on this machine.")
    install.add_argument("connectors", nargs="*", metavar="NAME", help="connectors of catalog/connectors/")
    install.add_argument("--root", default=".", help="the config root (default: the current folder)")
    install.add_argument("--no-sandbox", action="store_true",
                         help="build as this user, with its environment, files and network (only where no sandbox "
                              "can be built, for code you trust)")
    install.set_defaults(run=_install)


def _install(args: argparse.Namespace) -> int:
    snapshot = load_tree(args.root)
    for name in args.connectors:
        if name not in snapshot.connectors:
            hint = suggest(name, sorted(snapshot.connectors))
            print(f"handler connector install: no connector '{name}' in {args.root}{hint.did_you_mean}",
                  file=sys.stderr)
            return EXIT_USAGE
    chosen = [snapshot.connectors[n] for n in args.connectors] or [
        c for _, c in sorted(snapshot.connectors.items()) if _declares_needs(c)]
    code = EXIT_OK
    for connector in chosen:
        code = max(code, _install_one(connector, sandbox=not args.no_sandbox))
    if not chosen:
        print("no connector declares [needs]: nothing to install")
    return code


def _install_one(connector: Connector, *, sandbox: bool) -> int:
    needs = connector.spec.needs
    if not _declares_needs(connector):
        print(f"{connector.name}: declares no [needs], nothing to install")
        return EXIT_OK
    code = EXIT_OK
    if needs.python:
        try:
            built = build_environment(connector, say=lambda line: print(line, flush=True), sandbox=sandbox)
        except ConnectorStartError as exc:
            print(f"{connector.name}: its environment could not be built: {exc.message}", file=sys.stderr)
            code = EXIT_FINDINGS
        else:
            if not built:
                print(f"{connector.name}: its environment is built ({environment_path(connector)})")
    environment = environment_path(connector)
    own = [str(environment / "bin")] if environment is not None else []
    path = os.pathsep.join([*own, str(Path(sys.executable).parent), SYSTEM_PATH])  # a connector's PATH at its start
    missing = missing_on_machine(needs, path)
    if missing:  # the machine's, not this command's to install: said here, and again when the connector starts
        print(f"note: {missing.describe(connector.name)}", file=sys.stderr)
    return code


def _declares_needs(connector: Connector) -> bool:
    needs = connector.spec.needs
    return bool(needs.python or needs.debian or needs.programs)
