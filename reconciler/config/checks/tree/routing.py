"""Where a routing sends holds exists: a member of org.toml, or a Slack channel it allow-lists.

Called by `profiles` for a profile's `routing` (P004, P005) and by `org` for a policy's `approver` (O003).
"""

from __future__ import annotations

from collections.abc import Iterator

from reconciler.config.findings import Finding, suggest
from reconciler.config.lines import KeyPath
from reconciler.config.models import Routing
from reconciler.config.snapshot import Snapshot

__all__ = ["check_routing"]


def check_routing(snapshot: Snapshot, file: str, at: KeyPath, routing: Routing) -> Iterator[Finding]:
    """`routing`, written at `at` in `file`, names a known member or an allow-listed channel."""
    org = snapshot.org
    members = org.members if org else {}
    channels = org.slack.channels if org else []
    by_profile = file.startswith("config/profiles/")
    if routing.to == "member" and routing.member not in members:
        hint = suggest(routing.member or "", members, none="(no members)")
        yield Finding(
            "P004" if by_profile else "O003",
            file,
            snapshot.line_of(file, *at, "member"),
            f"routing names member '{routing.member}', who is not in org.toml{hint.did_you_mean}",
            hint.one_of,
            f"add [members.{routing.member}] to org.toml",
        )
    if routing.to == "slack" and routing.channel not in channels:
        hint = suggest(routing.channel or "", channels, none="(none)", among="one of org.toml [slack] channels")
        yield Finding(
            "P005" if by_profile else "O003",
            file,
            snapshot.line_of(file, *at, "channel"),
            f"routing names Slack channel '{routing.channel}', which is not allow-listed{hint.did_you_mean}",
            hint.one_of,
            f'add "{routing.channel}" to [slack] channels in org.toml',
        )
