"""The compiled rulebooks of the latest snapshots, shared by the gate and the hold runner.

Every admission needs its snapshot's `Rulebook`; compiling one walks the whole config, so it is
compiled on first use and kept for the latest few snapshots. Entries are keyed by the snapshot's
revision and hold only a weak reference to the snapshot they were compiled from: a hit needs that
very snapshot object, so a snapshot loaded again (or another one of the same revision) is compiled
afresh, one that was freed can never be mistaken for a new one, and the cache keeps none alive.
"""

from __future__ import annotations

import threading
import weakref

from reconciler.config.snapshot import Snapshot
from reconciler.governance.rulebook import Rulebook, compile_rulebook

__all__ = ["RulebookCache"]


class RulebookCache:
    """Snapshot → its compiled `Rulebook`, for the latest `keep` revisions; safe to use from any thread."""

    def __init__(self, keep: int = 4) -> None:
        self._keep = keep
        self._books: dict[str, tuple[weakref.ref[Snapshot], Rulebook]] = {}
        self._lock = threading.Lock()

    def rulebook(self, snapshot: Snapshot) -> Rulebook:
        """The snapshot's rulebook, compiled on first use."""
        found = self._books.get(snapshot.revision)
        if found is not None and found[0]() is snapshot:
            return found[1]
        with self._lock:
            found = self._books.get(snapshot.revision)
            if found is not None and found[0]() is snapshot:  # another thread compiled it meanwhile
                return found[1]
            book = compile_rulebook(snapshot)
            self._books.pop(snapshot.revision, None)
            while len(self._books) >= self._keep:
                self._books.pop(next(iter(self._books)))  # the oldest
            self._books[snapshot.revision] = (weakref.ref(snapshot), book)
        return book
