"""The event loop's commit of the backlog on PostgreSQL: what one flush costs the router. Prints; asserts none.

A busy router commits its backlog twenty times a second (`store.committing`), each time the tally rows of its
agent runs and the spend sums of their scopes. This times that commit, on the router's own loop (uvloop), as the
CPU of this process per commit and the wall time of one, in the same run:

- shipped: `PostgresCommitter.flush`, one statement with the rows as two JSON parameters (one round trip);
- baseline: the same rows as a transaction of COPY and a multi-row upsert (BEGIN, COPY, its end, the upsert,
  COMMIT: five round trips), as the loop committed them before.

Each flush holds `--runs` tally rows and the spend sums of their scopes (the org, the profile, each run), as
8 sessions of 8 agent runs leave.

Run: .venv/bin/python benchmarks/commit.py [--flushes N] [--runs N] [--pg URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.pgschema import pg_schema
from reconciler.governance.ledger import current_month
from reconciler.governance.store import open_store
from reconciler.governance.store.audit import COPY_AUDIT, AuditRow
from reconciler.governance.store.backlog import Backlog, spend_statements
from reconciler.governance.store.committing import PostgresCommitter
from reconciler.governance.store.engine import Store

Flush = Callable[[Backlog], Awaitable[object]]


def fill(backlog: Backlog, runs: int) -> None:
    """One flush's worth: a tally row per agent run, and its charge on the org, the profile and the run."""
    month = current_month()
    rows: list[AuditRow] = [(time.time(), "settled", None, "tester", f"run-{n}", "echo_say", None, "executed",
             '{"reason":"auto: permissive","cost":1000,"binding":"echo-local","calls":31,"reserved":31000,'
             f'"charged":31000,"first":{time.time()!r}}}') for n in range(runs)]
    backlog.add_rows(rows, [(("org", "profile:tester", f"instance:tester/run-{n}"), month, 31000) for n in range(runs)])


def baseline(store: Store) -> tuple[Flush, Callable[[], Awaitable[None]]]:
    """The transaction of COPY and upsert, on an async connection of its own."""
    conn: list[psycopg.AsyncConnection[tuple[object, ...]]] = []

    async def flush(backlog: Backlog) -> None:
        taken = backlog.take_plain()
        assert taken is not None
        if not conn:
            conn.append(await psycopg.AsyncConnection.connect(store.driver_dsn))
        async with conn[0].transaction(), conn[0].cursor() as cursor:
            async with cursor.copy(COPY_AUDIT) as copy:
                for row in taken.audit:
                    await copy.write_row(row)
            for statement, parameters in spend_statements("%s", taken.spend):
                await cursor.execute(statement, parameters)

    async def close() -> None:
        for c in conn:
            await c.close()

    return flush, close


async def timed(flush: Flush, runs: int, flushes: int) -> tuple[float, float]:
    """µs of this process's CPU per flush, and the p50 µs of one flush's wall time."""
    backlog = Backlog()
    for _ in range(20):  # connected, statements prepared
        fill(backlog, runs)
        await flush(backlog)
    walls = []
    cpu = time.process_time()
    for _ in range(flushes):
        fill(backlog, runs)
        started = time.perf_counter()
        await flush(backlog)
        walls.append(time.perf_counter() - started)
    return (time.process_time() - cpu) / flushes * 1e6, statistics.median(walls) * 1e6


async def measure(url: str, runs: int, flushes: int, rounds: int) -> None:
    store = open_store(url)
    shipped = PostgresCommitter(store)
    old, close = baseline(store)
    lines: dict[str, list[tuple[float, float]]] = {"shipped": [], "baseline": []}
    try:
        for _ in range(rounds):  # the two take turns, so a slow spell of the host falls on both
            lines["shipped"].append(await timed(shipped.flush, runs, flushes))
            lines["baseline"].append(await timed(old, runs, flushes))
    finally:
        await shipped.aclose()
        await close()
        store.close()
    print(f"One flush of {runs} tally rows and {runs + 2} spend sums, {flushes} flushes a round, {rounds} rounds "
          "(medians of the rounds):")
    figures = {}
    labels = {"shipped": "shipped: one statement", "baseline": "baseline: COPY + upsert in a transaction"}
    for name, label in labels.items():
        cpu, wall = (statistics.median(f[i] for f in lines[name]) for i in (0, 1))
        figures[name] = cpu
        print(f"  {label:<44} {cpu:7.0f} µs CPU per flush   p50 {wall:7.0f} µs wall")
    print(f"  the baseline costs the router {figures['baseline'] / figures['shipped']:.1f}x the CPU a flush; at 20 "
          f"flushes a second that is {20 * (figures['baseline'] - figures['shipped']) / 1e4:.2f}% of a CPU")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flushes", type=int, default=300)
    parser.add_argument("--runs", type=int, default=8, help="agent runs a flush counts (default 8)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test")
    args = parser.parse_args()
    with pg_schema(args.pg) as url:
        if url is not None:
            uvloop.run(measure(url, args.runs, args.flushes, args.rounds))


if __name__ == "__main__":
    main()
