"""`handler explain`, `approvals`, `audit`, `balance`, `spend` and `store`: the governance commands.

Each reads or decides through the governance store of the tree at --root (HANDLER_STORE_URL, else
SQLite in its state folder) and prints. Only `store migrate` and `balance add` make a SQLite store that
is not there yet; the others say there is none and where they looked, and make nothing (a mistyped
HANDLER_STORE_URL made a folder and an empty store, read as "nothing pending"). Registered on the
parser by `reconciler.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from reconciler.cli.common import (
    EXIT_OK,
    add_root_options,
    finite_number,
    load_tree,
    require_tree,
    settle_root,
    tree_store,
)
from reconciler.config import SourceError
from reconciler.governance.auditing import read_audit
from reconciler.governance.decide import usd
from reconciler.governance.errors import NotAllowedError
from reconciler.governance.explain import explain_call
from reconciler.governance.explain import render_text as render_explanation
from reconciler.governance.holds import (
    LISTED_HOLDS,
    Hold,
    decide_hold,
    get_hold,
    listed_holds,
    may_decide,
)
from reconciler.governance.ledger import add_balance, current_month, leased_balance, read_balance, spend_report
from reconciler.governance.notices import list_notices
from reconciler.governance.rulebook import from_micros, to_micros
from reconciler.governance.store import Store, open_store, store_exists, store_url
from reconciler.places import default_state_dir
from reconciler.web.links import LinkSigner, load_link_secret
from reconciler.wire.meta import MOST_USD

__all__ = ["add_governance_commands"]


def _with_root(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--root for a command of the store: the store is $HANDLER_STORE_URL, else $HANDLER_STATE_DIR/handler.db,
    else ROOT/.handler/handler.db (ROOT must be a config root, so no store is made in a stray folder)."""
    add_root_options(p, positional=False)
    return p


