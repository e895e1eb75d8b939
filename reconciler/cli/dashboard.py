"""`handler dashboard login`: a one-time link that signs a member of the org in to the dashboard (an owner, to edit
the config too).

The link is signed with the service's link key (`$HANDLER_LINK_SECRET`, else `link.key` in its state
folder), so it is made on the service's machine by someone who may read that folder; it is good for a
few minutes and once (`reconciler.web.links`, `reconciler.web.owners`). Registered on the parser by
`reconciler.cli`.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from reconciler.cli.common import EXIT_OK, add_root_options, folder_path, is_tree, load_tree
from reconciler.config import SourceError
from reconciler.governance.errors import NotAllowedError
from reconciler.liveness import ask_service, holder_of
from reconciler.places import default_state_dir
from reconciler.web.links import OWNER_HOURS, SIGN_IN_MINUTES, LinkSigner, load_link_secret

__all__ = ["add_dashboard_commands"]

_DEFAULT_URL = "http://127.0.0.1:8765"


def add_dashboard_commands(sub: Any) -> None:
    dashboard = sub.add_parser("dashboard", help="sign in to the dashboard")
    dsub = dashboard.add_subparsers(title="dashboard commands", metavar="ACTION", required=True)
    login = dsub.add_parser(
        "login", help="print a one-time link that signs a member in to the dashboard (an owner: to edit the config)",
        description=f"Prints a link that signs MEMBER, a member of the org (config/org.toml), in to the dashboard for "
                    f"{OWNER_HOURS} hours: to read held calls, spend and status and decide the holds routed to them; "
                    "an owner (owner = true) may also add bindings and choose each profile's bindings. The link "
                    f"works once, within {SIGN_IN_MINUTES} minutes. Run it on the service's machine: it signs with "
                    "the service's link key.")
    login.add_argument("--member", required=True, help="the member to sign in (a member of config/org.toml)")
    login.add_argument("--url", default=None, help="the dashboard's address as the owner reaches it (default: "
                       f"$HANDLER_PUBLIC_URL, else the running service's, else {_DEFAULT_URL})")
    login.add_argument("--state-dir", type=folder_path, default=None, help="the service's state folder (default: "
                       "$HANDLER_STATE_DIR, else ROOT/.handler), where its link key is")
    add_root_options(login, positional=False)
    login.set_defaults(run=_login)


def _login(args: argparse.Namespace) -> int:
    state = args.state_dir or default_state_dir(Path(args.root))
    _check_member(args.member, args.root, state)
    if not os.environ.get("HANDLER_LINK_SECRET") and not (state / "link.key").is_file():
        raise SourceError(f"no service keeps its link key in {state} (no link.key there): run this where the "
                          "service runs, with --state-dir or HANDLER_STATE_DIR naming its state folder")
    signer = LinkSigner(load_link_secret(state))
    print(signer.sign_in_url(_base_url(args.url, state), args.member))
    print(f"open it within {SIGN_IN_MINUTES} minutes; it works once and signs {args.member} in for {OWNER_HOURS} "
          "hours", file=sys.stderr)
    return EXIT_OK


def _check_member(member: str, root: str, state: Path) -> None:
    """Refuse a name that is no member of the tree at `root` (or, for a git source, the revision the service
    exported to its state folder); the dashboard asks its live config again when the link is opened."""
    tree = next((str(t) for t in (Path(root), state / "tree") if is_tree(str(t))), None)
    if tree is None:
        return
    org = load_tree(tree).org
    members = sorted(org.members) if org else []
    if member not in members:
        named = f"members: {', '.join(members)}" if members else "it names none: add [members.NAME]"
        raise NotAllowedError(f"{member} is not a member in {tree}/config/org.toml ({named}); only a member may sign "
                              "in to the dashboard")


def _base_url(given: str | None, state: Path) -> str:
    """Where the owner reaches the dashboard."""
    if given or os.environ.get("HANDLER_PUBLIC_URL"):
        return str(given or os.environ["HANDLER_PUBLIC_URL"])
    holder = holder_of(state)
    status = ask_service(holder) if holder is not None else None
    running = (status or {}).get("running") or {}
    return str(running.get("http") or _DEFAULT_URL)
