"""`handler agent run | status | list | cancel`: agent runs on the running service, asked on its control socket.

A member starts a run (`--as`, a member of org.toml, recorded as the run's starter); the service runs it as the
agent's profile's `[runner]` says (docs/agents.md). Called by `reconciler.cli` when it builds its parser.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_FINDINGS, EXIT_OK, add_root_options, folder_path
from reconciler.liveness import ask_control, holder_of
from reconciler.places import default_state_dir
from reconciler.wire.errors import HandlerError

__all__ = ["add_agent_commands"]


def add_agent_commands(sub: Any) -> None:
    agent = sub.add_parser("agent", help="start, follow, list and cancel agent runs on the running service")
    asub = agent.add_subparsers(title="agent commands", metavar="COMMAND", required=True)
    start = _common(asub.add_parser("run", help="start a run of an agent (a profile with a [runner]) as a member"))
    start.add_argument("profile", help="the agent to run: a profile of the tree with a [runner]")
    start.add_argument("--input", required=True, help="what the agent is asked to do, in plain words")
    start.add_argument("--as", dest="member", required=True, metavar="MEMBER",
                       help="the member of config/org.toml who starts the run (holds routed to the caller go to them)")
    start.add_argument("--wait", action="store_true", help="wait until the run ends, then print it as status does")
    start.set_defaults(run=_run)
    status = _common(asub.add_parser("status", help="a run's status, and its result or error once it ended"))
    status.add_argument("run_id", metavar="RUN", help="the run's id, as `handler agent run` or `list` printed it")
    status.set_defaults(run=_status)
    listing = _common(asub.add_parser("list", help="every run of the service, with its parent and starter"))
    listing.set_defaults(run=_list)
    cancel = _common(asub.add_parser("cancel", help="stop a run; its processes end"))
    cancel.add_argument("run_id", metavar="RUN", help="the run's id")
    cancel.add_argument("--as", dest="member", default=None, metavar="MEMBER", help="who cancels, for the record")
    cancel.set_defaults(run=_cancel)


def _common(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_root_options(parser, positional=False)
    parser.add_argument("--state-dir", type=folder_path, help="the state folder of the running service (default: "
                        "HANDLER_STATE_DIR, else .handler/ under the root)")
    parser.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    return parser


def _ask(args: argparse.Namespace, message: dict[str, Any]) -> dict[str, Any]:
    state = args.state_dir or default_state_dir(Path(args.root))
    holder = holder_of(state)
    if holder is None:
        raise HandlerError(f"no service runs on {state}: start it with `handler up` (runs live in the service)")
    reply = ask_control(holder, {"ask": "agent", **message}, timeout=15.0)
    if reply is None:
        raise HandlerError(f"the service (pid {holder.pid}) does not answer on {holder.control}; `handler status`")
    if "error" in reply:
        raise HandlerError(str(reply["error"]))
    return reply


def _show(args: argparse.Namespace, run: dict[str, Any]) -> int:
    if args.format == "json":
        print(json.dumps(run, indent=2))
    else:
        print(f"{run['run']}  {run['agent']}  {run['status']}  parent: {run.get('parent') or '-'}  "
              f"starter: {run['starter']}")
        if run.get("result") is not None:
            print(f"result: {run['result']}")
        if run.get("error") is not None:
            print(f"error:  {run['error']}")
    return EXIT_OK if run["status"] in ("running", "succeeded") else EXIT_FINDINGS


def _run(args: argparse.Namespace) -> int:
    run = _ask(args, {"op": "run", "agent": args.profile, "input": args.input, "as": args.member})["run"]
    while args.wait and run["status"] == "running":
        time.sleep(0.2)
        run = _ask(args, {"op": "status", "run": run["run"]})["run"]
    return _show(args, run)


def _status(args: argparse.Namespace) -> int:
    return _show(args, _ask(args, {"op": "status", "run": args.run_id})["run"])


def _cancel(args: argparse.Namespace) -> int:
    return _show(args, _ask(args, {"op": "cancel", "run": args.run_id, "as": args.member})["run"])


def _list(args: argparse.Namespace) -> int:
    runs = _ask(args, {"op": "list"})["runs"]
    if args.format == "json":
        print(json.dumps(runs, indent=2))
        return EXIT_OK
    if not runs:
        print("no runs", file=sys.stderr)
    for run in runs:
        print(f"{run['run']}  {run['agent']:<16} {run['status']:<10} parent: {run.get('parent') or '-':<24} "
              f"starter: {run['starter']}")
    return EXIT_OK
