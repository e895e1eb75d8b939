"""The counts of ended calls that `/metrics` exposes (docs/router.md, "Metrics"): per profile, interface, tool,
outcome and error code, and each interface's durations in buckets.

`CallLog` adds its records here when it writes a batch, off the call's path: about half a microsecond of the
router's CPU a call, beside the several its log line takes. Every label comes from the config tree (a profile, an
interface version, a tool it serves, a closed error code, the router's own causes), never from what a client says: a
call of a tool the session does not serve is counted under `UNKNOWN_TOOL`, so a client naming a million tools adds
one series, not a million. Agent run ids are never a label, for the same reason.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from typing import Protocol

__all__ = ["DURATION_BUCKETS", "UNKNOWN_TOOL", "CallTally", "Ended"]

# Upper bounds, in seconds, of the duration buckets (Prometheus' `le`), from a fast local call to the longest
# timeout an interface declares; the last bucket, +Inf, is implied.
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                    60.0, 120.0, 300.0)
UNKNOWN_TOOL = "(unknown)"  # the tool label of a call naming a tool its session does not serve

CallKey = tuple[str, str, str, str, str]  # profile, interface, tool, outcome, error ("" for none)


class Ended(Protocol):
    """What the tally reads of an ended call (`calllog.CallRecord`)."""

    profile: str
    interface: str
    tool: str
    outcome: str
    error: str | None
    started: float
    ended: float


class CallTally:
    """Calls counted since the router started, and their durations per interface. Read and written on the event
    loop only (the log's batches and the metrics page both run there)."""

    buckets = DURATION_BUCKETS

    def __init__(self) -> None:
        self.calls: dict[CallKey, int] = {}
        self._counts: dict[str, list[int]] = {}  # interface -> calls per bucket, the last one past every bound
        self._seconds: dict[str, float] = {}  # interface -> their seconds in all

    @property
    def durations(self) -> dict[str, tuple[list[int], float]]:
        """interface -> (calls per bucket, the last one past every bound; their seconds in all)."""
        return {interface: (list(counts), self._seconds[interface]) for interface, counts in self._counts.items()}

    def add(self, records: Iterable[Ended]) -> None:
        """Count ended calls (a batch of the call log): about half a microsecond a call, in one loop."""
        calls, counts, seconds, bounds, bucket = self.calls, self._counts, self._seconds, DURATION_BUCKETS, bisect_left
        for r in records:
            # A call refused is one of a tool its session does not serve: its name is the client's word, not a label.
            key = (r.profile, r.interface, UNKNOWN_TOOL if r.outcome == "refused" else r.tool, r.outcome, r.error or "")
            calls[key] = calls.get(key, 0) + 1
            took = r.ended - r.started
            into = counts.get(r.interface)
            if into is None:
                into = counts[r.interface] = [0] * (len(bounds) + 1)
                seconds[r.interface] = 0.0
            into[bucket(bounds, took)] += 1
            seconds[r.interface] += took
