"""`handler token create | list | revoke`: the bearer tokens of the MCP endpoints over HTTP.

A token is printed once, when made, its last line the token alone (so `| tail -1` takes it); the store keeps only
its SHA-256 (`governance/tokens.py`). The store is the tree's (HANDLER_STORE_URL, else SQLite in its state
folder), the one the service reads; `create` makes it when it is not there yet, as the service would. Registered on
the parser by `reconciler.cli`.
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import time
from typing import Any

from reconciler.cli.common import EXIT_OK, add_root_options, load_tree, tree_store
from reconciler.config import HandlerError
from reconciler.governance.errors import TokenError
from reconciler.governance.store import Store
from reconciler.governance.tokens import TokenRecord, create_token, list_tokens, parse_duration, revoke_token

__all__ = ["add_token_commands"]

_DEFAULT_EXPIRY = "90d"


def add_token_commands(sub: Any) -> None:
    token = sub.add_parser("token", help="bearer tokens of the MCP endpoints over HTTP (/mcp/PROFILE)")
    tsub = token.add_subparsers(title="token commands", metavar="ACTION", required=True)
    create = tsub.add_parser("create", help="make a token of a profile; it is printed once, on the last line")
    create.add_argument("profile", help="the profile the token acts as (config/profiles/PROFILE.toml)")
    create.add_argument("--name", default=None, help="what `token list` and the audit trail call it, and what "
                        "`token revoke` takes (default: PROFILE-<6 hex digits>)")
    create.add_argument("--instance", default=None, metavar="NAME", help="the agent run its calls are logged and "
                        "capped under (default: none; the caller's own _meta then names it, as on the unix sockets)")
    create.add_argument("--expires", type=_duration, default=parse_duration(_DEFAULT_EXPIRY), metavar="DURATION",
                        help=f"how long it is valid: 90m, 12h, 30d, 2w, or never (default: {_DEFAULT_EXPIRY})")
    add_root_options(create, positional=False)
    create.set_defaults(run=_create)
    listing = tsub.add_parser("list", help="every token: its name, profile, instance, maker and expiry (never its "
                              "text)")
    listing.add_argument("--format", choices=["text", "json"], default="text", help="text for people, json for tools")
    add_root_options(listing, positional=False)
    listing.set_defaults(run=_list)
    revoke = tsub.add_parser("revoke", help="delete a token: a running service refuses it within a second")
    revoke.add_argument("name", help="the token's name (token list shows them)")
    add_root_options(revoke, positional=False)
    revoke.set_defaults(run=_revoke)


def _duration(text: str) -> float | None:
    try:
        return parse_duration(text)
    except TokenError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _store(root: str, *, make: bool = False) -> contextlib.AbstractContextManager[Store]:
    return tree_store(root, make=make, missing="no token was made there (`handler token create` makes the store)")


def _create(args: argparse.Namespace) -> int:
    snapshot = load_tree(args.root)
    if args.profile not in snapshot.profiles:
        known = ", ".join(sorted(snapshot.profiles)) or "none"
        raise HandlerError(f"no profile '{args.profile}' in {args.root} (profiles: {known})")
    with _store(args.root, make=True) as store:
        issued = create_token(store, args.profile, name=args.name, instance=args.instance, expires_in=args.expires,
                              actor=_actor())
    record = issued.record
    instance = f", instance {record.instance}" if record.instance else ""
    print(f"Token {record.name!r} of profile {record.profile}{instance}, {_expiry(record)}.")
    print("It is shown this once (the store keeps only its hash): send it as the header "
          "`Authorization: Bearer <token>`; `handler token revoke " + record.name + "` ends it.")
    print(issued.token)
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        records = list_tokens(store)
    if args.format == "json":
        print(json.dumps([{"name": r.name, "profile": r.profile, "instance": r.instance, "createdAt": r.created_at,
                           "createdBy": r.created_by, "expiresAt": r.expires_at,
                           "expired": r.expired(time.time())} for r in records], indent=2))
        return EXIT_OK
    if not records:
        print("No tokens. `handler token create PROFILE` makes one.")
    for r in records:
        instance = f" instance {r.instance}" if r.instance else ""
        print(f"{r.name:24} {r.profile}{instance}  made {_utc(r.created_at)} by {r.created_by}, {_expiry(r)}")
    return EXIT_OK


def _revoke(args: argparse.Namespace) -> int:
    with _store(args.root) as store:
        record = revoke_token(store, args.name, _actor())
    print(f"Revoked token {record.name!r} of profile {record.profile}: a running service refuses it within a second.")
    return EXIT_OK


def _actor() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no name for this uid (a container's)
        return f"uid {os.getuid()}"


def _expiry(record: TokenRecord) -> str:
    if record.expires_at is None:
        return "never expires"
    said = "expired" if record.expired(time.time()) else "expires"
    return f"{said} {_utc(record.expires_at)}"


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(at))
