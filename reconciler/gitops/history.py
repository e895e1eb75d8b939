"""What the followed repository says of its changes: the branches proposed from the dashboard that are not merged
yet, and the followed branch's own history.

In git mode the dashboard commits each edit to a new branch `handler/<topic>-<time>` and pushes it
(`proposals`); nothing is kept of it but the branch. `open_proposals` lists those branches the followed ref does
not contain yet, each with its commit, the files it touches, its diff and the plan it would make, and marks the
files two proposals both touch (merging one makes the other conflict, or undo it). `followed_history` reads the
followed ref's last commits (commit, author, message, time). Read from the service's bare mirror, after its last
fetch; called by the dashboard's `/changes` page.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from reconciler.config import GitSource, HandlerError, Loader
from reconciler.config.planning import plan_changes
from reconciler.gitops.fetching import GitMirror

__all__ = ["BRANCH_PREFIX", "Commit", "Proposal", "followed_history", "open_proposals"]

BRANCH_PREFIX = "handler/"  # the branches the dashboard pushes (`proposals.branch_name`)
MAX_DIFF_CHARS = 20_000  # of one proposal's diff on the page; the rest is in the pull request
_SEP = "\x1f"


@dataclass(frozen=True, slots=True)
class Commit:
    sha: str
    author: str
    email: str
    at: float  # Unix time of the commit
    subject: str


@dataclass(frozen=True, slots=True)
class Proposal:
    branch: str
    head: Commit
    files: tuple[str, ...]  # tree-relative paths it changes
    diff: str  # against the followed ref, cut at MAX_DIFF_CHARS
    plan: str  # what it would change for each agent, as `handler plan` prints it
    shared: tuple[str, ...]  # of its files, those another open proposal touches too


def open_proposals(mirror: GitMirror) -> list[Proposal]:
    """The dashboard's branches not merged into the followed ref, newest first."""
    found = []
    for branch in _lines(mirror.folder, "for-each-ref", "--format=%(refname:short)", f"refs/heads/{BRANCH_PREFIX}"):
        if _run(mirror.folder, "merge-base", "--is-ancestor", branch, mirror.ref).returncode == 0:
            continue  # merged (or the followed ref moved past it): not open any more
        within = [f"{mirror.subdir.strip('/')}/"] if mirror.subdir.strip("/") else []
        files = _lines(mirror.folder, "diff", "--name-only", f"{mirror.ref}...{branch}", "--", *within)
        diff = _out(mirror.folder, "diff", f"{mirror.ref}...{branch}", "--", *within)
        if len(diff) > MAX_DIFF_CHARS:
            diff = diff[:MAX_DIFF_CHARS] + f"\n… ({len(diff) - MAX_DIFF_CHARS:,} more characters: see the branch)\n"
        found.append((branch, _commit(mirror.folder, branch), tuple(files), diff, _plan(mirror, branch)))
    touched = Counter(f for _, _, files, _, _ in found for f in set(files))
    proposals = [Proposal(branch, head, files, diff, plan, tuple(f for f in files if touched[f] > 1))
                 for branch, head, files, diff, plan in found]
    return sorted(proposals, key=lambda p: p.head.at, reverse=True)


def followed_history(mirror: GitMirror, limit: int = 20) -> list[Commit]:
    """The followed ref's last `limit` commits, newest first."""
    return [_parse(line) for line in _lines(mirror.folder, "log", f"-{limit}", f"--format={_FORMAT}", mirror.ref)]


def _plan(mirror: GitMirror, branch: str) -> str:
    """The plan from the followed ref to `branch`; a tree that does not load says so in its place."""
    try:
        loader = Loader()
        base = loader.load(GitSource(mirror.folder, mirror.ref, mirror.subdir))
        head = loader.load(GitSource(mirror.folder, branch, mirror.subdir))
    except HandlerError as exc:  # a page line, never a failed page: the branch may name anything
        return f"(the plan cannot be made: {exc})"
    errors = len(head.errors)
    return plan_changes(base, head).render_text() + (f"\n({errors} error(s): the service would refuse it)"
                                                     if errors else "")


_FORMAT = _SEP.join(("%H", "%an", "%ae", "%at", "%s"))


def _commit(folder: Path, ref: str) -> Commit:
    return _parse(_out(folder, "log", "-1", f"--format={_FORMAT}", ref).strip())


def _parse(line: str) -> Commit:
    sha, author, email, at, subject = (line.split(_SEP) + [""] * 5)[:5]
    return Commit(sha, author, email, float(at or 0), subject)


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=folder, capture_output=True, text=True, check=False)


def _out(folder: Path, *args: str) -> str:
    done = _run(folder, *args)
    return done.stdout if done.returncode == 0 else ""


def _lines(folder: Path, *args: str) -> list[str]:
    return [line for line in _out(folder, *args).splitlines() if line.strip()]
