"""Where a change made from the dashboard goes: the followed work tree's files, or a new branch of the
followed repository (docs/architecture.md §8).

A `Proposer` reads the tree a change is made against and checks it there (`config.editing.check_edit`,
the very code of `handler binding create` and `handler profile use`), then delivers a clean one:

- `WorkTreeProposer` (the service follows a work tree): writes the files; the watcher applies them as it
  applies any save.
- `MirrorProposer` (the service follows a ref of a git repository): checks against the followed ref's
  newest fetched commit, commits the change on it in the service's bare mirror as a new branch, by the
  signed-in owner, and pushes that branch to the repository, ready for a pull request. The followed ref,
  and every branch that exists, is never moved (`branches`); nothing applies until the branch is merged.

`Follower.proposer` makes the one that fits its source; the web room calls it in a worker thread.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from reconciler.config import FolderSource, GitSource, SourceError
from reconciler.config.editing import Checked, Edit, check_edit, write_change
from reconciler.gitops.branches import GitTree, Identity, commit_to_new_branch, delete_branch, push_new_branch
from reconciler.gitops.fetching import GitMirror

__all__ = ["Delivered", "MirrorProposer", "Proposer", "WorkTreeProposer", "branch_name"]


@dataclass(frozen=True)
class Delivered:
    """What became of a clean change: the files written, or the branch committed and pushed."""

    summary: str
    written: tuple[str, ...] = ()  # tree-relative paths (work tree)
    branch: str | None = None  # the new branch (git)
    commit: str | None = None
    base: str | None = None  # the followed ref's commit the branch starts from
    remote: str | None = None  # where the branch was pushed


class Proposer(Protocol):
    """Checks a change where the service reads its tree, and delivers it there when clean."""

    @property
    def mode(self) -> str:
        """"worktree" or "git"."""
        ...

    @property
    def root(self) -> Path:
        """Where the service reads the tree it applies: relative paths of the tree resolve there."""
        ...

    def check(self, edit: Edit) -> Checked:
        """The change `edit` makes, checked and planned against the tree it would land on."""
        ...

    def deliver(self, checked: Checked, identity: Identity, topic: str) -> Delivered:
        """Write or commit a checked change with no errors, by `identity`; `topic` names a new branch."""
        ...


class WorkTreeProposer:
    """Changes to the work tree the service follows: written in place."""

    mode = "worktree"

    def __init__(self, root: Path) -> None:
        self.root = root

    def check(self, edit: Edit) -> Checked:
        return check_edit(FolderSource(self.root), edit)

    def deliver(self, checked: Checked, identity: Identity, topic: str) -> Delivered:
        _refuse_errors(checked)
        return Delivered(checked.change.summary, written=tuple(write_change(self.root, checked.change)))


class MirrorProposer:
    """Changes to the repository the service follows: a new branch, committed in its mirror and pushed; `root` is
    where the service exports the revision it applies (where a relative file reference resolves)."""

    mode = "git"

    def __init__(self, mirror: GitMirror, root: Path) -> None:
        self.mirror = mirror
        self.root = root

    def check(self, edit: Edit) -> Checked:
        with self.mirror.lock:  # not while a fetch moves the refs
            return check_edit(GitSource(self.mirror.folder, self.mirror.ref, self.mirror.subdir), edit)

    def deliver(self, checked: Checked, identity: Identity, topic: str) -> Delivered:
        _refuse_errors(checked)
        mirror = self.mirror
        branch = _free_branch(mirror.folder, branch_name(topic))  # never the followed ref, which exists
        tree = GitTree(mirror.folder, f"{mirror.subdir.strip('/')}/" if mirror.subdir.strip("/") else "")
        # The branch in the message: two like proposals in one second are two commits, not one under two names
        # (merging one would have shown the other merged too).
        message = (f"{checked.change.summary}\n\nProposed from the dashboard by {identity.name} <{identity.email}> "
                   f"as {branch}.")
        with mirror.lock:
            done = commit_to_new_branch(tree, checked.before.revision, branch, checked.change.files, message,
                                        identity)
            remote = _origin_url(mirror.folder)
            try:
                push_new_branch(mirror.folder, remote, done.commit, branch)
            except SourceError:
                delete_branch(mirror.folder, branch, done.commit)  # the mirror keeps the remote's branches only
                raise
        return Delivered(checked.change.summary, branch=branch, commit=done.commit, base=done.base, remote=remote)


def branch_name(topic: str, now: datetime.datetime | None = None) -> str:
    """A new branch's name for a change about `topic`: `handler/<topic>-<UTC time>`, e.g.
    `handler/binding-brave-fr-20261201-101500`."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", topic).strip("-.") or "change"
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%d-%H%M%S")
    return f"handler/{slug}-{stamp}"


def _free_branch(mirror: Path, name: str) -> str:
    """`name`, or `name-2`, `name-3`… the first no branch of the mirror has: two changes of one topic in the same
    second (two owners on one profile) are two proposals, the second not refused for its name."""
    taken = set(subprocess.run(["git", "for-each-ref", "--format=%(refname:short)", f"refs/heads/{name}*"],
                               cwd=mirror, capture_output=True, text=True, check=False).stdout.split())
    return next(candidate for n in range(1, len(taken) + 2)
                if (candidate := name if n == 1 else f"{name}-{n}") not in taken)


def _refuse_errors(checked: Checked) -> None:
    if not checked.ok:
        raise SourceError(f"not delivered: {checked.change.summary} would leave {len(checked.errors)} error(s)")


def _origin_url(mirror: Path) -> str:
    """The repository the mirror was cloned from, as git recorded it (a path made absolute, or a URL)."""
    done = subprocess.run(["git", "config", "--get", "remote.origin.url"], cwd=mirror, capture_output=True,
                          text=True, check=False)
    url = done.stdout.strip()
    if done.returncode != 0 or not url:
        raise SourceError(f"the mirror {mirror} names no remote to push to; restart the service to clone it again")
    return url
