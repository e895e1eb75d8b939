"""The keeper's transactions of a busy budget lease: what one costs the store thread. Prints; asserts none.

A router whose profile is capped admits its calls against budget leases; its keeper brings them in line with the
store a few times a second under load (`governance.leases.sync`: it takes more for a busy lease and moves `issued`
ahead of the calls). This drives one lease as 8 sessions at `--rate` calls a second would (each tick of 0.1 s the
calls take and settle their price, then the keeper syncs), and prints the CPU of this thread per sync that wrote,
in the same run as its floor:

- shipped: `sync`, on the store as the router opens it;
- floor: an empty write transaction on the same store (`BEGIN IMMEDIATE` and `COMMIT` on SQLite).

On SQLite (a file in a temporary folder) and on PostgreSQL (a schema of its own, dropped after; `--pg ''` leaves it
out). Run it on another tree to compare the code: the figures follow that tree's `reconciler`.

Run: .venv/bin/python benchmarks/leases.py [--ticks N] [--rate N] [--pg URL]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.pgschema import pg_schema
from reconciler.governance.leases import LeaseBook, LeaseTerms, Waiter, sync
from reconciler.governance.ledger import current_month
from reconciler.governance.rulebook import CapSet
from reconciler.governance.store import open_store
from reconciler.governance.store.engine import Store

PRICE = 1000  # micros a call
CAPS = CapSet("bench-org", None, 10**15, None, False, False, "profiles/tester.toml")  # the profile capped


def busy_lease(store: Store, ticks: int, rate: int) -> tuple[float, int, int]:
    """ms of this thread's CPU per sync that wrote, how many wrote, how many ran."""
    book = LeaseBook("router-bench", LeaseTerms())
    needs = book.needs(CAPS, "tester", "run-1", current_month())
    first = Waiter(needs, PRICE)
    sync(store, book, [first])
    assert first.held is not None, "the first sync did not take a lease"
    spent, wrote = 0.0, 0
    for _ in range(ticks):
        for _ in range(rate // 10):
            held = book.take(needs, PRICE)
            if held is None:  # the lease ran short between ticks: the call waits for a sync, as in the router
                waiter = Waiter(needs, PRICE)
                sync(store, book, [waiter])
                held = waiter.held
                assert held is not None, "a sync did not cover a waiting call"
            book.settle(held, PRICE, PRICE)
        book.tick(0.1)
        before = time.thread_time()
        if sync(store, book, []):
            spent += time.thread_time() - before
            wrote += 1
    sync(store, book, [], closing=True)
    return spent / max(wrote, 1) * 1e3, wrote, ticks


def empty_transactions(store: Store, count: int = 300) -> float:
    """ms of this thread's CPU per empty write transaction."""
    for _ in range(20):
        with store.begin():
            pass
    before = time.thread_time()
    for _ in range(count):
        with store.begin():
            pass
    return (time.thread_time() - before) / count * 1e3


def report(name: str, store: Store, args: argparse.Namespace) -> None:
    floor = empty_transactions(store)
    per_sync, wrote, ran = busy_lease(store, args.ticks, args.rate)
    print(f"  {name:<11} a sync that wrote {per_sync:6.2f} ms of CPU ({wrote} of {ran} ticks wrote); an empty write "
          f"transaction {floor:5.2f} ms: {per_sync / floor:4.1f}x the floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ticks", type=int, default=400, help="keeper ticks of 0.1 s (default 400)")
    parser.add_argument("--rate", type=int, default=8000, help="calls a second on the lease (default 8,000)")
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test",
                        help="the PostgreSQL server for its line ('' to leave it out)")
    args = parser.parse_args()
    print(f"a busy lease at {args.rate:,} calls a second, {args.ticks} keeper ticks of 0.1 s; CPU of this thread:")
    with tempfile.TemporaryDirectory() as folder:
        store = open_store(f"sqlite:///{folder}/handler.db")
        try:
            report("SQLite", store, args)
        finally:
            store.close()
    if args.pg:
        pg_line(args)


def pg_line(args: argparse.Namespace) -> None:
    with pg_schema(args.pg) as url:
        if url is None:
            return
        store = open_store(url)
        try:
            report("PostgreSQL", store, args)
        finally:
            store.close()


if __name__ == "__main__":
    main()
