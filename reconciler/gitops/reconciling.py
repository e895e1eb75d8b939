"""The reconcile loop: load a revision → check it → guard → plan against the live one → swap → record.

`ReconcileLoop.reconcile()` is called by whatever notices a possible change (the work-tree watcher, the
git poller, the push webhook). An invalid or refused revision is never applied: the last good
snapshot keeps serving and the status names the failing revision and its findings. Loading and
checking run in a worker thread, so the router keeps answering while a large tree is read.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from reconciler.config import HandlerError, Loader, Snapshot, TreeSource, check_frozen, plan_changes
from reconciler.config.findings import Finding
from reconciler.gitops.fetching import GitMirror
from reconciler.gitops.status import Applied, Attempt, Status, write_status

__all__ = ["ReconcileLoop", "SwapFn", "guard_emptying"]

log = logging.getLogger("handler.reconciler")

# Makes a checked snapshot live in the router; returns the new generation number.
SwapFn = Callable[[Snapshot], Awaitable[int]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def guard_emptying(live: Snapshot | None, new: Snapshot) -> str | None:
    """Why `new` must not replace `live` without `allowEmpty = true`, or None when it may.

    Like Argo CD's guard against an empty sync: a revision that removes every profile, or every
    binding of a profile that stays in use, is far more often a mistake than a wish.
    """
    if live is None or (new.org is not None and new.org.allowEmpty):
        return None
    if live.profiles and not new.profiles:
        return (
            f"it removes every profile ({len(live.profiles)} served now); set allowEmpty = true in "
            "config/org.toml if that is meant"
        )
    emptied = sorted(
        name
        for name, p in new.profiles.items()
        if not p.selections and name in live.profiles and live.profiles[name].selections
    )
    if emptied:
        return (
            f"it removes every binding of profile(s) in use: {', '.join(emptied)}; set allowEmpty = true in "
            "config/org.toml if that is meant"
        )
    return None


class ReconcileLoop:
    """Keeps the router on the newest good revision of one source."""

    def __init__(
        self,
        source: TreeSource,
        swap: SwapFn,
        *,
        label: str,
        status_file: Path | None = None,
        live: Snapshot | None = None,
        generation: int = 0,
        frozen: bool = False,
    ) -> None:
        self.source = source
        # Refuse a revision that changes an interface version the live one publishes (I010), as `validate --base`
        # does: a git source, where a push or a force-push can skip the pull request that would have said so.
        self.frozen = frozen
        self.published: Snapshot | None = None  # what to hold versions to while nothing serves (the last applied)
        self._swap = swap
        self._loader = Loader()
        self._lock = asyncio.Lock()
        self.status_file = status_file
        self.live = live
        self.status = Status(source=label)
        if live is not None:
            self.adopt(live, generation)
        self.attempts = 0

    def adopt(self, snapshot: Snapshot, generation: int) -> None:
        """The router already serves `snapshot` as `generation` (it started on a snapshot loaded before)."""
        self.live = snapshot
        self._mark_applied(snapshot, generation)

    async def reconcile(self, reason: str, *, source: TreeSource | None = None) -> Attempt:
        """Bring the router to the source's current revision if it is good; return what happened.

        `source`, when given, is read this once instead of the followed one (a revision applied
        before, to serve while the followed one cannot be). Nothing here raises: whatever goes wrong is
        the attempt's result, so whoever follows the source goes on to the next change.
        """
        async with self._lock:  # one reconciliation at a time; the loader is not shared across threads
            started = time.perf_counter()
            self.attempts += 1
            read = source or self.source
            if self.live is not None and isinstance(read, GitMirror) and read.head() == self.live.revision:
                # The commit serving already: its tree is not read again (a poll of a large tree took seconds).
                return self._record(self._attempt(self.live.revision, started, "unchanged", reason, "already applied"))
            new = await self._load(read, started, reason)
            if isinstance(new, Attempt):
                return self._record(new)
            if self.live is not None and new.revision == self.live.revision:
                return self._record(self._attempt(new.revision, started, "unchanged", reason, "already applied"))
            refused = self._refused(new, started, reason)
            if refused is not None:
                return self._record(refused)
            plan = plan_changes(self.live, new)
            changes = tuple(f"{p.profile}: {c}" for p in plan.profiles for c in p.changes) or (
                ("(no change for any profile)",) if self.live is not None else ()
            )
            generation = await self._apply(new, started, reason)
            if isinstance(generation, Attempt):
                return self._record(generation)
            self.live = new
            self._mark_applied(new, generation)
            attempt = self._attempt(
                new.revision,
                started,
                "applied",
                reason,
                f"generation {generation}",
                findings=tuple(f.to_dict() for f in new.findings),
                changes=changes,
            )
            log.info(
                "reconcile: applied %s as generation %d in %.0f ms (%d profile change(s))",
                new.revision,
                generation,
                attempt.duration_ms,
                len(plan.profiles),
            )
            return self._record(attempt)

    async def _load(self, source: TreeSource, started: float, reason: str) -> Snapshot | Attempt:
        """The source's revision, or the attempt saying why it could not be read."""
        try:
            return await asyncio.to_thread(self._loader.load, source)
        except HandlerError as exc:
            if not self._repeats("(unreadable)", str(exc)):
                log.info("reconcile: cannot read the source: %s", exc)  # reported with the attempt
            return self._attempt("(unreadable)", started, "error", reason, str(exc))
        except Exception as exc:  # a defect of ours: logged whole once, and the next change is tried as usual
            said = f"the loader failed ({exc!r}); the service's log has the details"
            if not self._repeats("(unreadable)", said):
                log.exception("reconcile: the loader failed on the source")
            return self._attempt("(unreadable)", started, "error", reason, said)

    async def _apply(self, new: Snapshot, started: float, reason: str) -> int | Attempt:
        """The router's swap to `new` (its generation), or the attempt saying why it did not take it. The router swaps
        whole or not at all, so on failure the last good revision serves on."""
        try:
            return await self._swap(new)
        except HandlerError as exc:
            said = str(exc)
        except Exception as exc:  # a defect of ours: logged whole, once a failure
            said = f"the router failed to apply it ({exc!r})"
            if not self._repeats(new.revision, said, prefix=True):
                log.exception("reconcile: the router failed to apply revision %s", new.revision)
        serving = self.live.revision if self.live else "nothing"
        if not self._repeats(new.revision, said, prefix=True):
            log.warning("reconcile: revision %s not applied: %s", new.revision, said)
        return self._attempt(new.revision, started, "error", reason, f"{said}; still serving {serving}")

    def _repeats(self, revision: str, message: str, *, prefix: bool = False) -> bool:
        """Whether the last attempt failed on `revision` with `message` already (logged then; each poll meets it)."""
        last = self.status.last_attempt
        if last is None or last.revision != revision or last.result != "error":
            return False
        return last.message.startswith(message) if prefix else last.message == message

    def _refused(self, new: Snapshot, started: float, reason: str) -> Attempt | None:
        """The attempt of a revision that may not go live (its errors, a published version changed against the one
        serving or applied last, every profile emptied); None when it may."""
        if not new.ok:
            return self._invalid(new, started, reason)
        base = self.live or self.published
        changed = check_frozen(base, new) if self.frozen and base is not None else []
        if changed:
            return self._invalid(new, started, reason, changed)
        refusal = guard_emptying(self.live, new)
        if refusal is not None:
            log.info("reconcile: revision %s refused: %s", new.revision, refusal)  # reported with the attempt
            return self._attempt(new.revision, started, "refused", reason, refusal)
        return None

    def _invalid(self, new: Snapshot, started: float, reason: str, against: Sequence[Finding] = ()) -> Attempt:
        """The attempt of a revision with errors: its own, or those found `against` the revision it would replace."""
        errors = tuple(against) or new.errors
        last = self.status.last_attempt
        if last is None or (last.revision, last.result) != (new.revision, "invalid"):  # once, not at each poll
            log.info(  # the attempt carries the findings; whoever started the service reports them (the CLI prints)
                "reconcile: revision %s is invalid (%d errors); still serving %s",
                new.revision,
                len(errors),
                self.live.revision if self.live else "nothing",
            )
        first = errors[0]
        return self._attempt(
            new.revision,
            started,
            "invalid",
            reason,
            f"{len(errors)} error(s); first: {first.file}:{first.line} {first.code} {first.message}",
            findings=tuple(f.to_dict() for f in (*against, *new.findings)),
        )

    @staticmethod
    def _attempt(
        revision: str,
        started: float,
        result: str,
        reason: str,
        message: str,
        *,
        findings: tuple[dict[str, Any], ...] = (),
        changes: tuple[str, ...] = (),
    ) -> Attempt:
        elapsed = round((time.perf_counter() - started) * 1000, 1)
        return Attempt(revision, _now(), elapsed, result, reason, message, findings, changes)

    def _mark_applied(self, snapshot: Snapshot, generation: int) -> None:
        self.status.applied = Applied(snapshot.revision, generation, _now())
        self.status.profiles = {
            name: {iface: f"{sel.binding} ({sel.key})" for iface, sel in sorted(p.selections.items())}
            for name, p in sorted(snapshot.profiles.items())
        }

    def _record(self, attempt: Attempt) -> Attempt:
        self.status.record(attempt)
        if self.status_file is not None:
            try:
                write_status(self.status_file, self.status)
            except OSError as exc:  # a full disk must not stop the router from serving
                log.error("reconcile: cannot write %s: %s", self.status_file, exc)
        return attempt
