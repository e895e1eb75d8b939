"""What the dashboard's pages read, decide and edit with: one `Desk`, made by `channels.open_channels`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reconciler.config.snapshot import Snapshot
from reconciler.gitops.proposals import Proposer
from reconciler.governance.store import Store
from reconciler.web.links import ENDED_SESSIONS, LinkSigner, SpentTokens, session_token
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
    on_decision: Callable[[], None] | None = None  # the notifier, to show the decision in Slack at once
    listing: Callable[[], Mapping[str, Any] | None] = lambda: None  # the tree's catalog/listing.json, when read
    proposer: Proposer | None = None  # where the edit forms' changes go (None: the pages only show the config)
    used_sign_ins: SpentTokens = field(default_factory=lambda: SpentTokens(None))  # owners' one-time links
    ended_sessions: SpentTokens = field(default_factory=lambda: SpentTokens(None, ENDED_SESSIONS))  # signed out
    call_log: Path | None = None  # the router's calls.jsonl, which the calls page reads the end of

    def member_session(self, value: str) -> str | None:
        """The member a member session's cookie signs in; None when absent, forged, expired or signed out."""
        return None if self._ended(value) else self.signer.session_member(value)

    def owner_session(self, value: str) -> str | None:
        """The member an owner session's cookie signs in; None when absent, forged, expired or signed out."""
        return None if self._ended(value) else self.signer.owner_member(value)

    def end_session(self, value: str) -> None:
        """Sign a session out for good: its cookie, or any copy of it, signs nobody in again."""
        token = session_token(value)
        if token is not None and (self.signer.session_member(value) or self.signer.owner_member(value)):
            self.ended_sessions.use(*token)

    def _ended(self, value: str) -> bool:
        token = session_token(value)
        return token is not None and self.ended_sessions.spent(token[0])
