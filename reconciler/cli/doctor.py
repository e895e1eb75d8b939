"""`handler doctor [ROOT]`: the preflight (`reconciler.preflight`) of this machine against a config tree.

When a service runs on the state folder, doctor asks it (its control socket, `reconciler.liveness`) to run the
preflight again in its own environment and sandbox, and prints what it found of the revision it serves: an env
secret set in this shell but not in the service's is the service's problem, not the shell's. Without a running
service (or with `--here`) it judges the tree in this shell. Either way it says which environment it judged.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, add_root_options, folder_path, load_tree
from reconciler.liveness import ask_service, holder_of
from reconciler.places import default_state_dir, not_a_folder
from reconciler.preflight import preflight

__all__ = ["add_doctor_command"]

SERVICE_ENV = "the running service's environment"
SHELL_ENV = "this shell's environment"


def add_doctor_command(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="what on this machine keeps the service from working: secrets, programs, channels, scopes",
        description="Checks this machine against the config tree: the connectors' sandbox, every secret reference "
                    "of the bindings the profiles use (resolved now), every connector's program, every profile's "
                    "scope and where it routes holds. When a service runs on the state folder, it asks that service "
                    "to check again in its own environment, of the revision it serves; else it checks in this "
                    "shell. Exit 0 when nothing stops a call, 1 otherwise.")
    add_root_options(doctor)
    doctor.add_argument("--no-sandbox", action="store_true", help="the service will run with --no-sandbox: do not "
                        "check the sandbox (in this shell only; a running service checks as it runs)")
    doctor.add_argument("--state-dir", type=folder_path, help="the state folder of the service to ask (default: "
                        "HANDLER_STATE_DIR, else .handler/ under the root)")
    doctor.add_argument("--here", action="store_true", help="judge this shell's environment even when a service "
                        "runs (what a service started from this shell would meet)")
    doctor.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    doctor.set_defaults(run=_doctor)


def _doctor(args: argparse.Namespace) -> int:
    root = args.root
    judged = None if args.here else _ask_running(args)
    if judged is not None:
        problems, where = judged
    else:
        snapshot = load_tree(root)
        if not snapshot.ok:
            print(f"handler doctor: {root} has errors; `handler validate {root}` shows them")
            return EXIT_FINDINGS
        found = asyncio.run(preflight(snapshot, Path(root), os.environ, sandbox=not args.no_sandbox))
        problems, where = [p.to_dict() for p in found], SHELL_ENV
    if args.format == "json":
        print(json.dumps({"judged": where, "problems": problems}, indent=2))
    else:
        _print_problems(problems, where, root)
    return EXIT_FINDINGS if any(p["level"] == "error" for p in problems) else EXIT_OK


def _ask_running(args: argparse.Namespace) -> tuple[list[dict[str, Any]], str] | None:
    """(the running service's problems, which environment judged them), or None when no service runs here."""
    state = args.state_dir or default_state_dir(Path(args.root))
    if not_a_folder(state) is not None:
        return None
    holder = holder_of(state)
    if holder is None:
        return None
    status = ask_service(holder, timeout=90.0, ask="doctor")
    if status is None:
        print(f"handler doctor: a service runs on {state} (pid {holder.pid}) but does not answer; judging this "
              "shell's environment instead", file=sys.stderr)
        return None
    served = (status.get("applied") or {}).get("revision", "?")
    return list(status.get("preflight") or []), f"{SERVICE_ENV} (pid {holder.pid}, revision {served[:12]})"


def _print_problems(problems: list[dict[str, Any]], where: str, root: str) -> None:
    print(f"judged in {where}")
    if not problems:
        print(f"OK: nothing on this machine keeps {root} from working")
        return
    for p in problems:
        print(f"{p['level']}: {p['subject']}: {p['message']}\n  fix: {p['fix']}")
    errors = sum(p["level"] == "error" for p in problems)
    print(f"{errors} errors, {len(problems) - errors} warnings")
