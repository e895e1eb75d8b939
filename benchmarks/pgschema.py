"""A fresh PostgreSQL schema for a benchmark's store, dropped after: the scripts' PostgreSQL lines share it."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["for_store", "pg_schema"]


@contextlib.contextmanager
def pg_schema(url: str | None) -> Iterator[str | None]:
    """A fresh schema on the PostgreSQL server at `url` and the store URL using it; None when unreachable."""
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
        yield url + ("&" if "?" in url else "?") + f"options=-csearch_path%3D{name}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")


def for_store(url: str) -> str:
    """`url` as `open_store` takes it: SQLAlchemy's psycopg driver named (`handler serve` does this itself)."""
    return url.replace("postgresql://", "postgresql+psycopg://", 1)
