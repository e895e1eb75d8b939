"""Where the service keeps its sockets and its state: the defaults of docs/architecture.md §3, in one place.

Connectors' own Python environments are built under `$XDG_CACHE_HOME/handler/envs` (`default_envs_dir`). The
connector kit (`handler_kit`) is in `kit_folder()`, a folder holding it alone, which the launcher binds read-only
into a connector's sandbox and puts on its PYTHONPATH; `kit_hash()` is the version a conformance result covers.

`HANDLER_RUN_DIR` (sockets, per-call folders) defaults to `$XDG_RUNTIME_DIR/handler`, else
`/tmp/handler-$UID`: short, since a unix socket path holds at most ~107 bytes. `HANDLER_STATE_DIR`
(the call log `calls.jsonl`, connectors' stderr, `status.json`, the governance store's SQLite file)
defaults to `.handler/` under the config root. Called by the router, the bridge, `handler up`,
`handler serve` and the CLI's commands that read the state folder.

Both folders hold what others must not read (held calls' arguments, connectors' stderr, the link
key): `ensure_private_dir` makes each one 0700 and refuses one another user owns (docs/architecture.md
§6 and §7), and a path that cannot be a folder (`not_a_folder`: a file there, or above it). The router
and the store call it where they create their folders.

A connector writes into folders the router made for it (its call folder's `out/`, its private `tmp/`), and
`remove_tree` is how the router removes them: without recursion however deep a tree is, following no
link, and taking back a folder whose mode was taken away from it.

It stands below every room, outside `reconciler.config`, and imports only the standard library:
the bridge an agent starts for every interface reads it without loading the config room.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import importlib.util
import itertools
import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "KIT_PACKAGE",
    "MAX_SOCKET_PATH",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SHORTER_SOCKET",
    "PrivatePlaceError",
    "default_envs_dir",
    "default_run_dir",
    "default_state_dir",
    "ensure_private_dir",
    "kit_folder",
    "kit_hash",
    "not_a_folder",
    "open_private_file",
    "remove_tree",
    "run_dir_room",
    "socket_path",
    "socket_too_long",
    "why_unreachable",
]

KIT_PACKAGE = "handler_kit"


@functools.cache
def kit_folder() -> Path | None:
    """The folder holding the connector kit's package (what a connector's PYTHONPATH names), found without
    importing it; None when the kit is not installed beside the service."""
    spec = importlib.util.find_spec(KIT_PACKAGE)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent.parent


@functools.cache
def kit_hash() -> str:
    """The kit's version as its files' digest: what a connector written on it runs, so its conformance result's
    hash covers it (`config.loading`). Empty when the kit is not installed."""
    folder = kit_folder()
    if folder is None:
        return ""
    digest = hashlib.sha256()
    for path in sorted((folder / KIT_PACKAGE).rglob("*.py")):
        digest.update(f"{path.relative_to(folder)}\0".encode() + hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
MOST_REMOVED = 1_000_000  # entries `remove_tree` removes before it stops: a writer may fill a folder as fast as it goes
_PATH_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_PATH
_READ_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivatePlaceError(PermissionError):
    """A folder the service keeps private is another user's, a link another user made, or cannot be a folder.

    A `PermissionError` rather than a `HandlerError`: this module imports nothing of ours, so each
    room that calls `ensure_private_dir` hands it on as its own error.
    """


def default_run_dir() -> Path:
    given = os.environ.get("HANDLER_RUN_DIR")
    if given:
        return Path(given)
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "handler"
    return Path(f"/tmp/handler-{os.getuid()}")  # noqa: S108 - per-user and created 0700; the documented default


def default_state_dir(root: Path, env: Mapping[str, str] | None = None) -> Path:
    """`HANDLER_STATE_DIR` of `env` (default: the process's environment), else `.handler/` under `root`."""
    given = (os.environ if env is None else env).get("HANDLER_STATE_DIR")
    return Path(given) if given else root / ".handler"


def default_envs_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where connectors' own Python environments are built (docs/config.md, `[needs]`): `$XDG_CACHE_HOME/handler/envs`,
    else `~/.cache/handler/envs`. A cache: each one is keyed by what its connector declares, and rebuilt at will."""
    source = os.environ if env is None else env
    cache = source.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "handler" / "envs"


def socket_path(run_dir: Path, profile: str) -> Path:
    return run_dir / "profiles" / f"{profile}.sock"


SHORTER_SOCKET = "give the profile a shorter name, or set HANDLER_RUN_DIR to a shorter folder"


def run_dir_room(profile: str) -> int:
    """How many bytes the run folder may take before the profile's socket path is past `MAX_SOCKET_PATH`."""
    return MAX_SOCKET_PATH - len(os.fsencode(socket_path(Path("/"), profile)))


def socket_too_long(run_dir: Path, profile: str) -> str | None:
    """What is wrong with the profile's socket path under `run_dir` when no socket can have it (fixed by
    `SHORTER_SOCKET`), else None."""
    if len(os.fsencode(run_dir)) <= run_dir_room(profile):
        return None
    path = socket_path(run_dir, profile)
    size = len(os.fsencode(path))
    return f"its socket {path} is {size} bytes long, past the {MAX_SOCKET_PATH} a unix socket's path holds"


def why_unreachable(run_dir: Path, profile: str, path: Path, exc: OSError) -> str:
    """Why the profile's socket did not answer: a run folder of another user's, a profile the running router does not
    serve (naming those it does, one socket each), or no router running at all."""
    if isinstance(exc, PermissionError):
        return (f"the run folder {run_dir} is not this user's to use ({exc.strerror} at {path}): run this as the "
                "user the service runs as, or name your own run folder with HANDLER_RUN_DIR")
    try:
        served = sorted(p.stem for p in (run_dir / "profiles").glob("*.sock")) if (run_dir / "profiles").is_dir() \
            else []
    except OSError:  # a folder not ours to list
        served = []
    if path.exists() or not served:
        return (f"no router is running for profile '{profile}' (nothing answers at {path}: {exc.strerror}); "
                "start one with `handler up` or `handler serve`")
    return (f"unknown profile '{profile}': the running router's configuration has no such profile; it serves "
            f"{', '.join(served)} (run folder {run_dir})")


def not_a_folder(path: Path) -> str | None:
    """Why `path` cannot be a folder (it, or the nearest of its parents that exists, is something else), or None."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            return None
        if os.path.lexists(folder):
            return f"{path} is not a folder" if folder == path else f"{path} cannot be a folder: {folder} is not one"
    return None


def ensure_private_dir(path: Path, setting: str = "HANDLER_RUN_DIR or HANDLER_STATE_DIR") -> Path:
    """Create `path` (and its missing parents) mode 0700, or make an existing one of ours 0700; returns `path`.

    A folder another user owns is refused with `PrivatePlaceError`, never changed: they could read
    or swap what we keep there. `setting` names the variable that chooses another folder. The mode
    is set whatever the umask, and on the folder we opened, so a rename in between changes nothing.
    A path that cannot be a folder (`not_a_folder`) is refused with `PrivatePlaceError` too.
    """
    if (problem := not_a_folder(path)) is not None:
        raise PrivatePlaceError(f"{problem}: choose a folder with {setting}, or move what is there away")
    _make_missing_dirs(path)
    _refuse_foreign_link(path, setting)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise PrivatePlaceError(_refusal(path, info, setting))
        if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
            os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)
    return path


def open_private_file(path: Path, flags: int = os.O_WRONLY | os.O_APPEND | os.O_CREAT) -> int:
    """`os.open` of a file only we may read: created 0600, and one found wider (an older release's) made 0600."""
    fd = os.open(path, flags | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != PRIVATE_FILE_MODE:
            os.fchmod(fd, PRIVATE_FILE_MODE)  # the umask may also have taken bits we need
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_tree(path: Path | str, *, most: int = MOST_REMOVED) -> None:
    """Remove `path` and everything in it, a folder a connector wrote into; nothing there is an error.

    No link is followed: a link met (or at `path` itself) is removed, never its target. No recursion and a
    few descriptors at a time, however deep the tree: each folder that is not empty has what it holds
    moved up into `path` before it goes (`renameat`, within the tree). A folder whose owner took its
    permissions away is given the owner's back (through its descriptor) when it is ours.
    Raises `OSError` for what cannot be removed, and once `most` entries are removed with more coming.
    """
    where = Path(path).absolute()
    parent, name = str(where.parent), where.name
    base = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            top = _open_dir(name, base)
        except FileNotFoundError:
            return
        except NotADirectoryError:  # a link or a file: removed itself
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=base)
            return
        try:
            _empty(top, most, str(path))
        finally:
            os.close(top)
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=base)
    finally:
        os.close(base)


def _open_dir(name: str, folder: int) -> int:
    """A descriptor to list and change the folder `name` of `folder`, never through a link (`NotADirectoryError`);
    when it is ours and its owner's permissions were taken away, they are given back (we are not root)."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotADirectoryError(errno.ENOTDIR, "a symbolic link", name) from None
        if exc.errno != errno.EACCES or os.geteuid() == 0:
            raise
        _grant_unopenable(name, folder)
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o700 != 0o700 and os.geteuid() != 0:  # root needs none of them
            os.fchmod(fd, mode | 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _grant_unopenable(name: str, folder: int) -> None:
    """Give the owner's permissions back to a folder it may not even open, through an O_PATH descriptor of that very
    folder (`/proc/self/fd`), whatever is renamed meanwhile."""
    held = os.open(name, _PATH_FLAGS, dir_fd=folder)
    try:
        Path(f"/proc/self/fd/{held}").chmod(stat.S_IMODE(os.fstat(held).st_mode) | 0o700)
    except FileNotFoundError:  # no /proc: not "gone", which the caller would take it for
        raise PermissionError(errno.EACCES, "its permissions cannot be given back without /proc", name) from None
    finally:
        os.close(held)


def _empty(top: int, most: int, path: str) -> None:
    """Remove what the folder `top` holds, lifting what its sub-folders hold into it until none is left."""
    removed = 0
    fresh = itertools.count()
    while True:
        with os.scandir(top) as found:
            entries = [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in found]
        if not entries:
            return
        for name, folder in entries:
            removed += 1
            if removed > most:
                raise OSError(errno.ENOTEMPTY, f"still filling after {most:,} entries were removed; stop what "
                              "writes into it and remove it again", path)
            try:
                if not folder:
                    os.unlink(name, dir_fd=top)
                    continue
                try:
                    os.rmdir(name, dir_fd=top)
                    continue
                except OSError as exc:
                    if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                        raise
                _lift(top, name, fresh)
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):  # gone or swapped: the next pass sees
                continue


def _lift(top: int, name: str, fresh: itertools.count[int]) -> None:
    """Move what the folder `name` of `top` holds into `top`, then remove `name` if that left it empty."""
    sub = _open_dir(name, top)
    try:
        with os.scandir(sub) as found:
            held = [entry.name for entry in found]
        for entry in held:
            granted = False
            while True:
                try:
                    os.rename(entry, f".removing-{next(fresh)}", src_dir_fd=sub, dst_dir_fd=top)
                    break
                except FileNotFoundError:
                    break
                except PermissionError:  # a folder is moved only when its owner may write it (its `..`)
                    if granted:
                        raise
                    os.close(_open_dir(entry, sub))
                    granted = True
                except OSError as exc:  # a name taken in `top` by what cannot be replaced: the next one
                    if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                        raise
    finally:
        os.close(sub)
    with contextlib.suppress(OSError):  # filled again meanwhile: the next pass lifts it again
        os.rmdir(name, dir_fd=top)


def _make_missing_dirs(path: Path) -> None:
    """mkdir each missing folder from the top down, each 0700 (`mkdir -p` would give parents the umask's mode)."""
    missing = []
    for folder in (path, *path.parents):
        if os.path.lexists(folder):
            break
        missing.append(folder)
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=PRIVATE_DIR_MODE)
        except FileExistsError:  # another process made it first: checked like any existing folder
            continue
        folder.chmod(PRIVATE_DIR_MODE)  # the umask may have taken bits we need


def _refuse_foreign_link(path: Path, setting: str) -> None:
    """A symbolic link another user made (say /tmp/handler-0 pointing at /etc) is never followed to chmod."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) and info.st_uid != os.geteuid():
        raise PrivatePlaceError(_refusal(path, info, setting))


def _refusal(path: Path, info: os.stat_result, setting: str) -> str:
    kind = "a link made by" if stat.S_ISLNK(info.st_mode) else "owned by"
    return (f"{path} is {kind} {_user_name(info.st_uid)} (uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):o}), "
            f"not by this user (uid {os.geteuid()}): it must be ours and private. Run `chown {os.geteuid()} {path}` "
            f"and `chmod 700 {path}`, or choose another folder with {setting}")


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "another user"
