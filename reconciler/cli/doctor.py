"""`handler doctor [ROOT]`: the preflight (`reconciler.preflight`) of this machine against a config tree."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, add_root_options, load_tree
from reconciler.preflight import preflight

__all__ = ["add_doctor_command"]


def add_doctor_command(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="what on this machine keeps the service from working: secrets, programs, channels, scopes",
        description="Checks this machine against the config tree: the connectors' sandbox, every secret reference "
                    "of the bindings the profiles use (resolved now), every connector's program, every profile's "
                    "scope and where it routes holds. Exit 0 when nothing stops a call, 1 otherwise.")
    add_root_options(doctor)
    doctor.add_argument("--no-sandbox", action="store_true", help="the service will run with --no-sandbox: do not "
                        "check the sandbox")
    doctor.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    doctor.set_defaults(run=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    root = args.root
    snapshot = load_tree(root)
    if not snapshot.ok:
        print(f"handler doctor: {root} has errors; `handler validate {root}` shows them")
        return EXIT_FINDINGS
    problems = asyncio.run(preflight(snapshot, Path(root), os.environ, sandbox=not args.no_sandbox))
    if args.format == "json":
        print(json.dumps([p.to_dict() for p in problems], indent=2))
    elif not problems:
        print(f"OK: nothing on this machine keeps {root} from working")
    else:
        for problem in problems:
            print(problem.render())
        errors = sum(p.level == "error" for p in problems)
        print(f"{errors} errors, {len(problems) - errors} warnings")
    return EXIT_FINDINGS if any(p.level == "error" for p in problems) else EXIT_OK