def _defaults_of(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """What `parser` would give for no words, its root settled: the action a command takes when none is named."""
    args = parser.parse_args([])
    settle_root(args)
    return args


def add_governance_commands(sub: Any) -> None:
    explain = sub.add_parser("explain", help="what a call would get now: executed, pending or blocked, and why")
    add_root_options(explain)
    explain.add_argument("--profile", required=True, help="the profile making the call")
    explain.add_argument("--tool", required=True, help="the tool called, e.g. ocr_extract")
    explain.add_argument("--cost", type=_cost, metavar="USD", help="the estimated cost (default: the binding's price)")
    explain.add_argument("--instance", default="(any instance)", help="the agent instance, for its per-instance cap "
                         "(default: any)")
    explain.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    explain.set_defaults(run=_explain)
    _add_approvals_commands(sub)
    _add_ledger_commands(sub)


def _add_approvals_commands(sub: Any) -> None:
    approvals = sub.add_parser("approvals", help="list, show, approve or reject held calls")
    asub = approvals.add_subparsers(title="approvals commands (default: list)", metavar="ACTION")
    listing = _with_root(asub.add_parser("list", help="the pending holds (--all: every hold)"))
    listing.add_argument("--all", action="store_true", help="every hold, decided ones too")
    listing.add_argument("--limit", type=_limit, default=LISTED_HOLDS, metavar="N",
                         help=f"list the N oldest (default {LISTED_HOLDS}; 0: all); it says how many it leaves out")
    listing.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    listing.set_defaults(run=_approvals_list)
    # `handler approvals` alone lists the pending holds, with the list command's own defaults.
    approvals.set_defaults(run=lambda args: _approvals_list(_defaults_of(listing)))
    show = _with_root(asub.add_parser("show", help="one hold: the call, its arguments, why it was held"))
    show.add_argument("request_id", help="the hold's request id (approvals list shows them)")
    show.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    show.set_defaults(run=_approvals_show)
    for verb in ("approve", "reject"):
        act = _with_root(asub.add_parser(verb, help=f"{verb} a pending hold as a member of the org"))
        act.add_argument("request_id", help="the hold's request id (approvals list shows them)")
        act.add_argument("--as", dest="member", required=True, metavar="MEMBER", help="who decides: a member of "
                         "config/org.toml the hold may be decided by")
        if verb == "reject":
            act.add_argument("--reason", default=None, metavar="TEXT",
                             help="why: the agent reads it on its next handler_status, and the audit trail keeps it")
        act.set_defaults(run=_approvals_decide, decision=verb)
    link = _with_root(asub.add_parser("link", help="a signed link that lets a member decide a hold in the browser"))
    link.add_argument("request_id", help="the hold's request id (approvals list shows them)")
    link.add_argument("--member", required=True, help="the member the link decides as")
    link.add_argument("--url", default=None, help="the dashboard's address as the member reaches it (default: "
                      "$HANDLER_PUBLIC_URL, else http://127.0.0.1:8765)")
    link.set_defaults(run=_approvals_link)


def _add_ledger_commands(sub: Any) -> None:
    trail = _with_root(sub.add_parser("audit", help="the audit trail of decisions, holds and balance changes"))
    trail.add_argument("--request", metavar="ID", help="only the entries of this request")
    trail.add_argument("--event", metavar="NAME", help="only the entries of this event (set_aside: the rows the store "
                       "refused; pricing_violation: costs reported above the reservation)")
    trail.add_argument("--limit", type=_limit, default=50, help="the newest N entries (default: 50; 0: all)")
    trail.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    trail.set_defaults(run=_audit)

    balance = sub.add_parser("balance", help="the org's prepaid balance")
    bsub = balance.add_subparsers(title="balance commands", metavar="ACTION", required=True)
    _with_root(bsub.add_parser("show", help="the balance now")).set_defaults(run=_balance_show)
    add = _with_root(bsub.add_parser("add", help="top the balance up by USD (negative: correct it down)"))
    add.add_argument("usd", type=_usd_change, help="the amount in USD")
    add.add_argument("--as", dest="member", required=True, metavar="MEMBER", help="the member of config/org.toml "
                     "making the change (recorded in the audit trail)")
    add.set_defaults(run=_balance_add)

    spent = _with_root(sub.add_parser("spend", help="spend per org, profile and instance this month (UTC)"))
    spent.add_argument("--month", metavar="YYYY-MM", type=_month, help="the month (default: this one, UTC)")
    spent.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    spent.set_defaults(run=_spend)

    store = sub.add_parser("store", help="the governance store")
    ssub = store.add_subparsers(title="store commands", metavar="ACTION", required=True)
    _with_root(ssub.add_parser("migrate", help="apply the store's migrations (routers also do at start)")
               ).set_defaults(run=_store_migrate)


def _store(root: str, *, make: bool = False) -> contextlib.AbstractContextManager[Store]:
    return tree_store(root, make=make)


def _open_existing_store(root: str) -> Store | None:
    url = store_url(require_tree(root))
    return open_store(url) if store_exists(url) else None


def _explain(args: argparse.Namespace) -> int:
    snapshot = load_tree(args.root)
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
    for label, text in _hold_story(hold):
        print(f"  {label + ':':10} {text}")


def _utc(t: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else ""


def _hold_story(hold: Hold) -> list[tuple[str, str]]:
    """What became of a hold, line by line: the decision (with its reason), then the run."""
    at = _utc
    lines = []
    if hold.decided_by:
        verb = "rejected" if hold.state == "rejected" else "approved"
        why = f": {hold.decision_reason}" if hold.decision_reason else ""
        lines.append(("decided", f"{verb} by {hold.decided_by} at {at(hold.decided_at)}{why}"))
    if hold.state in ("approved", "running"):
        lines.append(("run", "waiting for a router to run it" if hold.state == "approved" else
                      f"running since {at(hold.claimed_at)} (on {hold.claimed_by}); longer than a call may by default: "
                      "if that router stopped, whether it ran is unknown, and it is not run again"
                      if hold.long_running() else f"running now (on {hold.claimed_by})"))
    elif hold.state == "executed":
        lines.append(("run", f"executed at {at(hold.finished_at)}"))
    elif hold.state == "failed":
        lines.append(("run", f"failed at {at(hold.finished_at)}: {hold.cause or hold.message} (final: never run "
                      "again)"))
        if hold.cause and hold.message and hold.message not in hold.cause:
            lines.append(("agent", f"was told: {hold.message}"))
    return lines


def _approvals_list(args: argparse.Namespace) -> int:
    states = () if args.all else ("pending",)
    with _store(args.root) as store:
        found, total = listed_holds(store, states, args.limit or None)
    if total > len(found):
        print(f"the {len(found)} oldest of {total} {'holds' if args.all else 'pending holds'} are listed; "
              "--limit 0 lists them all", file=sys.stderr)
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
        if notice.state == "unsent":  # its channel is not configured where the hold was stored
            print(f"  notice:    {notice.channel} to {notice.target}: not sent: {notice.error}")
            continue
        print(f"  notice:    {notice.channel} to {notice.target}: {notice.state} after {notice.attempts} "
              f"attempt{'' if notice.attempts == 1 else 's'}{error}")
    print("  arguments:")
    print("    " + json.dumps(dict(hold.arguments), indent=2).replace("\n", "\n    "))
    if hold.result is not None:
        print("  result:")
        print("    " + json.dumps(dict(hold.result), indent=2).replace("\n", "\n    "))
    return EXIT_OK


def _approvals_decide(args: argparse.Namespace) -> int:
    snapshot = load_tree(args.root)

    def check(hold: Hold) -> None:
        refusal = may_decide(hold, snapshot, args.member)
        if refusal is not None:
            raise NotAllowedError(f"{args.member} may not decide {hold.id}: {refusal}")

    with _store(args.root) as store:
        hold = decide_hold(store, args.request_id, args.decision, args.member, check=check,
                           reason=getattr(args, "reason", None))
    # The decision made, not the state read back: a router woken by it may have claimed or run the hold already.
    if args.decision == "approve":
        print(f"{hold.id} approved by {args.member}: a running router runs it now (or the next one that starts).")
    else:
        why = f": {hold.decision_reason}" if hold.decision_reason else " (no reason given: --reason says why)"
        print(f"{hold.id} rejected by {args.member}{why}. The agent reads it on its next handler_status.")
    return EXIT_OK


def _approvals_link(args: argparse.Namespace) -> int:
    snapshot = load_tree(args.root)
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


_MOST_ROWS = 1_000_000_000  # a count a store takes as an integer (one past 64 bits was sent and refused as a write)


def _limit(text: str) -> int:
    value = _whole(text)
    if value is None or not 0 <= value <= _MOST_ROWS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a limit: give a whole number up to {_MOST_ROWS:,} (0: no "
                                         "limit)")
    return value


def _whole(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _month(text: str) -> str:
    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a month: give it as YYYY-MM, e.g. {current_month()}")
    return text


def _usd_change(text: str) -> float:
    said = (f"an amount to add: give USD as a number, not zero, of at most {MOST_USD:,} either way (negative "
            "corrects the balance down)")
    value = finite_number(text, low=-MOST_USD, high=MOST_USD, said=said)
    if to_micros(value) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not {said}")
    return value


def _cost(text: str) -> float:
    return finite_number(text, low=0, high=MOST_USD, said=f"a cost: give USD as a number from 0 to {MOST_USD:,}")


def _change(micros: int) -> str:
    return f"added {usd(micros)}" if micros >= 0 else f"corrected down by {usd(-micros)}"


def _audit(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        rows = read_audit(store, request_id=args.request, event=args.event, limit=args.limit or None)
    if args.format == "json":
        print(json.dumps(rows, indent=2, default=str))
        return EXIT_OK
    if not rows:
        of = " and ".join(filter(None, (f"event {args.event}" if args.event else None,
                                        f"request {args.request}" if args.request else None)))
        print(f"No entries of {of} in the audit trail." if of else "No entries in the audit trail yet.")
    for row in rows:
        at = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(row["at"]))
        who = f" by {row['actor']}" if row["actor"] else ""
        what = " ".join(str(row[k]) for k in ("profile", "tool") if row[k])
        detail = row["detail"] or {}
        counted = f" ({detail['calls']} calls)" if "calls" in detail else ""  # the tally of calls nothing limits
        if row["event"] == "balance" and "added" in detail:
            counted = f" {detail.get('account', '')}: {_change(detail['added'])}, now {usd(detail['balance'])}"
        print(f"{at}  {row['event']:9} {row['request_id'] or '-':25} {what}{who}{counted}  "
              f"{detail.get('reason', '')}".rstrip())
    return EXIT_OK


def _org_name(root: str, member: str | None = None) -> str:
    """The org of the tree at `root`, whose balance it is; `member` must be one of its members."""
    snapshot = load_tree(root)
    if snapshot.org is None:
        raise SourceError(f"{root}/config/org.toml is missing: the balance belongs to the org it names")
    if member is not None and member not in snapshot.org.members:
        known = ", ".join(sorted(snapshot.org.members)) or "none yet"
        raise NotAllowedError(f"'{member}' is not a member of org {snapshot.org.name} in config/org.toml (its members: "
                              f"{known}); give --as the member making the change, as the audit trail records it")
    return snapshot.org.name


def _balance_show(args: argparse.Namespace) -> int:
    account = _org_name(args.root)
    with _store(args.root) as store:
        micros = read_balance(store, account)
        held = leased_balance(store, account)
    print(f"{account}: {usd(micros or 0)} prepaid balance" + ("" if micros is not None else " (never topped up)")
          + _leased_note(held, "more"))
    return EXIT_OK


def _leased_note(held: dict[str, int], word: str) -> str:
    """What budget leases hold, as `balance show` and `spend` add it to a figure."""
    notes = []
    if held["leased"]:
        notes.append(f"{usd(held['leased'])} {word} is leased to routers and not settled yet")
    if held["stale"]:
        notes.append(f"{usd(held['stale'])} {word} is held by leases of routers that stopped, counted as spent "
                     "until they are reconciled")
    return f" ({'; '.join(notes)})" if notes else ""


def _balance_add(args: argparse.Namespace) -> int:
    account = _org_name(args.root, args.member)
    with _store(args.root, make=True) as store:
        micros = add_balance(store, account, to_micros(args.usd), args.member)
    print(f"{account}: balance now {usd(micros)} ({_change(to_micros(args.usd))} by {args.member})")
    return EXIT_OK


def _spend(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        rows = spend_report(store, args.month)
    if args.format == "json":
        print(json.dumps([{**r, "usd": from_micros(r["micros"]), "leased_usd": from_micros(r["leased"]),
                           "stale_usd": from_micros(r["stale"])} for r in rows], indent=2))
        return EXIT_OK
    if not rows:
        print(f"No spend in {args.month or current_month()}.")
    for row in rows:
        print(f"{row['month']}  {row['scope']:50} {usd(row['micros'])}{_leased_note(row, 'of it')}")
    return EXIT_OK


def _store_migrate(args: argparse.Namespace) -> int:
    with _store(args.root, make=True) as store:
        revision = store.migrate()
        print(f"{store.url}: schema at revision {revision}")
    return EXIT_OK
