"""`/metrics`: what one `handler up` serves and holds, in Prometheus' text format (docs/router.md, "Metrics").

Read at each scrape, never kept twice: the router's counts of ended calls (its call log's tally, flushed first so a
scrape sees every call that has ended), the service's status (the generation applied, readiness, each binding's
connector process, what the preflight found) and, with a governance store, what the store holds (pending holds,
this month's spend per scope, pricing violations and rows set aside). Several routers sharing one PostgreSQL each
report the same store figures: sum their call counters, not those.

The store is read on a worker thread, as the dashboard's pages read it. Its labels name profiles, bindings and spend,
so a scraper sends `HANDLER_DASHBOARD_TOKEN` as a bearer token (Prometheus' `authorization` setting), or a member
signed in to the dashboard reads it (`http.build_app`).
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from reconciler.governance.auditing import pricing_violations_this_month, set_aside_this_month
from reconciler.governance.errors import StoreError
from reconciler.governance.holds import count_holds
from reconciler.governance.ledger import spend_report
from reconciler.governance.rulebook import from_micros
from reconciler.governance.store import Store

__all__ = ["CONTENT_TYPE_LATEST", "CallCounts", "MetricsSources", "bearer_allowed", "render_metrics"]

log = logging.getLogger("handler.http")


class CallCounts(Protocol):
    """The router's tally of ended calls (`router.tally.CallTally`)."""

    @property
    def buckets(self) -> Sequence[float]: ...  # the durations' upper bounds, in seconds

    @property
    def calls(self) -> Mapping[tuple[str, str, str, str, str], int]: ...  # (profile, interface, tool, outcome, error)

    @property
    def durations(self) -> Mapping[str, tuple[Sequence[int], float]]: ...  # interface -> (per bucket, +Inf last; sum)


@dataclass(frozen=True, slots=True)
class MetricsSources:
    """Where a scrape reads: the status document, the call tally (None before the router starts), the store."""

    status: Callable[[], Mapping[str, Any]]
    calls: Callable[[], CallCounts | None]
    store: Store | None = None


@dataclass(frozen=True, slots=True)
class _StoreFigures:
    pending: int
    set_aside: int
    violations: int
    spend: list[tuple[str, int]]  # (scope, micro-USD counted this month)


def bearer_allowed(token: str, authorization: str | None) -> bool:
    """Whether a request carries `token` as its bearer token (`Authorization: Bearer <token>`)."""
    scheme, _, given = (authorization or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


async def render_metrics(sources: MetricsSources) -> bytes:
    """The page's body: every metric, read now. A store that cannot be read (down, its lock held past the
    timeout) leaves its figures out and says so in `handler_store_up`, so the page still serves the rest."""
    calls = sources.calls()
    status = sources.status()
    figures: _StoreFigures | StoreError | None = None
    if sources.store is not None:
        try:
            figures = await asyncio.to_thread(_read_store, sources.store)
        except StoreError as exc:
            log.warning("/metrics: the store's figures are left out: %s", exc)
            figures = exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Figures(calls, status, figures))
    return generate_latest(registry)


def _read_store(store: Store) -> _StoreFigures:
    spend = [(row["scope"], int(row["micros"])) for row in spend_report(store)]
    return _StoreFigures(count_holds(store), set_aside_this_month(store),
                         pricing_violations_this_month(store), spend)


class _Figures(Collector):
    """One scrape's figures, as metric families."""

    def __init__(self, calls: CallCounts | None, status: Mapping[str, Any],
                 store: _StoreFigures | StoreError | None) -> None:
        self._calls, self._status, self._store = calls, status, store

    def collect(self) -> Iterator[Metric]:
        yield from self._call_metrics()
        yield from self._status_metrics()
        yield from self._store_metrics()

    def _call_metrics(self) -> Iterator[Metric]:
        calls = CounterMetricFamily("handler_calls", "Tool calls ended since the router started, by how they ended",
                                    labels=["profile", "interface", "tool", "outcome", "error"])
        durations = HistogramMetricFamily("handler_call_duration_seconds", "How long tool calls took in the router, "
                                          "from the request read to the reply", labels=["interface"])
        if self._calls is not None:
            for key, count in sorted(self._calls.calls.items()):
                calls.add_metric(list(key), count)
            bounds = [*(repr(b) for b in self._calls.buckets), "+Inf"]
            for interface, (counts, total) in sorted(self._calls.durations.items()):
                running, cumulative = 0, []
                for bound, count in zip(bounds, counts, strict=True):
                    running += count
                    cumulative.append((bound, running))
                durations.add_metric([interface], cumulative, total)
        yield calls
        yield durations

    def _status_metrics(self) -> Iterator[Metric]:
        status = self._status
        yield GaugeMetricFamily("handler_ready", "1 when the service serves a valid revision of the config tree",
                                value=1 if status.get("ready") else 0)
        applied = status.get("applied") or {}
        yield GaugeMetricFamily("handler_generation", "The generation of the config tree the router serves",
                                value=applied.get("generation", 0))
        last = status.get("lastAttempt") or {}
        yield GaugeMetricFamily("handler_last_attempt_ok", "1 when the last revision tried was applied or changed "
                                "nothing, 0 when it was refused or failed (the last good one serves on)",
                                value=1 if last.get("result", "applied") in ("applied", "unchanged") else 0)
        connectors = GaugeMetricFamily("handler_connector_state", "Each binding's connector process: 1 for the "
                                       "state it is in", labels=["binding", "state"])
        for binding, connector in sorted((status.get("connectors") or {}).items()):
            connectors.add_metric([binding, connector.get("state", "")], 1)
        yield connectors
        problems = GaugeMetricFamily("handler_preflight_problems", "What `handler doctor` finds on this machine, "
                                     "by level", labels=["level"])
        levels = Counter(problem.get("level") for problem in status.get("preflight") or [])
        for level in ("error", "warning"):
            problems.add_metric([level], levels.get(level, 0))
        yield problems

    def _store_metrics(self) -> Iterator[Metric]:
        store = self._store
        if store is None:  # no governance store: nothing to say of one
            return
        up = "1 when this scrape read the governance store, 0 when it could not (the router's log says why)"
        if isinstance(store, StoreError):
            yield GaugeMetricFamily("handler_store_up", up, value=0)
            return
        yield GaugeMetricFamily("handler_store_up", up, value=1)
        yield GaugeMetricFamily("handler_holds_pending", "Held calls waiting for a decision (the whole store)",
                                value=store.pending)
        yield GaugeMetricFamily("handler_set_aside_this_month", "Rows the store refused this month (UTC), each set "
                                "aside in the audit trail: a defect to report", value=store.set_aside)
        yield GaugeMetricFamily("handler_pricing_violations_this_month", "Calls this month (UTC) whose connector "
                                "reported more than its binding's pricing allows", value=store.violations)
        spend = GaugeMetricFamily("handler_spend_usd", "Spend counted against each scope's caps this month (UTC), "
                                  "running calls and budget leases included", labels=["scope"])
        for scope, micros in store.spend:
            spend.add_metric([scope], from_micros(micros))
        yield spend
