"""The hostile router the security suites attack: one `handler serve` per mode and module, as root and as nobody."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.fixtures.hostile.routers import MODES, HostileRouter, hostile_router


@pytest.fixture(scope="module", params=MODES)
def router(request: pytest.FixtureRequest) -> Iterator[HostileRouter]:
    if request.param == "user" and os.geteuid() != 0:
        pytest.skip("the unprivileged run drops from root to nobody; this run is not root")
    with hostile_router(request.param) as running:
        yield running
