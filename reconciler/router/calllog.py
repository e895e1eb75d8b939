"""One JSON line per call, appended to `$HANDLER_STATE_DIR/calls.jsonl` (docs/architecture.md §6).

A line holds who called what and how it ended — time, profile, instance, interface, tool, binding, outcome,
error code, cause, duration, cost — and never arguments, results or secrets: the record has no field that
could hold them. For an output that broke the schema it names the field and the schema keyword, never the
value. Finished records are queued and written together — serialized then, off the call's path — in one
`write(2)` of whole lines on an `O_APPEND` file at most `FLUSH_SECONDS` after the call, so lines never
interleave and a busy router makes one system call for many calls; each batch is counted then for the metrics
(`tally`). The log is never rotated here: an operator's `logrotate` (or `mv`) may move it away at any time,
and the next batch goes to a new `calls.jsonl` (the file at the path is checked before each batch, as
`logging.handlers.WatchedFileHandler` does), so no line is written into a file moved aside. A batch that
cannot be written (a full disk, the folder removed) waits for the next one, up to `MOST_UNWRITTEN` bytes (past
that the oldest lines go, counted); the router's log says so once, and again when writing resumes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from reconciler.places import ensure_private_dir, open_private_file
from reconciler.router.tally import CallTally

__all__ = ["FLUSH_SECONDS", "MOST_UNWRITTEN", "CallLog", "CallRecord"]

log = logging.getLogger("handler.router")

# Lines are written in batches: at most this long after the call, or at once past 256 queued.
# A router that dies loses at most this window of log lines (never a call: the log is not the store).
FLUSH_SECONDS = 0.05
_FLUSH_RECORDS = 256
MOST_UNWRITTEN = 4 << 20  # bytes of lines kept while the file cannot be written


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
    ended: float = 0.0  # time.perf_counter() when the call ended
    wall: float = 0.0  # time.time() when the call ended

    def end(self) -> None:
        self.ended, self.wall = time.perf_counter(), time.time()

    def to_line(self) -> bytes:
        """The log line of an ended record (`CallLog.write` ends it)."""
        record: dict[str, Any] = {
            "time": _utc(self.wall),
            "profile": self.profile,
            "instance": self.instance,
            "interface": self.interface,
            "tool": self.tool,
            "binding": self.binding,
            "outcome": self.outcome,
            "error": self.error,
            "duration_ms": round((self.ended - self.started) * 1000, 3),
            "cost": self.cost,
            "generation": self.generation,
        }
        if self.cause is not None:
            record["cause"] = self.cause
        if self.field is not None:
            record["field"] = self.field
            record["keyword"] = self.keyword
        if self.request_id is not None:
            record["request_id"] = self.request_id
        return orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE)


_second: list[Any] = [-1, ""]  # the last whole second formatted, reused within it


def _utc(now: float) -> str:
    """ISO 8601 UTC with microseconds, e.g. 2026-01-02T03:04:05.123456Z; formats a new second once."""
    whole = int(now)
    if whole != _second[0]:
        _second[0], _second[1] = whole, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
    return f"{_second[1]}.{int((now - whole) * 1_000_000):06d}Z"


class CallLog:
    """The append-only call log; `path=None` keeps no log (benchmarks of the bare pipeline)."""

    def __init__(self, path: Path | None, flush_seconds: float = FLUSH_SECONDS) -> None:
        self.path = path
        self.flush_seconds = flush_seconds
        self.tally = CallTally()  # what /metrics counts, added a batch at a time
        self._fd = -1
        self._queue: list[CallRecord] = []
        self._timer: asyncio.TimerHandle | None = None
        self._unwritten = b""  # what a failed write left (from mid-line when one was partly written), written next
        self._lost = 0  # lines dropped while writing failed (0 and `_failing` False: none)
        self._failing = False
        if path is not None:
            ensure_private_dir(path.parent, "HANDLER_STATE_DIR")
            self._fd = open_private_file(path)

    def write(self, record: CallRecord) -> None:
        """Queue the call's line; it reaches the file within `flush_seconds` (one write for many calls)."""
        if self._fd < 0:
            return
        record.end()
        self._queue.append(record)
        if len(self._queue) >= _FLUSH_RECORDS or self.flush_seconds <= 0:
            self.flush()
        elif self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.flush_seconds, self.flush)
            except RuntimeError:  # no loop (a synchronous caller): write at once
                self.flush()

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._queue and self._fd >= 0:
            records, self._queue = self._queue, []
            self.tally.add(records)
            self._write(self._unwritten + b"".join(record.to_line() for record in records))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        try:
            self._follow_path()
            while view:  # whole lines, O_APPEND: never interleaved with another writer
                view = view[os.write(self._fd, view):]
        except OSError as exc:
            self._keep(bytes(view), exc)
            return
        self._unwritten = b""
        if self._failing:
            self._failing = False
            log.warning("the call log %s is written again%s", self.path,
                        f"; {self._lost} lines were lost meanwhile" if self._lost else "")
            self._lost = 0

    def _keep(self, unwritten: bytes, exc: OSError) -> None:
        """What a failed write left, kept for the next (its oldest whole lines dropped past `MOST_UNWRITTEN`)."""
        if not self._failing:
            log.warning("cannot write the call log %s (%s): its lines wait, at most %d MiB of them", self.path,
                        exc.strerror or exc, MOST_UNWRITTEN >> 20)
            self._failing = True
        if len(unwritten) > MOST_UNWRITTEN:
            cut = unwritten.find(b"\n", len(unwritten) - MOST_UNWRITTEN) + 1
            self._lost += unwritten.count(b"\n", 0, cut)
            unwritten = unwritten[cut:]
        self._unwritten = unwritten

    def _follow_path(self) -> None:
        """Write to the file now at the path: a fresh one when the last was moved or removed (rotated)."""
        assert self.path is not None  # noqa: S101 - a log with a file has a path
        try:
            now = self.path.stat()
        except FileNotFoundError:
            now = None
        held = os.fstat(self._fd)
        if now is None or (now.st_dev, now.st_ino) != (held.st_dev, held.st_ino):
            fd = open_private_file(self.path)
            os.close(self._fd)
            self._fd = fd

    def close(self) -> None:
        self.flush()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
