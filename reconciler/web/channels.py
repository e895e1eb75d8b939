"""The approval channels of `handler up`, configured from the environment: the dashboard's desk and the notifier.

- `HANDLER_PUBLIC_URL`: the listener's address as approvers reach it, for links and Slack's Details
  button (default: the listener's own); its host is also one the listener answers to (`guards`);
- `HANDLER_LINK_SECRET`: the key of signed decision links (default: one made in the state folder);
- `HANDLER_DASHBOARD_TOKEN`: the bearer token machines read `/status` and `/metrics` with (the pages need a
  signed-in member); the listener needs it to listen beyond loopback (`http.ListenerSettings`);
- `HANDLER_SMTP_URL`, `HANDLER_MAIL_FROM`: the email channel (see `mail`);
- `HANDLER_SLACK_TOKEN`, `HANDLER_SLACK_SIGNING_SECRET`, `HANDLER_SLACK_API_URL`: Slack (see `slack`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reconciler.config.snapshot import Snapshot
from reconciler.gitops.proposals import Proposer
from reconciler.governance.notices import Reach
from reconciler.governance.store import Store
from reconciler.web.desk import Desk
from reconciler.web.links import ENDED_SESSIONS, LinkSigner, SpentTokens, load_link_secret
from reconciler.web.mail import MailSettings
from reconciler.web.notifier import Notifier
from reconciler.web.slack import SlackClient, SlackSettings

__all__ = ["Channels", "open_channels"]

log = logging.getLogger("handler.notify")


@dataclass
class Channels:
    desk: Desk
    notifier: Notifier

    def set_public_url(self, host: str, port: int) -> None:
        """The listener's address, once it is known (a port of 0 is chosen at bind time), unless
        HANDLER_PUBLIC_URL gave one. A wildcard address is no place to send approvers: the machine's
        name stands in for it, with a warning."""
        if self.notifier.public_url:
            return
        if host in ("0.0.0.0", "::", ""):  # noqa: S104 - recognised here, never bound
            name = socket.getfqdn()
            log.warning("links in notices point at http://%s:%d; set HANDLER_PUBLIC_URL to the address approvers "
                        "reach the dashboard at", name, port)
            host = name
        elif ":" in host:
            host = f"[{host}]"
        self.notifier.public_url = f"http://{host}:{port}"

    def reach(self) -> Reach:
        """What a hold stored here is announced on, and where owners decide (the agent's pending message)."""
        return Reach(self.notifier.missing, self.notifier.public_url or None)

    async def aclose(self) -> None:
        if self.desk.slack_client is not None:
            await self.desk.slack_client.aclose()


def open_channels(store: Store, snapshot: Callable[[], Snapshot | None], state_dir: Path,
                  env: Mapping[str, str], listing: Callable[[], Mapping[str, Any] | None] | None = None,
                  proposer: Proposer | None = None) -> Channels:
    """Raises `MailError` for a `HANDLER_SMTP_URL` that cannot be used, before anything starts. `proposer` is
    where the dashboard's config edits go (None: its config pages only show)."""
    signer = LinkSigner(load_link_secret(state_dir, env))
    slack = SlackSettings.from_env(env)
    client = SlackClient(slack) if slack.token or slack.signing_secret else None
    desk = Desk(store, snapshot, signer, slack, client, proposer=proposer, used_sign_ins=SpentTokens(state_dir),
                ended_sessions=SpentTokens(state_dir, ENDED_SESSIONS), call_log=state_dir / "calls.jsonl")
    if listing is not None:
        desk.listing = listing
    notifier = Notifier(store, signer, env.get("HANDLER_PUBLIC_URL", "").strip().rstrip("/"),
                        MailSettings.from_env(env), client if slack.token else None)
    desk.on_decision = notifier.wake
    return Channels(desk, notifier)
