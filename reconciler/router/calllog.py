"""One JSON line per call, appended to `$HANDLER_STATE_DIR/calls.jsonl` (design §6).

A line holds who called what and how it ended — time, profile, instance, interface, tool, binding,
outcome, error code, cause, duration, cost — and never arguments, results or secrets: the record
has no field that could hold them. For an output that broke the schema it names the field and the
schema keyword, never the value. Lines are written with one `write(2)` on an `O_APPEND` file, so
lines from concurrent calls never interleave.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

__all__ = ["CallLog", "CallRecord"]


@dataclass(slots=True)
class CallRecord:
    """What the log keeps of one call, filled in as the call travels the pipeline."""

    profile: str
    instance: str
    interface: str
    tool: str
    binding: str | None
    generation: int
    started: float  # time.perf_counter() at step 2
    outcome: str = "executed"  # executed | error | pending | blocked | refused | cancelled
    error: str | None = None  # the interface error code, or the JSON-RPC reason for a refusal
    cause: str | None = None  # why the router made it `unavailable`
    field: str | None = None  # where an output broke the schema (a path, never a value)
    keyword: str | None = None  # which schema rule it broke
    cost: float | None = None
    request_id: str | None = None  # a hold's id, so the log and the store can be joined

    def to_line(self) -> bytes:
        record: dict[str, Any] = {
            "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
            "profile": self.profile,
            "instance": self.instance,
            "interface": self.interface,
            "tool": self.tool,
            "binding": self.binding,
            "outcome": self.outcome,
            "error": self.error,
            "duration_ms": round((time.perf_counter() - self.started) * 1000, 3),
            "cost": self.cost,
            "generation": self.generation,
        }
        for key in ("cause", "field", "keyword", "request_id"):
            value = getattr(self, key)
            if value is not None:
                record[key] = value
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


class CallLog:
    """The append-only call log; `path=None` keeps no log (benchmarks of the bare pipeline)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._fd = -1
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def write(self, record: CallRecord) -> None:
        if self._fd >= 0:
            os.write(self._fd, record.to_line())

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
