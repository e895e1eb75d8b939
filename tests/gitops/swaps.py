"""A stand-in for the router's side of the reconcile seam, recording what went live."""

from __future__ import annotations

from reconciler.config import Snapshot


class Swaps:
    """The router's side of the seam, recorded: which snapshots went live, as which generation."""

    def __init__(self) -> None:
        self.live: list[Snapshot] = []

    async def __call__(self, snapshot: Snapshot) -> int:
        self.live.append(snapshot)
        return len(self.live)
