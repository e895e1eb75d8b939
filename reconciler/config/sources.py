"""Where a config tree is read from: a folder on disk or a commit of a git repository.

Both give the same thing, a map of tree-relative path → `Blob` with git's blob hash, so a tree read
from a folder and the same tree read from a commit hash alike and load to equal snapshots. Only the
folders the config lives in are read (`catalog/interfaces`, `catalog/connectors`, `config`).

Every file of a connector's folder is read, hidden ones and `__pycache__` included: what runs is what is
hashed and reviewed (a compiled file there is refused by `validate`, N013). Elsewhere, hidden files and
`__pycache__` are not part of the tree.

A symbolic link inside them is listed as git lists it, its target's path as its data (`Blob.link`), and
never followed: the loader refuses it (F006), so a tree cannot pull in a file from outside itself and a
link cannot stand in for a file that then silently goes missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from reconciler.config.errors import SourceError

__all__ = [
    "TREE_FOLDERS",
    "Blob",
    "FolderSource",
    "GitSource",
    "TreeSource",
    "blob_sha",
    "path_prefixes",
    "short_revision",
    "skipped",
    "tree_revision",
]

TREE_FOLDERS = ("catalog/interfaces", "catalog/connectors", "config")
_RACY_NS = 2_000_000_000
_GIT_LINK_MODE = 0o120000


@dataclass(frozen=True, slots=True)
class Blob:
    path: str
    sha: str  # git's blob hash of `data`
    data: bytes
    link: bool = False  # a symbolic link: `data` is the path it points to, as git stores it
    oversize: int = 0  # its size, when it is over MAX_FILE_BYTES: not read (`data` is empty), a finding (F009)


# The most a file of the tree may hold: a larger one is not read (a blob of zeros a few MB pushed holds gigabytes).
MAX_FILE_BYTES = 64 * 1024 * 1024


class TreeSource(Protocol):
    """Anything that can hand over the files of one revision of a config tree."""

    def read(self) -> tuple[str, dict[str, Blob]]:
        """Return (revision, files by tree-relative path)."""
        ...


def blob_sha(data: bytes) -> str:
    """The hash git gives a blob with these bytes."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def _file_blob(rel: str, path: str, st: os.stat_result) -> Blob:
    """The file at `path` (`st`, its lstat) as a blob; one over MAX_FILE_BYTES is not read."""
    if st.st_size > MAX_FILE_BYTES:
        return Blob(rel, f"oversize:{st.st_size}:{st.st_mtime_ns}", b"", oversize=st.st_size)
    with open(path, "rb") as fh:  # noqa: PTH123 - a Path per file costs more than the read
        data = fh.read()
    return Blob(rel, blob_sha(data), data)


def _link(rel: str, path: Path) -> Blob:
    """The symbolic link at `path`, as git would list it."""
    data = os.fsencode(path.readlink())
    return Blob(rel, blob_sha(data), data, link=True)


_CONNECTORS = "catalog/connectors/"


def skipped(rel: str) -> bool:
    """Whether the tree leaves out the file at `rel`: a hidden one or one of `__pycache__`, except in a connector's
    folder, whose every file runs in its sandbox and so is read and hashed."""
    return not rel.startswith(_CONNECTORS) and any(p.startswith(".") or p == "__pycache__" for p in rel.split("/"))


def path_prefixes(path: str) -> list[str]:
    """"catalog/interfaces" → ["catalog", "catalog/interfaces"]: the paths a link could stand at."""
    parts = path.split("/")
    return ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]


def tree_revision(files: dict[str, Blob]) -> str:
    """A content address for a set of files, for trees that are not a commit."""
    digest = hashlib.sha1(usedforsecurity=False)
    for path in sorted(files):
        digest.update(f"{path}\0{files[path].sha}\n".encode(errors="surrogateescape"))  # a name not UTF-8
    return "tree:" + digest.hexdigest()[:12]


