"""`handler serve`, `handler up` and `handler status`: run the service (`reconciler.app`) and say what it does.

What the service reports as it runs (ready, a reload, a failed fetch, serving the last good
revision, a tree it cannot start on) is printed here, on stderr. Registered on the parser by
`reconciler.cli`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from reconciler.app import DEFAULT_STOP_GRACE, Reports, Service, ServiceOptions, serve, up
from reconciler.cli.common import (
    EXIT_FINDINGS,
    EXIT_OK,
    add_root_options,
    finite_number,
    folder_path,
    load_tree,
    print_findings,
)
from reconciler.config import HandlerError, SourceError, short_revision
from reconciler.gitops.following import FollowReports
from reconciler.gitops.status import Attempt, read_status
from reconciler.governance.alerts import list_alerts
from reconciler.governance.auditing import SET_ASIDE, pricing_violations_this_month, set_aside_this_month
from reconciler.governance.errors import StoreError
from reconciler.governance.store import open_store, store_exists, store_url
from reconciler.liveness import ask_service, holder_of
from reconciler.places import default_state_dir, not_a_folder
from reconciler.router.server import Router
from reconciler.web.links import SIGN_IN_MINUTES

EXIT_NOT_RUNNING = 3  # `handler status`: no service runs on this state folder

__all__ = ["add_service_commands"]

_BRIEF = 3  # changes of an applied reload shown on its console line

_STOP_GRACE = ("at SIGTERM or SIGINT, how long the calls in flight may finish before they are cut off (default "
               f"{DEFAULT_STOP_GRACE:g}; 0: at once); a second signal stops at once. Keep it under your service "
               "manager's wait before it kills (Docker's 10 s, systemd's 90)")
_NO_SANDBOX = ("run connectors without a sandbox (where this machine cannot build one: the start says why); they "
               "then see the router's files and reach any host, with no egress allow-list; warns once")


def add_service_commands(sub: Any) -> None:
    serving = sub.add_parser("serve", help="serve each profile's tools on its unix socket until stopped (SIGHUP "
                             "reloads)")
    add_root_options(serving)
    serving.add_argument("--run-dir", type=folder_path, help="where the profiles' sockets go (default: "
                         "$HANDLER_RUN_DIR, else $XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    serving.add_argument("--state-dir", type=folder_path, help="the call log and connector logs (default: "
                         "$HANDLER_STATE_DIR, else ROOT/.handler)")
    serving.add_argument("--no-sandbox", action="store_true", help=_NO_SANDBOX)
    serving.add_argument("--http", metavar="HOST:PORT", help="also serve the agents' MCP endpoints over HTTP there, "
                         "/mcp/<profile> (each asks for a bearer token of its profile), and /healthz")
    serving.add_argument("--stop-grace", type=_grace, default=DEFAULT_STOP_GRACE, metavar="SECONDS", help=_STOP_GRACE)
    serving.set_defaults(run=_serve)
    _add_up_command(sub)
    status = sub.add_parser("status", help="what the running (or last) service applied, attempted and serves")
    add_root_options(status)
    status.add_argument("--state-dir", type=folder_path, help="the state folder of the service to ask (default: "
                        "$HANDLER_STATE_DIR, else ROOT/.handler)")
    status.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    status.set_defaults(run=_status)


def _add_up_command(sub: Any) -> None:
    running = sub.add_parser("up", help="run the service: follow the config tree (or a git ref) and serve its "
                             "profiles")
    running.add_argument("root", nargs="?", default=None, metavar="ROOT", help="the same as --root")
    running.add_argument("--root", dest="root_option", metavar="DIR", help="the config root (worktree), or a "
                         "repository git can fetch, a path or a URL (git) (default: $HANDLER_ROOT, else the current "
                         "folder)")
    running.add_argument("--source", choices=["worktree", "git"], default="worktree", help="worktree: follow the "
                         "files as they are saved; git: follow --ref of the repository, fetched every --interval")
    running.add_argument("--ref", default="main", help="the branch to follow with --source git (default: main)")
    running.add_argument("--interval", type=_interval, default=30.0, help="seconds between fetches with --source git "
                         "(at least 1; a verified push webhook fetches at once)")
    running.add_argument("--http", default="127.0.0.1:8765", metavar="HOST:PORT",
                         help="the dashboard, the agents' MCP endpoints /mcp/<profile>, /healthz, /status, "
                         "/hooks/git, /hooks/slack")
    running.add_argument("--no-sandbox", action="store_true", help=_NO_SANDBOX)
    running.add_argument("--stop-grace", type=_grace, default=DEFAULT_STOP_GRACE, metavar="SECONDS", help=_STOP_GRACE)
    running.add_argument("--run-dir", type=folder_path, help="where the profiles' sockets go (default: "
                         "$HANDLER_RUN_DIR)")
    running.add_argument("--state-dir", type=folder_path, help="status.json, the call log, the git mirror (default: "
                         "$HANDLER_STATE_DIR, else ROOT/.handler)")
    running.set_defaults(run=_up)


# --- handler serve ---------------------------------------------------------------------------------


def _interval(text: str) -> float:
    return finite_number(text, low=1.0, high=86_400.0, said="an interval: give seconds from 1 to 86,400")


def _serve(args: argparse.Namespace) -> int:
    head = load_tree(args.root)
    if head.errors:
        print_findings(list(head.findings), "text", head)
        print("handler serve: not starting; the router serves only a tree without errors", file=sys.stderr)
        return EXIT_FINDINGS
    for finding in head.findings:
        print(finding.render_text(), file=sys.stderr)

    def ready(router: Router) -> None:
        profiles = ", ".join(sorted(router.live.snapshot.profiles)) or "no profiles"
        sockets = router.run_dir / "profiles"
        print(f"handler serve: revision {short_revision(head.revision)}: {profiles} on {sockets}/<profile>.sock",
              file=sys.stderr, flush=True)

    def listening(base: str) -> None:
        print(f"handler serve: MCP over HTTP at {base}/mcp/<profile>, for a bearer token of the profile (handler "
              "token create <profile>)", file=sys.stderr, flush=True)

    http = _address(args.http) if args.http else None
    return serve(head, root=Path(args.root), run_dir=args.run_dir, state_dir=args.state_dir, on_ready=ready,
                 on_reload=_reload_printer("serve"), sandbox=not args.no_sandbox, http=http, on_listening=listening,
                 stop_grace=args.stop_grace, stopping=_stop_printer("serve"))


def _grace(text: str) -> float:
    return finite_number(text, low=0.0, high=3_600.0, said="a grace: give seconds from 0 to 3,600")


def _stop_printer(command: str) -> Reports:
    """The console lines of a stop that waits for calls in flight, and of one that cut some off."""

    def stopping(running: int, grace: float) -> None:
        print(f"handler {command}: stopping; {running} call(s) in flight may finish for up to {grace:g} s (signal "
              "again to stop now); new requests on stdio wait for the next router, new calls over HTTP are told to "
              "call again", file=sys.stderr, flush=True)

    def cut_off(running: int) -> None:
        print(f"handler {command}: stopped with {running} call(s) still running: cut off, and each agent is told it "
              "may or may not have run (a longer --stop-grace lets such calls finish)", file=sys.stderr, flush=True)

    return Reports(stopping=stopping, cut_off=cut_off)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SourceError(f"--http {text!r} is not HOST:PORT, e.g. 127.0.0.1:8765")
    return host, int(port)


def _reload_printer(command: str) -> Callable[[Attempt], None]:
    """One console line per applied reload, with its plan in brief; a refused one's line and its errors."""

    def report(attempt: Attempt) -> None:
        revision = short_revision(attempt.revision)
        if attempt.result == "applied":
            changes = list(attempt.changes)
            brief = "; ".join(changes[:_BRIEF]) + (f"; and {len(changes) - _BRIEF} more (`handler status` lists "
                                                   "them)" if len(changes) > _BRIEF else "")
            print(f"handler {command}: applied {revision} as {attempt.message} ({attempt.reason}): "
                  f"{brief or 'nothing changes for any profile'}", file=sys.stderr, flush=True)
        elif attempt.result == "invalid":
            errors = [f for f in attempt.findings if f["severity"] == "error"]
            print(f"handler {command}: revision {revision} not applied ({attempt.reason}): {len(errors)} error(s); "
                  "still serving the last good revision", file=sys.stderr)
            _print_errors(errors)
        elif attempt.result != "unchanged":
            print(f"handler {command}: revision {revision} was {attempt.result} ({attempt.reason}): "
                  f"{attempt.message}; still serving the last good revision", file=sys.stderr, flush=True)

    return report


