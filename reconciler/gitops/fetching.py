"""The git source: a bare mirror of the config repository, fetched on an interval or on a push.

The repository may be a URL or a local path. Its refs are mirrored into the state folder, and each
revision is read from the commit's tree (`GitSource`), never from a checkout a person may be
editing. Fetching runs in a worker thread: GitPython calls block.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path

from reconciler.config import GitSource, SourceError
from reconciler.config.sources import TREE_FOLDERS, Blob, blob_sha

__all__ = ["GitMirror"]

log = logging.getLogger("handler.reconciler")


class GitMirror:
    """A bare mirror of `remote` under `folder`; `read()` gives the tree of `ref` after the last fetch."""

    def __init__(self, remote: str, ref: str, folder: Path, subdir: str = "") -> None:
        self.remote = remote
        self.ref = ref
        self.folder = folder
        self.subdir = subdir
        self._source: GitSource | None = None
        # Held while a fetch moves the refs, and while a change from the dashboard is read, committed and
        # pushed (`proposals`), so a new branch is never pruned by a fetch before it reaches the remote.
        self.lock = threading.Lock()

    def fetch(self) -> None:
        """Clone the mirror on first use, then fetch; raises SourceError when the remote is unusable."""
        with self.lock:
            self._fetch()
        if self._source is None:
            self._source = GitSource(self.folder, self.ref, self.subdir)

    def _fetch(self) -> None:
        import git

        try:
            if not (self.folder / "HEAD").exists():
                if self.folder.exists():
                    shutil.rmtree(self.folder)  # a clone that died half-way
                self.folder.parent.mkdir(parents=True, exist_ok=True)
                git.Repo.clone_from(self.remote, self.folder, mirror=True)
            else:
                git.Repo(self.folder).git.fetch(
                    "--prune", "origin", "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"
                )
        except git.GitCommandError as exc:
            detail = (exc.stderr or str(exc)).strip().splitlines()
            raise SourceError(f"cannot fetch {self.remote}: {detail[-1] if detail else exc}") from exc

    def export(self, revision: str, dest: Path) -> None:
        """Write the config folders of `revision` under `dest` (the service's own copy, never a person's
        checkout), so connectors run from their folder and relative scopes have a home.

        Files are written only when their content changed and files gone from the revision are removed,
        so connector processes already running from `dest` keep their folder. A path that was a file and is
        now a folder (or the other way round) is replaced: git cannot hold both in one revision.
        """
        _, files = GitSource(self.folder, revision, self.subdir).read()
        for rel, blob in files.items():
            if blob.link:  # never in a revision that is applied (F006); never written as a file either
                continue
            path = dest / rel
            if path.is_file() and not path.is_symlink() and blob_sha(path.read_bytes()) == blob.sha:
                continue
            _make_folders(dest, path.parent)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)  # a folder in the revision before: this one has a file there
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(blob.data)
            tmp.replace(path)
        for folder in TREE_FOLDERS:
            for path in sorted((dest / folder).rglob("*"), reverse=True) if (dest / folder).exists() else []:
                rel = path.relative_to(dest).as_posix()
                if (path.is_file() or path.is_symlink()) and rel not in files:
                    path.unlink()
                elif path.is_dir() and not any(path.iterdir()):
                    path.rmdir()

    def head(self) -> str | None:
        """The commit `ref` names after the last fetch, read without its tree (None when it names none)."""
        import git

        if self._source is None:
            return None
        try:
            return str(self._source.repo.commit(self.ref).hexsha)
        except (git.BadName, ValueError):  # the ref names nothing here
            return None

    def read(self) -> tuple[str, dict[str, Blob]]:
        if self._source is None:
            self.fetch()
        assert self._source is not None  # noqa: S101 - fetch() sets it or raises
        try:
            return self._source.read()
        except SourceError:  # the one a read raises: the ref names nothing here (deleted at the remote, say)
            raise SourceError(f"{self.remote} has no branch, tag or commit '{self.ref}' (as of the last fetch); "
                              "push it there, or follow another ref") from None


def _make_folders(dest: Path, folder: Path) -> None:
    """`folder` and its parents below `dest` as folders: a file in the way (the revision before had one where this one
    has a folder) is removed first."""
    for part in [*reversed(folder.relative_to(dest).parents), folder.relative_to(dest)]:
        path = dest / part
        if path != dest and (path.is_symlink() or path.is_file()):
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
