"""What the reconciler reports: the applied revision, the last attempt, readiness and a short history.

One `Status` is kept in memory by the reconciler, served at `/status`, printed by `handler status`
and written atomically to `status.json` in the state folder after every attempt, so it can be read
by a person or a script while the service runs, and after it stopped. An attempt that comes to what
the one before came to (each poll of an unchanged head, of a branch deleted at the source) is counted
in that entry of the history (`repeats`, since `first`), not added: ten polls would otherwise push the
revision applied out of the history.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler.places import ensure_private_dir, open_private_file

__all__ = ["Applied", "Attempt", "Status", "read_status", "write_status"]

HISTORY = 10


@dataclass(frozen=True, slots=True)
class Attempt:
    """One reconciliation: which revision, when, how long, and what came of it."""

    revision: str
    time: str  # ISO 8601, UTC
    duration_ms: float
    result: str  # "applied", "unchanged", "invalid", "refused", "error"
    reason: str  # what started it: "start", "watch", "poll", "webhook"
    message: str = ""
    findings: tuple[dict[str, Any], ...] = ()
    changes: tuple[str, ...] = ()  # the plan against the live revision, one line per change
    repeats: int = 1  # attempts in a row that came to this (the history keeps one entry for them)
    first: str = ""  # when the first of them was made, when there were several

    def same_outcome(self, other: Attempt) -> bool:
        """Whether `other` came to what this did: the same revision, result, cause and message."""
        return (self.revision, self.result, self.reason, self.message, self.findings) == (
            other.revision, other.result, other.reason, other.message, other.findings)


@dataclass(frozen=True, slots=True)
class Applied:
    revision: str
    generation: int
    time: str


@dataclass
class Status:
    source: str  # "worktree /path" or "git URL@ref"
    applied: Applied | None = None
    last_attempt: Attempt | None = None
    profiles: dict[str, dict[str, str]] = field(default_factory=dict)  # profile → interface → "binding (key)"
    history: deque[Attempt] = field(default_factory=lambda: deque(maxlen=HISTORY))
    # Per binding, what the router knows of its connector process (state, why, drift), read when reported.
    connectors: Callable[[], dict[str, Any]] | None = None
    preflight: list[dict[str, Any]] = field(default_factory=list)  # this machine's problems (`reconciler.preflight`)
    # Per binding of the served revision, used or not, what keeps it from starting (`preflight.binding_checks`).
    binding_checks: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    checked: str | None = None  # when the preflight last ran, and of which revision: "<time> (<revision>)"

    @property
    def ready(self) -> bool:
        """Serving, and serving what the source holds now."""
        return self.applied is not None and (
            self.last_attempt is None or self.last_attempt.result in ("applied", "unchanged")
        )

    @property
    def reason(self) -> str:
        if self.applied is None:
            return "no revision has been applied yet" + (f": {self.last_attempt.message}" if self.last_attempt else "")
        last = self.last_attempt
        if last is not None and last.result not in ("applied", "unchanged"):
            return (
                f"revision {last.revision} was {last.result} ({last.message}); still serving "
                f"{self.applied.revision} (generation {self.applied.generation})"
            )
        return f"serving {self.applied.revision} (generation {self.applied.generation})"

    def record(self, attempt: Attempt) -> None:
        head = self.history[0] if self.history else None
        if head is not None and head.same_outcome(attempt):
            attempt = dataclasses.replace(attempt, repeats=head.repeats + 1, first=head.first or head.time)
            self.history[0] = attempt
        else:
            self.history.appendleft(attempt)
        self.last_attempt = attempt

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "ready": self.ready,
            "reason": self.reason,
            "applied": asdict(self.applied) if self.applied else None,
            "lastAttempt": _attempt_dict(self.last_attempt, full=True) if self.last_attempt else None,
            "profiles": self.profiles,
            "connectors": self.connectors() if self.connectors is not None else {},
            "preflight": list(self.preflight),
            "bindingChecks": dict(self.binding_checks),
            "checked": self.checked,
            "history": [_attempt_dict(a, full=False) for a in self.history],
        }


def _attempt_dict(attempt: Attempt, *, full: bool) -> dict[str, Any]:
    out: dict[str, Any] = {"revision": attempt.revision, "time": attempt.time, "durationMs": attempt.duration_ms,
                           "result": attempt.result, "reason": attempt.reason, "message": attempt.message}
    if attempt.repeats > 1:
        out["repeats"], out["first"] = attempt.repeats, attempt.first
    if full:
        out["findings"] = list(attempt.findings)
    if full or attempt.result == "applied":  # what an applied revision changed stays in the history
        out["changes"] = list(attempt.changes)
    return out


def write_status(path: Path, status: Status) -> None:
    """Replace `path` with the status as JSON, atomically (a reader never sees half a file).

    The file is 0600 in a 0700 folder, like everything in the state folder (docs/architecture.md §7).
    """
    ensure_private_dir(path.parent, "HANDLER_STATE_DIR")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(open_private_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as handle:
        handle.write(json.dumps(status.to_dict(), indent=2) + "\n")
    tmp.replace(path)


def read_status(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    return data