def _print_errors(findings: Sequence[dict[str, Any]]) -> None:
    """Findings (as `Finding.to_dict` gives them) with their fix lines, on stderr."""
    for finding in findings:
        print(f"  {finding['file']}:{finding['line']}: {finding['code']} {finding['message']}", file=sys.stderr)
        if finding.get("fix"):
            print(f"    fix: {finding['fix']}", file=sys.stderr)
    sys.stderr.flush()


# --- handler up ------------------------------------------------------------------------------------


def _up(args: argparse.Namespace) -> int:
    host, port = _address(args.http)
    if args.source == "worktree" and not Path(args.root, "config").is_dir():
        raise SourceError(f"{args.root} holds no config/; give the root of a config tree, or --source git")
    secret = os.environ.get("HANDLER_WEBHOOK_SECRET", "").encode() or None
    options = ServiceOptions(root=args.root, source=args.source, ref=args.ref, interval=args.interval,
                             run_dir=args.run_dir, state_dir=args.state_dir, http_host=host, http_port=port,
                             webhook_secret=secret, sandbox=not args.no_sandbox, stop_grace=args.stop_grace)
    stopping = _stop_printer("up")
    reports = Reports(ready=_print_up_ready, not_started=_print_not_started,
                      follow=FollowReports(fetch_failed=_print_fetch_failed, fell_back=_print_fell_back,
                                           reconciled=_reload_printer("up"), recovered=_print_recovered),
                      stopping=stopping.stopping, cut_off=stopping.cut_off)
    return up(options, reports=reports)