def short_revision(revision: str) -> str:
    """A revision as people read it, the same way everywhere: a commit's first 12 hex digits; a folder's
    tree address (`tree:` and 12 digits already) and a placeholder such as "(unreadable)" whole."""
    return revision[:12] if re.fullmatch(r"[0-9a-f]{13,}", revision) else revision


class FolderSource:
    """A config tree in a folder. Files whose size and mtime did not change are not read again.

    A watcher that knows which files changed says so with `note_changes`; the next read then looks
    at those alone instead of walking the tree (a full walk still runs at least every
    `FULL_WALK_SECONDS`, and whenever a change cannot be placed, so nothing missed stays missed).
    """

    FULL_WALK_SECONDS = 30.0

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._stat_cache: dict[str, tuple[int, int, Blob]] = {}
        self._now_ns = 0
        self._files: dict[str, Blob] | None = None  # what the last read gave
        self._walked_at = 0.0
        self._pending: set[str] | None = None  # tree-relative paths noted since the last read; None: walk

    def note_changes(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        """Files that changed under the root since the last read (absolute paths, as a watcher gives them)."""
        pending = self._pending if self._pending is not None else set()
        root = self.root.resolve()
        for path in paths:
            noted = Path(path)
            try:  # the folder resolved, not the file: a link is noted as itself, not as what it points to
                rel = (noted.parent.resolve() / noted.name).relative_to(root).as_posix()
            except ValueError:
                continue  # outside the tree
            if rel.startswith(tuple(f"{f}/" for f in TREE_FOLDERS)):
                pending.add(rel)
        self._pending = pending

    def read(self) -> tuple[str, dict[str, Blob]]:
        if not self.root.is_dir():
            raise SourceError(f"{self.root} is not a folder; give the root of a config tree (it holds config/)")
        self._now_ns = time.time_ns()
        pending, self._pending = self._pending, None
        if (
            pending is not None
            and self._files is not None
            and time.monotonic() - self._walked_at < self.FULL_WALK_SECONDS
        ):
            files = self._read_changed(self._files, pending)
            if files is not None:
                self._files = files
                return tree_revision(files), dict(files)
        files = {}
        seen: dict[str, tuple[int, int, Blob]] = {}
        for folder in TREE_FOLDERS:
            linked = next((p for p in path_prefixes(folder) if (self.root / p).is_symlink()), None)
            if linked is not None:  # `catalog` or `config` itself a link: a commit holds it as one too
                files[linked] = _link(linked, self.root / linked)
            else:
                self._walk(f"{self.root}/{folder}", folder, files, seen)
        self._stat_cache = seen
        self._files, self._walked_at = files, time.monotonic()
        return tree_revision(files), dict(files)

    def _read_changed(self, previous: dict[str, Blob], changed: set[str]) -> dict[str, Blob] | None:
        """`previous` with the `changed` paths read again; None when a change needs a full walk (a folder)."""
        files = dict(previous)
        for rel in changed:
            if skipped(rel):
                continue
            path = self.root / rel
            try:
                st = path.lstat()
            except FileNotFoundError:
                if rel not in files and any(p.startswith(f"{rel}/") for p in files):
                    return None  # a folder went away: walk
                files.pop(rel, None)
                self._stat_cache.pop(rel, None)
                continue
            if stat.S_ISLNK(st.st_mode):
                if any(p.startswith(f"{rel}/") for p in files):
                    return None  # a folder became a link: walk
                files[rel] = _link(rel, path)
                self._stat_cache.pop(rel, None)
                continue
            if not stat.S_ISREG(st.st_mode):
                return None  # a folder was added, moved or removed: walk
            blob = _file_blob(rel, str(path), st)
            racy = st.st_mtime_ns > self._now_ns - _RACY_NS
            self._stat_cache[rel] = (-1 if racy else st.st_mtime_ns, st.st_size, blob)
            files[rel] = blob
        return files

    def _walk(self, path: str, rel: str, files: dict[str, Blob], seen: dict[str, tuple[int, int, Blob]]) -> None:
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            child = f"{rel}/{entry.name}"
            if skipped(child):
                continue
            if entry.is_symlink():
                with contextlib.suppress(OSError):  # gone since the listing: not in this read
                    files[child] = _link(child, Path(entry.path))
            elif entry.is_dir(follow_symlinks=False):
                self._walk(entry.path, child, files, seen)
            elif entry.is_file(follow_symlinks=False):
                st = entry.stat(follow_symlinks=False)
                cached = self._stat_cache.get(child)
                if cached and cached[0] == st.st_mtime_ns and cached[1] == st.st_size:
                    blob = cached[2]
                else:
                    blob = _file_blob(child, entry.path, st)
                # Like git's "racy" entries: mtimes are coarse, so a file written in the last seconds may
                # change again without its size or mtime moving; it is not trusted from the cache yet.
                racy = st.st_mtime_ns > self._now_ns - _RACY_NS
                seen[child] = (-1 if racy else st.st_mtime_ns, st.st_size, blob)
                files[child] = blob


class GitSource:
    """A config tree at a commit of a git repository, read from the commit's tree (no checkout).

    `subdir` is where the config root sits inside the repository ('' for its top).
    """

    def __init__(self, repo: str | os.PathLike[str], ref: str, subdir: str = "") -> None:
        import git  # GitPython is slow to import; only git sources pay for it

        try:
            self.repo = git.Repo(repo, search_parent_directories=True)
        except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
            raise SourceError(f"{repo} is not inside a git repository; --base needs one") from exc
        self.ref = ref
        self.subdir = subdir.strip("/")
        self._blobs: dict[str, Blob] = {}

    @classmethod
    def for_folder(cls, root: str | os.PathLike[str], ref: str) -> GitSource:
        """The commit `ref` of the repository holding folder `root`, at root's place in it."""
        source = cls(root, ref)
        top = Path(source.repo.working_tree_dir or ".").resolve()
        source.subdir = Path(root).resolve().relative_to(top).as_posix().strip(".")
        return source

    def read(self) -> tuple[str, dict[str, Blob]]:
        import git

        try:
            commit = self.repo.commit(self.ref)
        except (git.BadName, ValueError) as exc:
            raise SourceError(f"'{self.ref}' is not a commit, branch or tag of {self.repo.git_dir}") from exc
        tree = commit.tree
        if self.subdir:
            try:
                tree = tree / self.subdir
            except KeyError:
                return commit.hexsha, {}
        files: dict[str, Blob] = {}
        cache: dict[str, Blob] = {}
        for folder in TREE_FOLDERS:
            sub = tree
            for prefix in path_prefixes(folder):
                try:
                    sub = sub / prefix.rsplit("/", 1)[-1]
                except KeyError:
                    break
                if sub.type == "blob":  # a link (or a file) where the folder would be
                    files[prefix] = Blob(prefix, sub.hexsha, sub.data_stream.read(), sub.mode == _GIT_LINK_MODE)
                    break
            else:
                self._read_folder(sub, folder, files, cache)
        self._blobs = cache
        return commit.hexsha, files

    def _read_folder(self, sub: Any, folder: str, files: dict[str, Blob], cache: dict[str, Blob]) -> None:
        """The files under the tree `sub` (at `folder`), into `files`; `cache` keeps each blob for the next read."""
        cut = len(str(sub.path)) + 1
        item: Any
        for item in sub.traverse():
            if item.type != "blob":
                continue
            rel = f"{folder}/{item.path[cut:]}"
            if skipped(rel):
                continue
            blob = self._blobs.get(item.hexsha)
            link = item.mode == _GIT_LINK_MODE
            if blob is None or blob.path != rel or blob.link != link:
                size = item.size  # from the object's header: nothing is inflated to know it
                blob = (Blob(rel, item.hexsha, b"", link, oversize=size) if size > MAX_FILE_BYTES
                        else Blob(rel, item.hexsha, item.data_stream.read(), link))
            cache[item.hexsha] = blob
            files[rel] = blob
