"""PostgreSQL LISTEN for hold decisions, so a router runs a hold approved elsewhere at once.

A daemon thread holds one psycopg connection listening on the channel `HOLD_CHANNEL_SQL` names (its
schema's) and calls `wake()` on every notification, and once each time it starts listening (what was
decided while it was not is found then). While it listens (`connected`) the hold runner polls only
now and then, in case a notification is lost; a dropped connection is made again a second later, and
until then the runner polls at its own pace. SQLite has no such channel: routers on SQLite poll.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import psycopg

from reconciler.governance.store.engine import HOLD_CHANNEL_SQL, Store

__all__ = ["HoldListener"]


class HoldListener:
    def __init__(self, store: Store, wake: Callable[[], object]) -> None:
        self._dsn = store.driver_dsn
        self._wake = wake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="handler-listen", daemon=True)
        self.connected = False  # listening now: every decision is heard at once

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    (channel,) = conn.execute(f"SELECT {HOLD_CHANNEL_SQL}").fetchone() or ("",)
                    conn.execute(f"LISTEN {channel}")  # a letter, then md5's hex: a plain name
                    self.connected = True
                    self._wake()
                    while not self._stop.is_set():
                        for _ in conn.notifies(timeout=0.5):
                            self._wake()
            except psycopg.Error:
                # The poll keeps holds moving; try the connection again shortly.
                self.connected = False
                self._stop.wait(1.0)
        self.connected = False

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(RuntimeError):
            self._thread.join(timeout=5.0)