def _print_up_ready(service: Service) -> None:
    router, status = service.router, service.reconciler.status
    port = service.listener.port if service.listener is not None else service.options.http_port
    sockets = router.run_dir / "profiles"
    print(f"handler up: {status.source}", file=sys.stderr)
    if status.applied is not None:
        print(f"  serving revision {short_revision(status.applied.revision)} as generation "
              f"{status.applied.generation}",
              file=sys.stderr)
    for name in sorted(router.live.snapshot.profiles):
        print(f"  profile {name}: {sockets / name}.sock", file=sys.stderr)
    print(f"  http://{service.options.http_host}:{port}/  the dashboard: status, approvals, catalog (also /status, "
          "/healthz, POST /hooks/git, POST /hooks/slack)", file=sys.stderr)
    signing_in = service.owner_sign_in()
    if signing_in is not None:
        owner, link = signing_in
        print(f"  sign in as {owner} (an owner; once, within {SIGN_IN_MINUTES} minutes): {link}", file=sys.stderr)
        print("  another member signs in with: handler dashboard login --member NAME", file=sys.stderr)
    print("  an agent's MCP client runs: handler-service <interface> --profile <profile>, with "
          f"HANDLER_RUN_DIR={router.run_dir}", file=sys.stderr)
    print(f"  an agent elsewhere: http://{service.options.http_host}:{port}/mcp/<profile> over Streamable HTTP, with a "
          "bearer token of the profile (handler token create <profile>)", file=sys.stderr)
    for problem in status.preflight:  # what `handler doctor` says: this machine against the tree
        print(f"  {problem['level']}: {problem['subject']}: {problem['message']} (fix: {problem['fix']})",
              file=sys.stderr)
    print(f"  Ctrl-C stops everything, once the calls in flight have finished (at most {service.options.stop_grace:g} s"
          "; again: at once).", file=sys.stderr, flush=True)


def _print_fetch_failed(error: HandlerError) -> None:
    print(f"handler up: {error}", file=sys.stderr)


def _print_recovered(attempt: Attempt) -> None:
    print(f"handler up: the source's head serves again ({attempt.reason}): revision "
          f"{short_revision(attempt.revision)}", file=sys.stderr, flush=True)


def _print_fell_back(revision: str) -> None:
    print(f"handler up: the head is not servable; serving the last good revision {short_revision(revision)}",
          file=sys.stderr)


def _print_not_started(attempt: Attempt) -> None:
    print(f"handler up: not starting: revision {short_revision(attempt.revision)} was {attempt.result}: "
          f"{attempt.message}", file=sys.stderr)
    _print_errors([f for f in attempt.findings if f["severity"] == "error"])
    print("fix the tree (`handler validate` shows every finding) and start again", file=sys.stderr)


# --- handler status --------------------------------------------------------------------------------


def _status(args: argparse.Namespace) -> int:
    """Ask the service running on this state folder; when none runs, say so (exit 3) and show the last record."""
    state = args.state_dir or default_state_dir(Path(args.root))
    if (problem := not_a_folder(state)) is not None:  # from HANDLER_STATE_DIR: --state-dir is checked as it is parsed
        raise SourceError(f"{problem}: give the service's state folder with --state-dir or HANDLER_STATE_DIR")
    holder = holder_of(state)
    if holder is None:
        return _not_running(state, args.format)
    status = ask_service(holder)
    if status is None:
        print(f"handler status: a service runs on {state} (pid {holder.pid}) but does not answer on "
              f"{holder.control}; is it stuck starting? `kill -TERM {holder.pid}` stops it", file=sys.stderr)
        return EXIT_FINDINGS
    status.update(_audit_alarms(args.root))
    if args.format == "json":
        print(json.dumps(status, indent=2))
    else:
        running = status["running"]
        print(f"running: pid {running['pid']}, run folder {running['runDir']}"
              + (f", {running['http']}" if running.get("http") else ""))
        _print_status(status)
    return EXIT_OK if args.format == "json" or status["ready"] else EXIT_FINDINGS


