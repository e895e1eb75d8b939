"""Fixtures of the router's tests: an echo config tree and a run folder, both in short temp folders."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from fixtures.harness import short_dir

SECRET = "tok-7Hq2-never-in-logs"  # noqa: S105 - a test token that must never reach a log


@pytest.fixture(autouse=True)
def echo_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(TOKEN_ENV, SECRET)
    return SECRET


@pytest.fixture
def echo_root() -> Iterator[Path]:
    with short_dir() as root:
        yield write_echo_tree(root / "t")


@pytest.fixture
def run_dir() -> Iterator[Path]:
    with short_dir() as path:
        yield path
