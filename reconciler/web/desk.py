"""What the dashboard's pages read, decide and edit with: one `Desk`, made by `channels.open_channels`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from reconciler.config.snapshot import Snapshot
from reconciler.gitops.proposals import Proposer
from reconciler.governance.store import Store
from reconciler.web.links import LinkSigner, UsedSignIns
from reconciler.web.slack import SlackClient, SlackSettings

__all__ = ["Desk"]


@dataclass
class Desk:
    """What the dashboard reads and decides with."""

    store: Store
    snapshot: Callable[[], Snapshot | None]  # the live one
    signer: LinkSigner
    slack: SlackSettings
    slack_client: SlackClient | None = None  # answers clicks through their response_url
    token: str | None = None  # HANDLER_DASHBOARD_TOKEN
    on_decision: Callable[[], None] | None = None  # the notifier, to show the decision in Slack at once
    listing: Callable[[], Mapping[str, Any] | None] = lambda: None  # the tree's catalog/listing.json, when read
    proposer: Proposer | None = None  # where the edit forms' changes go (None: the pages only show the config)
    used_sign_ins: UsedSignIns = field(default_factory=lambda: UsedSignIns(None))  # owners' one-time links
