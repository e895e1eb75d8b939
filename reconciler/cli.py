"""The `handler` command: argument parsing and printing only; the work happens in the rooms.

Exit codes: 0 success, 1 findings (or a failed check), 2 unusable arguments (a missing folder, an
unknown git ref). Subcommands of other distributions' parts (the conformance runner) register
through the `handler.commands` entry-point group, so this module never imports them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from reconciler.app import UpOptions
from reconciler.app import serve as serve_router
from reconciler.app import up as run_service
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
from reconciler.gitops.reconciling import Reconciler
from reconciler.gitops.status import read_status
from reconciler.governance.auditing import read_audit
from reconciler.governance.decide import usd
from reconciler.governance.errors import NotAllowedError
from reconciler.governance.explain import explain_call
from reconciler.governance.explain import render_text as render_explanation
from reconciler.governance.holds import Hold, decide_hold, get_hold, list_holds, may_decide
from reconciler.governance.ledger import add_balance, current_month, read_balance, spend_report
from reconciler.governance.notices import list_notices
from reconciler.governance.rulebook import from_micros, to_micros
from reconciler.governance.store import Store, open_store, store_exists, store_url
from reconciler.places import default_run_dir, default_state_dir
from reconciler.router.server import Router
from reconciler.web.http import HttpListener
from reconciler.web.links import LinkSigner, load_link_secret

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

    mcp = sub.add_parser("mcp-config", help="the mcpServers entries an MCP client needs to give an agent its profile")
    mcp.add_argument("profile")
    mcp.add_argument("root", nargs="?", default=".")
    mcp.add_argument("--run-dir", type=Path, default=None, help="the router's run folder (default: $HANDLER_RUN_DIR, "
                     "else $XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    mcp.set_defaults(run=_mcp_config)

    _add_governance_commands(sub)
    _add_serve_command(sub)
    _add_up_commands(sub)

    for ep in entry_points(group="handler.commands"):
        ep.load()(sub)
    return parser


def _add_up_commands(sub: Any) -> None:
    up = sub.add_parser("up", help="run the service: follow the config tree (or a git ref) and serve its profiles")
    up.add_argument("root", nargs="?", default=".", help="the config root (worktree) or a repository git can "
                    "fetch, a path or a URL (git); default: .")
    up.add_argument("--source", choices=["worktree", "git"], default="worktree")
    up.add_argument("--ref", default="main", help="the branch to follow with --source git (default: main)")
    up.add_argument("--interval", type=float, default=30.0, help="seconds between fetches with --source git")
    up.add_argument("--http", default="127.0.0.1:8765", metavar="HOST:PORT",
                    help="the dashboard, /healthz, /status, /hooks/git, /hooks/slack")
    up.add_argument("--no-sandbox", action="store_true", help=_NO_SANDBOX)
    up.add_argument("--run-dir", type=Path, help="where the profiles' sockets go (default: $HANDLER_RUN_DIR)")
    up.add_argument("--state-dir", type=Path, help="status.json, the call log, the git mirror (default: "
                    "$HANDLER_STATE_DIR, else ROOT/.handler)")
    up.set_defaults(run=_up)

    status = sub.add_parser("status", help="what the running (or last) service applied, attempted and serves")
    status.add_argument("root", nargs="?", default=".")
    status.add_argument("--state-dir", type=Path)
    status.add_argument("--format", choices=["text", "json"], default="text")
    status.set_defaults(run=_status)


def _up(args: argparse.Namespace) -> int:
    host, _, port = args.http.rpartition(":")
    if not host or not port.isdigit():
        raise SourceError(f"--http {args.http!r} is not HOST:PORT, e.g. 127.0.0.1:8765")
    if args.source == "worktree" and not Path(args.root, "config").is_dir():
        raise SourceError(f"{args.root} holds no config/; give the root of a config tree, or --source git")
    secret = os.environ.get("HANDLER_WEBHOOK_SECRET", "").encode() or None
    options = UpOptions(root=args.root, source=args.source, ref=args.ref, interval=args.interval,
                        run_dir=args.run_dir, state_dir=args.state_dir, http_host=host, http_port=int(port),
                        webhook_secret=secret, sandbox=not args.no_sandbox)

    def ready(router: Router, reconciler: Reconciler, listener: HttpListener) -> None:
        applied = reconciler.status.applied
        sockets = router.run_dir / "profiles"
        print(f"handler up: {reconciler.status.source}", file=sys.stderr)
        if applied is not None:
            print(f"  serving revision {applied.revision[:12]} as generation {applied.generation}", file=sys.stderr)
        for name in sorted(router.live.snapshot.profiles):
            print(f"  profile {name}: {sockets / name}.sock", file=sys.stderr)
        print(f"  http://{host}:{listener.port}/  the dashboard: status, approvals, catalog (also /status, /healthz, "
              "POST /hooks/git, POST /hooks/slack)", file=sys.stderr)
        print("  an agent's MCP client runs: handler-service <interface> --profile <profile>, with "
              f"HANDLER_RUN_DIR={router.run_dir}", file=sys.stderr)
        print("  Ctrl-C stops everything.", file=sys.stderr, flush=True)

    return run_service(options, on_ready=ready)


def _status(args: argparse.Namespace) -> int:
    state = args.state_dir or default_state_dir(Path(args.root))
    status = read_status(state / "status.json")
    if status is None:
        print(f"handler status: no status in {state}; has `handler up` run on this tree?", file=sys.stderr)
        return EXIT_FINDINGS
    if args.format == "json":
        print(json.dumps(status, indent=2))
        return EXIT_OK
    print(f"source:  {status['source']}")
    print(f"ready:   {'yes' if status['ready'] else 'no'} — {status['reason']}")
    if status["applied"]:
        a = status["applied"]
        print(f"applied: {a['revision']} (generation {a['generation']}, {a['time']})")
    last = status["lastAttempt"]
    if last:
        print(f"last:    {last['revision']} {last['result']} at {last['time']} ({last['durationMs']} ms): "
              f"{last['message']}")
        for f in last["findings"]:
            print(f"  {f['file']}:{f['line']}: {f['code']} {f['message']}")
    for name, services in status["profiles"].items():
        print(f"profile {name}: " + ", ".join(f"{i} → {b}" for i, b in services.items()))
    for name, conn in status.get("connectors", {}).items():
        line = f"connector of {name}: {conn['state']}" + (f" — {conn['message']}" if conn["message"] else "")
        print(line)
        for drift in conn["drift"]:
            print(f"  drift: {drift}")
    print("history:")
    for h in status["history"]:
        print(f"  {h['time']}  {h['result']:9}  {h['reason']:8}  {h['durationMs']:8} ms  {h['revision']}")
    return EXIT_OK if status["ready"] else EXIT_FINDINGS


_NO_SANDBOX = ("run connectors without their own network namespace (where this machine gives none); "
               "they then reach any host, with no egress allow-list; warns once")


def _add_serve_command(sub: Any) -> None:
    serve = sub.add_parser("serve", help="serve each profile's tools on its unix socket until stopped (SIGHUP reloads)")
    serve.add_argument("root", nargs="?", default=".", help="the config root; default: .")
    serve.add_argument("--run-dir", type=Path, help="where the profiles' sockets go (default: $HANDLER_RUN_DIR, else "
                       "$XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    serve.add_argument("--state-dir", type=Path, help="the call log and connector logs (default: $HANDLER_STATE_DIR, "
                       "else ROOT/.handler)")
    serve.add_argument("--no-sandbox", action="store_true", help=_NO_SANDBOX)
    serve.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    head = _load(args.root)
    if head.errors:
        _print_findings(list(head.findings), "text", head)
        print("handler serve: not starting; the router serves only a tree without errors", file=sys.stderr)
        return EXIT_FINDINGS
    for finding in head.findings:
        print(finding.render_text(), file=sys.stderr)

    def ready(router: Router) -> None:
        profiles = ", ".join(sorted(router.live.snapshot.profiles)) or "no profiles"
        sockets = router.run_dir / "profiles"
        print(f"handler serve: revision {head.revision[:12]}: {profiles} on {sockets}/<profile>.sock",
              file=sys.stderr, flush=True)

    return serve_router(head, root=Path(args.root), run_dir=args.run_dir, state_dir=args.state_dir, on_ready=ready,
                        sandbox=not args.no_sandbox)


def _load(root: str) -> Snapshot:
    if not Path(root, "config").is_dir() and not Path(root, "catalog").is_dir():
        raise SourceError(f"{root} holds neither config/ nor catalog/; give the root of a config tree")
    return Loader().load(FolderSource(root))


def _mcp_config(args: argparse.Namespace) -> int:
    """One stdio server per interface of the profile, each the bridge `handler-service <interface>`."""
    snapshot = _load(args.root)
    profile = snapshot.profiles.get(args.profile)
    if profile is None:
        known = ", ".join(sorted(snapshot.profiles))
        raise HandlerError(f"no profile '{args.profile}' in {args.root} (profiles: {known})")
    bridge = Path(sys.executable).parent / "handler-service"
    run_dir = (args.run_dir or default_run_dir()).resolve()
    servers = {}
    for name in sorted(profile.selections):
        servers[name] = {"command": str(bridge) if bridge.exists() else "handler-service",
                         "args": [name, "--profile", profile.name], "env": {"HANDLER_RUN_DIR": str(run_dir)}}
    print(json.dumps({"mcpServers": servers}, indent=2))
    return EXIT_OK


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


# --- governance: explain, approvals, audit, balance, spend, store ----------------------------------


def _add_governance_commands(sub: Any) -> None:
    def with_root(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--root", default=".", help="the config root; the store is $HANDLER_STORE_URL, else "
                                                 "$HANDLER_STATE_DIR/handler.db, else ROOT/.handler/handler.db")
        return p

    explain = sub.add_parser("explain", help="what a call would get now: executed, pending or blocked, and why")
    explain.add_argument("root", nargs="?", default=".")
    explain.add_argument("--profile", required=True)
    explain.add_argument("--tool", required=True)
    explain.add_argument("--cost", type=float, metavar="USD", help="the estimated cost (default: the binding's price)")
    explain.add_argument("--instance", default="(any instance)")
    explain.add_argument("--format", choices=["text", "json"], default="text")
    explain.set_defaults(run=_explain)

    approvals = sub.add_parser("approvals", help="list, show, approve or reject held calls")
    asub = approvals.add_subparsers(title="approvals commands", metavar="ACTION", required=True)
    listing = with_root(asub.add_parser("list", help="the pending holds (--all: every hold)"))
    listing.add_argument("--all", action="store_true")
    listing.add_argument("--format", choices=["text", "json"], default="text")
    listing.set_defaults(run=_approvals_list)
    show = with_root(asub.add_parser("show", help="one hold: the call, its arguments, why it was held"))
    show.add_argument("request_id")
    show.add_argument("--format", choices=["text", "json"], default="text")
    show.set_defaults(run=_approvals_show)
    for verb in ("approve", "reject"):
        act = with_root(asub.add_parser(verb, help=f"{verb} a pending hold as a member of the org"))
        act.add_argument("request_id")
        act.add_argument("--as", dest="member", required=True, metavar="MEMBER")
        act.set_defaults(run=_approvals_decide, decision=verb)
    link = with_root(asub.add_parser("link", help="a signed link that lets a member decide a hold in the browser"))
    link.add_argument("request_id")
    link.add_argument("--member", required=True, help="the member the link decides as")
    link.add_argument("--url", default=None, help="the dashboard's address as the member reaches it (default: "
                      "$HANDLER_PUBLIC_URL, else http://127.0.0.1:8765)")
    link.set_defaults(run=_approvals_link)

    trail = with_root(sub.add_parser("audit", help="the audit trail of decisions, holds and balance changes"))
    trail.add_argument("--request", metavar="ID")
    trail.add_argument("--limit", type=int, default=50)
    trail.add_argument("--format", choices=["text", "json"], default="text")
    trail.set_defaults(run=_audit)

    balance = sub.add_parser("balance", help="the org's prepaid balance")
    bsub = balance.add_subparsers(title="balance commands", metavar="ACTION", required=True)
    with_root(bsub.add_parser("show", help="the balance now")).set_defaults(run=_balance_show)
    add = with_root(bsub.add_parser("add", help="top the balance up by USD (negative: correct it down)"))
    add.add_argument("usd", type=float)
    add.add_argument("--as", dest="member", required=True, metavar="MEMBER")
    add.set_defaults(run=_balance_add)

    spent = with_root(sub.add_parser("spend", help="spend per org, profile and instance this month (UTC)"))
    spent.add_argument("--month", metavar="YYYY-MM")
    spent.add_argument("--format", choices=["text", "json"], default="text")
    spent.set_defaults(run=_spend)

    store = sub.add_parser("store", help="the governance store")
    ssub = store.add_subparsers(title="store commands", metavar="ACTION", required=True)
    with_root(ssub.add_parser("migrate", help="apply the store's migrations (routers also do at start)")
              ).set_defaults(run=_store_migrate)


@contextlib.contextmanager
def _store(root: str) -> Iterator[Store]:
    """The store of the tree at `root` (HANDLER_STORE_URL, else SQLite in its state folder), closed after."""
    store = open_store(store_url(root))
    try:
        yield store
    finally:
        store.close()


def _open_existing_store(root: str) -> Store | None:
    url = store_url(root)
    return open_store(url) if store_exists(url) else None


def _explain(args: argparse.Namespace) -> int:
    snapshot = _load(args.root)
    store = _open_existing_store(args.root)
    try:
        decision = explain_call(snapshot, args.profile, args.tool, cost_usd=args.cost, instance=args.instance,
                                store=store)
    finally:
        if store is not None:
            store.close()
    if args.format == "json":
        print(json.dumps(decision.to_dict(), indent=2))
    else:
        print(render_explanation(decision, args.profile, args.tool))
    return EXIT_OK


def _print_hold(hold: Hold) -> None:
    print(f"{hold.id}  {hold.state}  {hold.profile}/{hold.instance}  {hold.tool} on {hold.binding}  "
          f"est. {usd(hold.cost)}")
    print(f"  held:      {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(hold.created_at))} at revision "
          f"{hold.revision}")
    print(f"  why:       {hold.reason}")
    approver = hold.approver or {}
    whom = approver.get("member") or approver.get("channel") or approver.get("members") or approver.get("to")
    print(f"  approver:  {whom or 'any member'}")
    if hold.decided_by:
        print(f"  decided:   by {hold.decided_by}")
    if hold.message:
        print(f"  message:   {hold.message}")


def _approvals_list(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        found = list_holds(store, states=() if args.all else ("pending",))
    if args.format == "json":
        print(json.dumps([h.to_dict() for h in found], indent=2, default=str))
        return EXIT_OK
    if not found:
        print("No holds." if args.all else "No pending holds.")
    for hold in found:
        print(f"{hold.id}  {hold.state:8}  {hold.profile}  {hold.tool}  est. {usd(hold.cost)}  {hold.reason}")
    return EXIT_OK


def _approvals_show(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        hold = get_hold(store, args.request_id)
        told = list_notices(store, hold.id)
    if args.format == "json":
        print(json.dumps({**hold.to_dict(), "notices": [dataclasses.asdict(n) for n in told]}, indent=2,
                         default=str))
        return EXIT_OK
    _print_hold(hold)
    for notice in told:
        error = f" ({notice.error})" if notice.error else ""
        print(f"  notice:    {notice.channel} to {notice.target}: {notice.state} after {notice.attempts} "
              f"attempt{'' if notice.attempts == 1 else 's'}{error}")
    print("  arguments:")
    print("    " + json.dumps(dict(hold.arguments), indent=2).replace("\n", "\n    "))
    if hold.result is not None:
        print("  result:")
        print("    " + json.dumps(dict(hold.result), indent=2).replace("\n", "\n    "))
    return EXIT_OK


def _approvals_decide(args: argparse.Namespace) -> int:
    snapshot = _load(args.root)

    def check(hold: Hold) -> None:
        refusal = may_decide(hold, snapshot, args.member)
        if refusal is not None:
            raise NotAllowedError(f"{args.member} may not decide {hold.id}: {refusal}")

    with _store(args.root) as store:
        hold = decide_hold(store, args.request_id, args.decision, args.member, check=check)
    if hold.state == "approved":
        print(f"{hold.id} approved by {args.member}: a running router runs it now (or the next one that starts).")
    else:
        print(f"{hold.id} rejected by {args.member}: the agent reads 'rejected' on its next handler_status.")
    return EXIT_OK


def _approvals_link(args: argparse.Namespace) -> int:
    snapshot = _load(args.root)
    with _store(args.root) as store:
        hold = get_hold(store, args.request_id)
    refusal = may_decide(hold, snapshot, args.member)
    if refusal is not None:
        raise NotAllowedError(f"{args.member} may not decide {hold.id}: {refusal}")
    if hold.state != "pending":
        raise NotAllowedError(f"hold {hold.id} was already decided: it is {hold.state}")
    signer = LinkSigner(load_link_secret(default_state_dir(Path(args.root))))
    base = args.url or os.environ.get("HANDLER_PUBLIC_URL") or "http://127.0.0.1:8765"
    print(signer.url(base, hold.id, args.member))
    return EXIT_OK


def _audit(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        rows = read_audit(store, request_id=args.request, limit=args.limit)
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    for row in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["at"]))
        who = f" by {row['actor']}" if row["actor"] else ""
        what = " ".join(str(row[k]) for k in ("profile", "tool") if row[k])
        detail = row["detail"] or {}
        print(f"{at}  {row['event']:9} {row['request_id'] or '-':25} {what}{who}  {detail.get('reason', '')}".rstrip())
    return EXIT_OK


def _org_name(root: str) -> str:
    snapshot = _load(root)
    if snapshot.org is None:
        raise SourceError(f"{root}/config/org.toml is missing: the balance belongs to the org it names")
    return snapshot.org.name


def _balance_show(args: argparse.Namespace) -> int:
    account = _org_name(args.root)
    with _store(args.root) as store:
        micros = read_balance(store, account)
    print(f"{account}: {usd(micros or 0)} prepaid balance" + ("" if micros is not None else " (never topped up)"))
    return EXIT_OK


def _balance_add(args: argparse.Namespace) -> int:
    account = _org_name(args.root)
    with _store(args.root) as store:
        micros = add_balance(store, account, to_micros(args.usd), args.member)
    print(f"{account}: balance now {usd(micros)} (added {usd(to_micros(args.usd))} by {args.member})")
    return EXIT_OK


def _spend(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        rows = spend_report(store, args.month)
    if args.format == "json":
        print(json.dumps([{**r, "usd": from_micros(r["micros"])} for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print(f"No spend in {args.month or current_month()}.")
    for row in rows:
        print(f"{row['month']}  {row['scope']:50} {usd(row['micros'])}")
    return EXIT_OK


def _store_migrate(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        revision = store.migrate()
        print(f"{store.url}: schema at revision {revision}")
    return EXIT_OK