def _print_checks(status: dict[str, Any]) -> None:
    """The preflight of the revision served (run again at each applied revision, not only at the start)."""
    if status.get("checked"):
        print(f"checks:  {status['checked']}, in the service's environment")
    for problem in status.get("preflight", []):
        print(f"{problem['level']}: {problem['subject']}: {problem['message']}\n  fix: {problem['fix']}")


def _not_running(state: Path, form: str) -> int:
    recorded = read_status(state / "status.json")
    if form == "json":
        print(json.dumps({"running": False, "lastRecorded": recorded}, indent=2))
    else:
        print(f"not running: no handler service runs on the state folder {state}")
        if recorded is None:
            print("  nothing recorded there yet; `handler up` starts one")
        else:
            print("last recorded (history, not now):")
            _print_status(recorded)
    return EXIT_NOT_RUNNING


def _audit_alarms(root: str) -> dict[str, Any]:
    """This month's reports of a cost above the reservation, rows the store refused and bindings not set up, from the
    store (None when there is no store yet); a store that cannot be read is said under `storeProblem`, and the status
    shown whole."""
    url = store_url(root)
    if not store_exists(url):
        return {"pricingViolations": None, "setAside": None}
    try:
        store = open_store(url, migrate=False)
        try:
            unready = [{"binding": a.binding, "message": a.message, "calls": a.calls} for a in list_alerts(store)]
            return {"pricingViolations": pricing_violations_this_month(store), "setAside": set_aside_this_month(store),
                    "notSetUp": unready}
        finally:
            store.close()
    except StoreError as exc:
        return {"pricingViolations": None, "setAside": None, "storeProblem": str(exc)}


def _print_status(status: dict[str, Any]) -> None:
    print(f"source:  {status['source']}")
    print(f"ready:   {'yes' if status['ready'] else 'no'} — {status['reason']}")
    if status["applied"]:
        a = status["applied"]
        print(f"applied: {short_revision(a['revision'])} (generation {a['generation']}, {a['time']})")
    last = status["lastAttempt"]
    if last:
        print(f"last:    {short_revision(last['revision'])} {last['result']} at {last['time']} "
              f"({last['durationMs']} ms): {last['message']}")
        for f in last["findings"]:
            print(f"  {f['file']}:{f['line']}: {f['code']} {f['message']}")
            if f.get("fix"):
                print(f"    fix: {f['fix']}")
    for name, services in status["profiles"].items():
        print(f"profile {name}: " + ", ".join(f"{i} → {b}" for i, b in services.items()))
    for name, conn in status.get("connectors", {}).items():
        line = f"connector of {name}: {conn['state']}" + (f" — {conn['message']}" if conn["message"] else "")
        print(line)
        for drift in conn["drift"]:
            print(f"  drift: {drift}")
    _print_checks(status)
    _print_alarms(status)
    print("history:")
    for h in status["history"]:
        revision = short_revision(h["revision"])
        again = f"  ({h['repeats']} times in a row since {h['first']})" if h.get("repeats", 1) > 1 else ""
        print(f"  {h['time']}  {h['result']:9}  {h['reason']:8}  {h['durationMs']:8} ms  {revision}{again}")


def _print_alarms(status: dict[str, Any]) -> None:
    """What needs a person: pricing violations, bindings not set up, a store that cannot be read, refused rows."""
    if status.get("pricingViolations"):
        print(f"pricing violations this month: {status['pricingViolations']} (a connector reported more than its "
              "binding's [pricing] allows; it was charged the reservation; `handler audit --event pricing_violation` "
              "names them)")
    for alert in status.get("notSetUp") or ():
        print(f"not set up: binding {alert['binding']} cannot start, {alert['calls']} calls failed on it (its owners "
              f"were told once): {alert['message']}")
    if status.get("storeProblem"):
        print(f"store: cannot be read now: {status['storeProblem']} (the service's calls that need it answer "
              "unavailable until it can)")
    if status.get("setAside"):
        print(f"rows the store refused this month: {status['setAside']} (each set aside in the audit trail with the "
              f"store's reason, and not counted where it belonged; `handler audit --event {SET_ASIDE}` lists them; "
              "a refused row is a defect: report it)")
