"""A change to the config tree committed to a new branch, ready for a pull request, as GitOps asks.

The commit is built with a temporary index (`git read-tree`, `update-index`, `write-tree`,
`commit-tree`), so the work tree, the real index and HEAD stay as they were, and the branch is created
with `update-ref` only if it does not exist yet: an existing branch, the followed ref above all, is
never moved. Called by `handler binding create --branch` and `handler profile use --branch`, and by the
dashboard's forms in git mode (`proposals`), which commit in the service's bare mirror as the signed-in
owner (`Identity`) and push the new branch to the remote with `push_new_branch`: a push that could
only create it, never the followed ref nor any branch that exists there.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from reconciler.config import SourceError

__all__ = ["BranchCommit", "GitTree", "Identity", "commit_to_new_branch", "delete_branch", "push_new_branch"]


@dataclass(frozen=True)
class Identity:
    """Who a commit is by (author and committer), when the repository's own git config is not the one to use."""

    name: str
    email: str

    def env(self) -> dict[str, str]:
        return {"GIT_AUTHOR_NAME": self.name, "GIT_AUTHOR_EMAIL": self.email,
                "GIT_COMMITTER_NAME": self.name, "GIT_COMMITTER_EMAIL": self.email}


@dataclass(frozen=True)
class GitTree:
    """Where a config root sits in its git repository."""

    top: Path  # the work tree's top folder
    prefix: str  # the config root's path inside the repository ('' at its top, else ending in '/')

    @classmethod
    def of(cls, root: str | os.PathLike[str]) -> GitTree:
        """The repository whose work tree holds `root`; SourceError when there is none."""
        top = _git(Path(root), "rev-parse", "--show-toplevel", what=f"{root} is not inside a git work tree; "
                   "--branch commits to a branch of the repository holding the config root")
        prefix = _git(Path(root), "rev-parse", "--show-prefix", what="cannot place the config root in its repository")
        return cls(Path(top), prefix)


@dataclass(frozen=True)
class BranchCommit:
    branch: str
    commit: str
    base: str  # the commit the branch starts from
    remote: str | None  # the repository's first remote, to push the branch to (None: it has none)

    def push_hint(self) -> str:
        """How to take the branch to a pull request."""
        if self.remote is None:
            return (f"this repository has no remote: add one (git remote add origin URL), then "
                    f"git push -u origin {self.branch}")
        return f"git push -u {self.remote} {self.branch}   # then open a pull request from {self.branch}"


def commit_to_new_branch(tree: GitTree, base: str, branch: str, files: Mapping[str, str], message: str,
                         identity: Identity | None = None) -> BranchCommit:
    """Commit `files` (config-root-relative path → text) on top of `base` as the new branch `branch`, by
    `identity` (default: the repository's git config)."""
    top = tree.top
    _git(top, "check-ref-format", "--branch", branch, what=f"'{branch}' is not a valid branch name")
    if _run(top, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}").returncode == 0:
        raise SourceError(f"branch {branch} exists; choose a new name (a change never moves an existing branch)")
    base_commit = _git(top, "rev-parse", "--verify", f"{base}^{{commit}}", what=f"'{base}' is not a commit")
    with tempfile.TemporaryDirectory(prefix="handler-index-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(top, "read-tree", base_commit, env=env, what="cannot read the base commit's tree")
        for path, text in sorted(files.items()):
            blob = _git(top, "hash-object", "-w", "--stdin", data=text, what=f"cannot store {path}")
            _git(top, "update-index", "--add", "--cacheinfo", f"100644,{blob},{tree.prefix}{path}", env=env,
                 what=f"cannot stage {path}")
        new_tree = _git(top, "write-tree", env=env, what="cannot write the tree")
    commit = _git(top, "commit-tree", new_tree, "-p", base_commit, data=message + "\n",
                  env=identity.env() if identity is not None else None,
                  what="cannot commit (is user.name and user.email set? `git config user.email you@example.org`)")
    # The empty old value makes update-ref create the branch or fail: it never moves one that appeared meanwhile.
    _git(top, "update-ref", f"refs/heads/{branch}", commit, "", what=f"cannot create branch {branch}")
    remotes = _git(top, "remote", what="cannot list the remotes").split()
    remote = "origin" if "origin" in remotes else remotes[0] if remotes else None
    return BranchCommit(branch, commit, base_commit, remote)


def push_new_branch(repository: Path, remote: str, commit: str, branch: str) -> None:
    """Push `commit` to `remote` (a URL or a path) as its new branch `branch`; SourceError when the remote
    refuses, a branch of that name among the reasons. The lease names no old value, so the push can create
    the branch and nothing else: an existing one, however it got there, is never moved."""
    ref = f"refs/heads/{branch}"
    _git(repository, "push", "--quiet", f"--force-with-lease={ref}:", remote, f"{commit}:{ref}",
         what=f"cannot push branch {branch} to {remote} (does it exist there already? may this service push?)")


def delete_branch(repository: Path, branch: str, commit: str) -> None:
    """Remove `branch` from `repository` if it still points at `commit` (a branch that was not pushed)."""
    _git(repository, "update-ref", "-d", f"refs/heads/{branch}", commit, what=f"cannot remove branch {branch}")


def _run(cwd: Path, *args: str, env: Mapping[str, str] | None = None,
         data: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, input=data, check=False,
                          env={**os.environ, **env} if env else None)


def _git(cwd: Path, *args: str, what: str, env: Mapping[str, str] | None = None, data: str | None = None) -> str:
    """git's output; SourceError saying `what` went wrong, with git's own last line."""
    try:
        done = _run(cwd, *args, env=env, data=data)
    except OSError as exc:
        raise SourceError(f"{what}: cannot run git ({exc})") from exc
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or [""])[-1]
        raise SourceError(f"{what}" + (f" (git: {detail})" if detail else ""))
    return done.stdout.strip()
