"""Governance fixtures: the store on SQLite and on PostgreSQL.

PostgreSQL tests use the server at 127.0.0.1:5432 (database `test`, trust auth); each test gets a
schema of its own, named at random and dropped after, so parallel runs never see each other.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from reconciler.governance.store import Store, open_store

PG_ADMIN = os.environ.get("HANDLER_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

def _pg_available() -> bool:
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def pg_admin() -> str:
    if not _pg_available():
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL is not reachable at {PG_ADMIN}; .ci/run should have started it")
        pytest.skip(f"PostgreSQL is not reachable at {PG_ADMIN}")
    return PG_ADMIN


@pytest.fixture
def pg_url(pg_admin: str) -> Iterator[str]:
    """A fresh schema in the test database, as a store URL; dropped after the test."""
    schema = "gov_" + secrets.token_hex(6)
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    base = pg_admin.replace("postgresql://", "postgresql+psycopg://", 1)
    yield f"{base}?options=-csearch_path%3D{schema}"
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state' / 'handler.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store URL of each backend in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'state' / 'handler.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    opened = open_store(store_url)
    yield opened
    opened.close()


@pytest.fixture
def sqlite_store(sqlite_url: str) -> Iterator[Store]:
    opened = open_store(sqlite_url)
    yield opened
    opened.close()

