"""Following a source: when to reconcile, and what to serve when the source's head cannot be.

A `Follower` keeps one `ReconcileLoop` on the newest good revision of its source. A work tree is
watched (`watching`): each save reconciles. A git source is a mirror (`fetching`) fetched every
`interval` seconds, or at once when the push webhook calls `push()`; the applied revision's files
are exported to the follower's `tree_root`, where connectors run from their folder. At start, a
git head that cannot be served gives way to the revision applied last time (`status.json`), if
the mirror still has it. A failure that polls meet again and again (a remote down, a branch
deleted there, a broken head) is reported once, and once more when the head serves again.

`reconciler.app` assembles one per service and hands it the swap that makes a snapshot live;
what a person should hear of (a failed fetch, the fallback) goes to the `FollowReports` it is given.
Its `proposer` says where a change made from the dashboard goes (`proposals`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from reconciler.config import FolderSource, GitSource, HandlerError, Loader, Snapshot
from reconciler.gitops.fetching import GitMirror
from reconciler.gitops.proposals import MirrorProposer, Proposer, WorkTreeProposer
from reconciler.gitops.reconciling import ReconcileLoop, SwapFn
from reconciler.gitops.status import Attempt, read_status
from reconciler.gitops.watching import watch_tree

__all__ = ["FollowReports", "Follower"]

log = logging.getLogger("handler.reconciler")


def _ignore(_: object) -> None:
    return None


@dataclass(frozen=True)
class FollowReports:
    """What a follower tells whoever started it (the CLI prints it)."""

    fetch_failed: Callable[[HandlerError], None] = _ignore  # the remote could not be fetched; the next try follows
    fell_back: Callable[[str], None] = _ignore  # the head cannot serve: this revision, applied before, serves
    # What a reconciliation after the start came to (a save, a fetch); a poll's failure only when it is new.
    reconciled: Callable[[Attempt], None] = _ignore
    recovered: Callable[[Attempt], None] = _ignore  # after a failure was reported, a poll serves the head again


class Follower:
    """Keeps a `ReconcileLoop` on its source: watched (a work tree) or fetched (git) until stopped."""

    def __init__(self, reconciler: ReconcileLoop, *, tree_root: Path, mirror: GitMirror | None = None,
                 interval: float = 30.0, reports: FollowReports | None = None) -> None:
        self.reconciler = reconciler
        self.tree_root = tree_root  # where relative paths of the tree (scopes, connector folders) resolve
        self.interval = interval
        self._mirror = mirror
        self._reports = reports or FollowReports()
        self._pushed = asyncio.Event()
        self._failing: str | None = None  # the failure of a fetch or poll reported last, until the head serves

    @classmethod
    def worktree(cls, root: Path, swap: SwapFn, *, status_file: Path,
                 reports: FollowReports | None = None) -> Follower:
        """Follow the config folders under `root` as they are saved."""
        loop = ReconcileLoop(FolderSource(root), swap, label=f"worktree {root.resolve()}", status_file=status_file)
        return cls(loop, tree_root=root, reports=reports)

    @classmethod
    def git(cls, remote: str, ref: str, swap: SwapFn, *, state_dir: Path, interval: float,
            reports: FollowReports | None = None) -> Follower:
        """Follow `ref` of the repository `remote` (a path or a URL), mirrored under `state_dir`."""
        mirror = GitMirror(remote, ref, state_dir / "mirror.git")
        tree_root = state_dir / "tree"  # a git source has no work tree: the applied revision is exported here

        async def export_and_swap(snapshot: Snapshot) -> int:
            # Connectors run from their folder: the revision's files must be on disk before it goes live. If it
            # cannot go live after all, the revision still serving gets its files back: its connectors must never
            # start from code that was not applied.
            try:
                await asyncio.to_thread(mirror.export, snapshot.revision, tree_root)
                return await swap(snapshot)
            except BaseException:
                live = reconciler.live
                if live is not None:
                    await asyncio.shield(asyncio.to_thread(mirror.export, live.revision, tree_root))
                raise

        reconciler = ReconcileLoop(mirror, export_and_swap, label=f"git {remote}@{ref}",
                                status_file=state_dir / "status.json", frozen=True)
        return cls(reconciler, tree_root=tree_root, mirror=mirror, interval=interval, reports=reports)

    @property
    def on_push(self) -> Callable[[], Awaitable[None]] | None:
        """What a verified push webhook calls; None when the source is not git (nothing to fetch)."""
        return self.push if self._mirror is not None else None

    def proposer(self) -> Proposer:
        """Where a change made from the dashboard goes: this work tree's files, or a new branch of the followed
        repository, committed in the mirror and pushed."""
        if self._mirror is not None:
            return MirrorProposer(self._mirror, self.tree_root)
        return WorkTreeProposer(self.tree_root)

    async def push(self) -> None:
        """A push was announced: fetch and reconcile now rather than at the next interval."""
        self._pushed.set()

    async def start(self) -> Attempt:
        """The first reconciliation, after a first fetch; returns the head's attempt.

        When the head cannot be served, a git source serves the revision applied last time instead;
        `reconciler.live` then says what serves (None: nothing).
        """
        last_good = self._last_applied()  # read first: the head's attempt rewrites status.json
        if self._mirror is not None:
            await self._fetch(self._mirror)
            if last_good:  # the versions it published stay frozen across a restart
                self.reconciler.published = await self._published(self._mirror, last_good)
        head = await self.reconciler.reconcile("start")
        if self.reconciler.live is None and self._mirror is not None and last_good:
            await self._serve_last_good(self._mirror, last_good)
        return head

    async def follow(self, stop: asyncio.Event) -> None:
        """Reconcile on every change of the source until `stop` is set."""
        if self._mirror is not None:
            await self._poll(self._mirror, stop)
            return
        source = self.reconciler.source
        note = source.note_changes if isinstance(source, FolderSource) else None
        await watch_tree(self.tree_root, self._reconcile, stop, note=note)

    async def _reconcile(self, reason: str) -> Attempt:
        """Reconcile as the source changed, and report what came of it."""
        attempt = await self.reconciler.reconcile(reason)
        self._reports.reconciled(attempt)
        return attempt

    async def _poll(self, mirror: GitMirror, stop: asyncio.Event) -> None:
        """Fetch every `interval` seconds, or at once after a verified push, and reconcile."""
        while (reason := await self._next_fetch(stop)) is not None:
            if await self._fetch(mirror):
                self._report_polled(await self.reconciler.reconcile(reason))

    def _report_polled(self, attempt: Attempt) -> None:
        """Report what a poll came to, except a failure the same as the one reported last (each poll meets it)."""
        if attempt.result not in ("applied", "unchanged"):
            if self._is_news(f"{attempt.result} {attempt.revision}: {attempt.message}"):
                self._reports.reconciled(attempt)
            return
        if self._failing is not None:
            self._failing = None
            self._reports.recovered(attempt)
        self._reports.reconciled(attempt)

    def _is_news(self, failure: str) -> bool:
        """Whether `failure` differs from the one reported last; it is the one reported last from now on."""
        news, self._failing = failure != self._failing, failure
        return news

    async def _next_fetch(self, stop: asyncio.Event) -> str | None:
        """Why to fetch next ("webhook" or "poll"), once it is time; None once `stop` is set."""
        waiters = {asyncio.create_task(self._pushed.wait()), asyncio.create_task(stop.wait())}
        _, pending = await asyncio.wait(waiters, timeout=self.interval, return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        if stop.is_set():
            return None
        reason = "webhook" if self._pushed.is_set() else "poll"
        self._pushed.clear()
        return reason

    async def _fetch(self, mirror: GitMirror) -> bool:
        try:
            await asyncio.to_thread(mirror.fetch)
        except HandlerError as exc:
            if self._is_news(str(exc)):
                self._reports.fetch_failed(exc)
            return False
        return True

    async def _published(self, mirror: GitMirror, revision: str) -> Snapshot | None:
        """The revision applied last, loaded from the mirror, if it still has it and it loads."""
        try:
            snapshot = await asyncio.to_thread(Loader().load, GitSource(mirror.folder, revision, mirror.subdir))
        except HandlerError:
            return None
        return snapshot if snapshot.ok else None

    def _last_applied(self) -> str | None:
        """The revision the last run applied, from its status.json."""
        if self.reconciler.status_file is None:
            return None
        previous = read_status(self.reconciler.status_file) or {}
        revision = (previous.get("applied") or {}).get("revision")
        return str(revision) if revision else None

    async def _serve_last_good(self, mirror: GitMirror, revision: str) -> None:
        """Serve `revision` while the head cannot be, if the mirror still has it."""
        attempt = await self.reconciler.reconcile("last-known-good",
                                                  source=GitSource(mirror.folder, revision, mirror.subdir))
        if attempt.result == "applied":
            log.info("the head is not servable; serving the last good revision %s", revision)
            self._reports.fell_back(revision)
            await self.reconciler.reconcile("start")  # records the failing head in the status again
