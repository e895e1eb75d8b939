"""A fresh PostgreSQL schema for a benchmark's store, dropped after: the scripts' PostgreSQL lines share it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from reconciler.governance.store import store_url

__all__ = ["pg_schema"]


@contextlib.contextmanager
def pg_schema(url: str | None) -> Iterator[str | None]:
    """A fresh schema on the PostgreSQL server at `url` and the store URL using it, as `store_url` reads it from
    `HANDLER_STORE_URL` (for `open_store`, and for `handler serve` as its environment); None when unreachable."""
    if not url:
        yield None
        return
    import psycopg

    name = "bench_" + os.urandom(4).hex()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
    except psycopg.Error as exc:
        print(f"(PostgreSQL lines skipped: {exc})")
        yield None
        return
    try:
        scoped = url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{name}"
        yield store_url(env={"HANDLER_STORE_URL": scoped})
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
