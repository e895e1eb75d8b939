"""What the router keeps of agent runs across its restarts (docs/agents.md, "Runs across a restart").

The runs a router starts are its processes and end with it; the agents that started them may not (a host's session
goes on through a restart, `lifeline`). `RunJournal` writes one line when a run starts and one when it ends to
`<state folder>/runs/journal.jsonl` (0600), and the next router reads the last line of each run back: who ran what,
for whom, and how it ended. A run whose last line says it was running never ended: its router was killed. The journal
keeps no run's input or result, as the call log keeps no payload: a result lives in the memory of the router that
ran it. Reading the journal rewrites it with what is kept (the latest `kept` runs), so it does not grow for ever;
a line cut short by a crash is skipped.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from reconciler.places import ensure_private_dir, open_private_file

__all__ = ["RECORDED", "RunJournal"]

RECORDED: Final = ("run", "agent", "status", "error", "starter", "parent", "profileOfStarter", "started", "ended")


class RunJournal:
    """The journal of one state folder's runs."""

    def __init__(self, path: Path, kept: int) -> None:
        self.path = path
        self.kept = kept

    def recorded(self) -> list[dict[str, Any]]:
        """The last record of each run the journal holds, the `kept` latest started, oldest first; the journal is
        rewritten with just those."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return []
        last: dict[str, dict[str, Any]] = {}
        for line in data.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                record = orjson.loads(line)
                if isinstance(record, dict) and isinstance(record.get("run"), str):
                    last[record["run"]] = record
        records = sorted(last.values(), key=_started)[-self.kept:]
        self._rewrite(records)
        return records

    def write(self, record: Mapping[str, Any]) -> None:
        """Append one run's record (its fields of `RECORDED`)."""
        ensure_private_dir(self.path.parent)
        line = orjson.dumps({key: record.get(key) for key in RECORDED}, option=orjson.OPT_APPEND_NEWLINE)
        with os.fdopen(open_private_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "wb") as out:
            out.write(line)  # one write of one line, appended whole

    def _rewrite(self, records: list[dict[str, Any]]) -> None:
        fresh = self.path.with_name(self.path.name + ".new")
        with os.fdopen(open_private_file(fresh, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as out:
            out.write(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records))
            out.flush()
            os.fsync(out.fileno())
        fresh.replace(self.path)


def _started(record: Mapping[str, Any]) -> float:
    started = record.get("started")
    return float(started) if isinstance(started, int | float) and not isinstance(started, bool) else 0.0
