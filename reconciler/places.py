"""Where the service keeps its sockets and its state: the defaults of docs/architecture.md §3, in one place.

Connectors' own Python environments are built under `$XDG_CACHE_HOME/handler/envs` (`default_envs_dir`).

`HANDLER_RUN_DIR` (sockets, per-call folders) defaults to `$XDG_RUNTIME_DIR/handler`, else
`/tmp/handler-$UID`: short, since a unix socket path holds at most ~107 bytes. `HANDLER_STATE_DIR`
(the call log `calls.jsonl`, connectors' stderr, `status.json`, the governance store's SQLite file)
defaults to `.handler/` under the config root. Called by the router, the bridge, `handler up`,
`handler serve` and the CLI's commands that read the state folder.

Both folders hold what others must not read (held calls' arguments, connectors' stderr, the link
key): `ensure_private_dir` makes each one 0700 and refuses one another user owns (docs/architecture.md
§6 and §7). The router and the store call it where they create their folders.

It stands below every room, outside `reconciler.config`, and imports only the standard library:
the bridge an agent starts for every interface reads it without loading the config room.
"""

from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Mapping
from pathlib import Path

__all__ = [
    "MAX_SOCKET_PATH",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "PrivatePlaceError",
    "default_envs_dir",
    "default_run_dir",
    "default_state_dir",
    "ensure_private_dir",
    "open_private_file",
    "socket_path",
]

MAX_SOCKET_PATH = 107  # sun_path is 108 bytes on Linux, one of them the terminating NUL
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600


class PrivatePlaceError(PermissionError):
    """A folder the service keeps private is another user's, or a link another user made.

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


def ensure_private_dir(path: Path, setting: str = "HANDLER_RUN_DIR or HANDLER_STATE_DIR") -> Path:
    """Create `path` (and its missing parents) mode 0700, or make an existing one of ours 0700; returns `path`.

    A folder another user owns is refused with `PrivatePlaceError`, never changed: they could read
    or swap what we keep there. `setting` names the variable that chooses another folder. The mode
    is set whatever the umask, and on the folder we opened, so a rename in between changes nothing.
    """
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
