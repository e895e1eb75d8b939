"""Files in calls (rule S4; docs/architecture.md §2 steps 4, 7 and 10): the agent's paths never reach a connector.

`find_file_fields` runs once per snapshot: it walks a tool's `inputSchema` for string properties
whose format is `handler-file` (an input) or `handler-output-file` (an output) and records where they
sit. Per call, `resolve_files` checks each such value inside the profile's scope: a `..` segment, a
path ending in `/` or `/.` (a folder's name), an absolute path outside the scope, a symbolic link
leading out of it, a missing input or one that is not a regular file (a folder, FIFO, device or
socket, told apart without reading it), an output over a FIFO, device, socket or symlink →
`invalid_arguments`; an input over `maxFileBytes` → the interface's
`too_large` (else `invalid_arguments`). At dispatch a `CallFolder` copies each input, as it is when
the call begins (its first checked bytes), into a per-call folder — in a sandboxed connector's call
space (`connectors.callspace`, a tmpfs counted against its `diskMb`), else the host's call folder —
so nothing the agent writes later reaches a descriptor the connector keeps; the copy is the kernel's
(`copy_file_range`, which shares the blocks where the filesystem can, else `sendfile`). It names the
copies (and fresh output paths) in the arguments the connector receives; after the call
it moves what the connector wrote into the scope at the paths the agent named, refusing a symlink, a
non-regular or oversize file or a missing one. Every open walks down from the scope's descriptor
without following a symlink (`beneath`), so what changed between the check and the copy is refused.
Paths in the connector's output are mapped back to the agent's.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Final

import orjson

from reconciler.places import remove_tree
from reconciler.router.beneath import RefusedPathError, describe_mode, open_folder, open_regular
from reconciler.router.errors import ToolError, invalid_arguments, unavailable

__all__ = ["CallFolder", "FileArg", "FileField", "Scope", "clear_leftovers", "find_file_fields", "resolve_files",
           "restore_paths"]

log = logging.getLogger("handler.router")

ANY: Final = "*"  # a path segment meaning every item of an array
INPUT_FORMAT: Final = "handler-file"
OUTPUT_FORMAT: Final = "handler-output-file"
_COPY_CHUNK = 1 << 20
_KERNEL_CHUNK = 1 << 30  # one copy_file_range or sendfile asks for at most this much

Where = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class FileField:
    """Where a file value sits in a tool's arguments (`ANY` for array items), and which way it goes."""

    path: Where
    output: bool


def find_file_fields(schema: Mapping[str, Any]) -> tuple[FileField, ...]:
    """Every `handler-file` / `handler-output-file` location of an input schema ($refs followed once)."""
    found: dict[FileField, None] = {}

    def walk(node: Any, path: Where, refs: frozenset[str]) -> None:
        if not isinstance(node, dict):
            return
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/") and ref not in refs:
            walk(_pointer_target(schema, ref), path, refs | {ref})
        fmt = node.get("format")
        if fmt in (INPUT_FORMAT, OUTPUT_FORMAT):
            found[FileField(path, fmt == OUTPUT_FORMAT)] = None
        for name, sub in (node.get("properties") or {}).items():
            walk(sub, (*path, name), refs)
        walk(node.get("items"), (*path, ANY), refs)
        for index, sub in enumerate(node.get("prefixItems") or ()):
            walk(sub, (*path, index), refs)
        for key in ("anyOf", "oneOf", "allOf"):
            for sub in node.get(key) or ():
                walk(sub, path, refs)

    walk(schema, (), frozenset())
    return tuple(found)


def _pointer_target(schema: Mapping[str, Any], ref: str) -> Any:
    node: Any = schema
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        node = node.get(part) if isinstance(node, dict) else None
    return node


def pointer(where: Where) -> str:
    """A JSON pointer naming an argument, for messages: /files/0."""
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in where)


@dataclass(frozen=True, slots=True)
class Scope:
    """A profile's work folder: as configured (absolute) and with its symbolic links resolved."""

    given: str
    real: str

    @classmethod
    def from_profile(cls, root: Path, scope: str) -> Scope:
        path = Path(scope).expanduser()
        given = os.path.normpath(path if path.is_absolute() else root.absolute() / path)
        return cls(given, os.path.realpath(given))

    def contains(self, real_path: str) -> bool:
        return real_path == self.real or real_path.startswith(self.real.rstrip("/") + "/")


@dataclass(frozen=True, slots=True)
class FileArg:
    """One file value of a call, checked: where it is, what the agent wrote, what it names on disk."""

    where: Where
    value: str
    target: str  # an input's real path; an output's absolute path in the scope
    output: bool
    size: int = 0
    root: str = "/"  # the real scope folder every open of `target` walks down from


def locate(node: Any, path: Where, where: Where = ()) -> Iterator[tuple[Where, Any]]:
    """The (concrete location, value) pairs a field path names in `node`."""
    if not path:
        yield where, node
        return
    head, rest = path[0], path[1:]
    if head == ANY:
        if isinstance(node, list):
            for index, item in enumerate(node):
                yield from locate(item, rest, (*where, index))
    elif isinstance(head, int):
        if isinstance(node, list) and head < len(node):
            yield from locate(node[head], rest, (*where, head))
    elif isinstance(node, dict) and head in node:
        yield from locate(node[head], rest, (*where, head))


def resolve_files(fields: tuple[FileField, ...], arguments: Mapping[str, Any], scope: Scope,
                  max_bytes: int | None, errors: frozenset[str]) -> tuple[FileArg, ...]:
    """Step 4: check every file value of `arguments` against `scope`; the first refusal ends the call."""
    out: list[FileArg] = []
    for field in fields:
        for where, value in locate(arguments, field.path):
            if not isinstance(value, str):
                continue  # input validation already refused a non-string
            if field.output:
                out.append(_resolve_output(scope, value, where))
            else:
                out.append(_resolve_input(scope, value, where, max_bytes, errors))
    return tuple(out)


def open_input(file: FileArg) -> tuple[int, int]:
    """An input file, opened from its scope's descriptor along the symlink-free path step 4 resolved."""
    relative = os.path.relpath(file.target, file.root)
    if relative == ".":
        raise RefusedPathError("a folder", final=True)
    return open_regular(file.root, relative.split("/"))


def _lexical(scope: Scope, value: str, where: Where) -> str:
    name = pointer(where)
    if not value or "\x00" in value:
        raise invalid_arguments(f"{name}: the path is empty or holds a NUL character; name a file in the work folder")
    if value.endswith(("/", "/.")):  # normpath drops the ending, which would leave a file where a folder was named
        ending = value[value.rindex("/"):]
        raise invalid_arguments(f"{name}: '{value}' ends in '{ending}', so it names a folder; name a file, without "
                                f"the '{ending}'")
    path = PurePosixPath(value)
    if ".." in path.parts:
        raise invalid_arguments(f"{name}: '{value}' contains '..'; name a path inside the work folder, relative to it")
    if not path.is_absolute():
        return os.path.normpath(os.path.join(scope.real, value))
    normal = os.path.normpath("/" + value.lstrip("/"))  # POSIX keeps a leading '//'; it names the same file as '/'
    for base in (scope.real, scope.given):
        if normal == base or normal.startswith(base.rstrip("/") + "/"):
            return scope.real + normal[len(base):]
    raise invalid_arguments(f"{name}: '{value}' is outside the work folder; give a path relative to the work folder")


def _leads_out(name: str, value: str) -> ToolError:
    return invalid_arguments(f"{name}: '{value}' leads outside the work folder through a symbolic link")


def _refused(name: str, value: str, refusal: RefusedPathError) -> ToolError:
    """The agent's account of a path the walk refused (docs/architecture.md §6: only regular files cross)."""
    if refusal.missing:
        return invalid_arguments(f"{name}: there is no file '{value}' in the work folder")
    if not refusal.final:
        return invalid_arguments(f"{name}: '{value}' goes through {refusal.kind}, which is never followed; "
                                 f"name a path of folders and a regular file in the work folder")
    return invalid_arguments(f"{name}: '{value}' is {refusal.kind}, not a regular file; "
                             f"only regular files are accepted")


def _resolve_input(scope: Scope, value: str, where: Where, max_bytes: int | None, errors: frozenset[str]) -> FileArg:
    name = pointer(where)
    real = os.path.realpath(_lexical(scope, value, where))
    if not scope.contains(real):
        raise _leads_out(name, value)
    file = FileArg(where, value, real, output=False, root=scope.real)
    try:
        fd, size = open_input(file)  # opened, never read: a FIFO or a device is refused before any read
    except RefusedPathError as refusal:
        raise _refused(name, value, refusal) from None
    os.close(fd)
    if max_bytes is not None and size > max_bytes:
        raise too_large(name, value, size, max_bytes, errors)
    return FileArg(where, value, real, output=False, size=size, root=scope.real)


def too_large(name: str, value: str, size: int, max_bytes: int, errors: frozenset[str]) -> ToolError:
    message = f"{name}: '{value}' is {size} bytes, over the {max_bytes} bytes this service accepts (maxFileBytes)"
    return ToolError("too_large", message) if "too_large" in errors else invalid_arguments(message)


def _resolve_output(scope: Scope, value: str, where: Where) -> FileArg:
    name = pointer(where)
    target = _lexical(scope, value, where)
    if target == scope.real:
        raise invalid_arguments(f"{name}: '{value}' names the work folder itself; name a file in it")
    existing = os.path.dirname(target)
    while not os.path.lexists(existing):
        existing = os.path.dirname(existing)
    real_parent = os.path.realpath(existing)
    if not scope.contains(real_parent):
        raise _leads_out(name, value)
    if not os.path.isdir(real_parent):
        raise invalid_arguments(f"{name}: '{value}' goes through a file as if it were a folder")
    target = os.path.join(real_parent, os.path.relpath(target, existing))  # no symlink left among its folders
    try:
        info = os.lstat(target)
    except FileNotFoundError:
        return FileArg(where, value, target, output=True, root=scope.real)
    if stat.S_ISLNK(info.st_mode) and not scope.contains(os.path.realpath(target)):
        raise _leads_out(name, value)
    if stat.S_ISDIR(info.st_mode):
        raise invalid_arguments(f"{name}: '{value}' is a folder; name a file")
    if not stat.S_ISREG(info.st_mode):  # a symlink, FIFO, device or socket is never written through
        raise _refused(name, value, RefusedPathError(describe_mode(info.st_mode), final=True))
    return FileArg(where, value, target, output=True, root=scope.real)


class CallFolder:
    """The per-call folder of a connector process: inputs copied in, outputs written there.

    It is made below `base` (the host's call folders of the binding), or in the connector's call space once
    `place` names it (`connectors.callspace`: the router's path into the sandbox, and the connector's path of it).
    With `owner` (the connector runs as its own uid: the router is root) the folders it must only read stay the
    router's, mode 0711, so it can neither list them nor rename what the router opens by path
    (docs/architecture.md §6): only `out/` is the connector's, and what it holds is opened without following a link.
    """

    def __init__(self, base: Path, call_id: str, owner: int | None = None) -> None:
        self.path = base / call_id
        self.inside = self.path  # the same folder as the connector names it
        self.call_id = call_id
        self.owner = owner
        self._space: int | None = None

    def place(self, space: tuple[Path, Path] | None) -> None:
        """Stage in the connector's call space, `(router's path, connector's path)`, when it has one. The space is
        opened again here, for this call alone: its path names a descriptor of the router's, which a stop of the
        connector closes and the next open may reuse, so the call never follows it after this."""
        if space is not None:
            self._space = os.open(space[0], os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self.path, self.inside = Path(f"/proc/self/fd/{self._space}", self.call_id), space[1] / self.call_id

    def stage(self, files: tuple[FileArg, ...], arguments: Mapping[str, Any],
              max_bytes: int | None, errors: frozenset[str]) -> tuple[dict[str, Any], dict[str, str]]:
        """Copy inputs in; the connector's arguments (naming the copies) and copy path → agent path."""
        self.path.mkdir(parents=True, mode=0o700)
        if self.owner is not None:
            self.path.chmod(0o711)
        args: dict[str, Any] = orjson.loads(orjson.dumps(arguments))  # a deep copy the connector may see
        back: dict[str, str] = {}
        for index, file in enumerate(files):
            sub = "out" if file.output else "in"
            name = _staged_name(index, file)
            folder = open_folder(str(self.path), (sub,), create=True, mode=0o700)
            try:
                if self.owner is not None:
                    _hand_over(folder, self.owner, mine=file.output)
            finally:
                os.close(folder)
            if not file.output:
                _copy_in(file, self.path, sub, name, max_bytes, errors, shared=self.owner is not None)
            dest = str(self.inside / sub / name)
            _set(args, file.where, dest)
            back[dest] = file.value
        return args, back

    def deliver(self, files: tuple[FileArg, ...], scope: Scope, max_bytes: int | None) -> None:
        """Step 10: move each output the connector wrote into the scope, at the path the agent named."""
        for index, file in enumerate(files):
            if file.output:
                _move_out(self.path, _staged_name(index, file), file, scope, max_bytes)

    def remove(self) -> None:
        """Remove the call's folder: its inputs, and whatever the connector left in `out/`."""
        try:
            remove_tree(self.path)
        except FileNotFoundError:  # its call space went with its sandbox
            pass
        except OSError as exc:  # kept, and said; the next start clears it (`clear_leftovers`)
            log.warning("could not remove the call folder %s: %s", self.inside, exc.strerror or exc)
        finally:
            space, self._space = self._space, None
            if space is not None:
                os.close(space)


def clear_leftovers(run_dir: Path) -> int:
    """Remove what the calls of a service that ended mid-call (a `kill -9`) left in its run folder: the
    `calls/<binding>/<call>/` folders of connectors run without a sandbox (a sandboxed one's calls are in its call
    space, which ends with its sandbox), and the inputs an older release hard-linked into `inbox/<binding>/`, which
    keep the agent's file alive. How many were removed (and logged).

    Only for the service holding the run folder's lock (`liveness.ServiceLock`), before it starts a connector:
    nothing else uses them then. Nothing is followed: a link found there is removed, not its target.
    """
    removed = 0
    for kind in ("inbox", "calls"):
        try:
            with os.scandir(run_dir / kind) as found:
                bindings = [entry.path for entry in found if entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            continue
        for binding in bindings:
            with os.scandir(binding) as found:
                left = [entry.path for entry in found]
            for path in left:
                try:
                    remove_tree(path)  # a folder and all it holds; a link or a file itself
                except OSError as exc:  # kept, and said: a start is not the place to fail over it
                    why = exc.strerror or str(exc)
                    log.warning("could not remove %s, left by a call the last service's end cut short: %s", path, why)
                    continue
                removed += 1
    if removed:
        log.warning("removed %d input links and call folders that calls cut short by the last service's end left "
                    "in %s", removed, run_dir)
    return removed


def _staged_name(index: int, file: FileArg) -> str:
    return f"{index}-{os.path.basename(file.target) or 'file'}"


def _set(node: Any, where: Where, value: str) -> None:
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value


def _hand_over(folder: int, owner: int, *, mine: bool) -> None:
    """`out/` becomes the connector's; `in/` stays ours, walkable (0711) but not listable by it."""
    opened = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=folder)  # `folder` may be O_PATH
    try:
        if mine:
            os.fchown(opened, owner, owner)
        else:
            os.fchmod(opened, 0o711)
    finally:
        os.close(opened)


def _copy_into(src: int, out_fd: int, size: int, *, shared: bool) -> None:
    """The first `size` bytes of the open file `src` (its size when it was checked against `maxFileBytes`: a file the
    agent grows meanwhile is cut there, never copied past it) into the new file `out_fd`, copied by the kernel; with
    `shared`, readable by a connector of another uid (which cannot change it)."""
    try:
        _kernel_copy(src, out_fd, size)  # a file cut short meanwhile: what is left of it, as a read would find
        if shared:
            os.fchmod(out_fd, 0o644)
    finally:
        os.close(out_fd)


def _kernel_copy(src: int, out_fd: int, size: int) -> int:
    """`copy_file_range` (blocks shared on a filesystem that can: Btrfs, XFS), else `sendfile` (another filesystem:
    the call space's tmpfs); no byte passes through this process. How many bytes were copied."""
    done = 0
    use_range = True
    while done < size:
        want = min(size - done, _KERNEL_CHUNK)
        if use_range:
            try:
                step = os.copy_file_range(src, out_fd, want, done, done)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise
                use_range = False
                continue
        else:
            os.lseek(out_fd, done, os.SEEK_SET)
            step = os.sendfile(out_fd, src, done, want)
        if step == 0:
            break
        done += step
    return done


def _copy_in(file: FileArg, call: Path, sub: str, dest: str, max_bytes: int | None, errors: frozenset[str], *,
             shared: bool = False) -> None:
    """An input copied into the call folder, opened again from the scope's descriptor: what changed since step 4
    (a folder swapped for a symlink, the file for a FIFO) is refused, never followed (docs/architecture.md §6)."""
    try:
        fd, size = open_input(file)
    except RefusedPathError as refusal:
        raise _refused(pointer(file.where), file.value, refusal) from None
    try:
        if max_bytes is not None and size > max_bytes:
            raise too_large(pointer(file.where), file.value, size, max_bytes, errors)
        folder = open_folder(str(call), (sub,), create=True, mode=0o700)
        try:
            out_fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=folder)
        finally:
            os.close(folder)
        try:
            _copy_into(fd, out_fd, size, shared=shared)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise unavailable("no_room", f"{pointer(file.where)}: no room for '{file.value}' ({size} bytes) in the "
                              "service's call folder (its connector's [sandbox] diskMb, which its calls in flight "
                              "share); retrying once they end may work") from None
    finally:
        os.close(fd)


def _open_staged(call: Path, staged: str, name: str) -> tuple[int, int]:
    """What the connector wrote, opened below the call folder without following a symlink or blocking on a FIFO."""
    try:
        return open_regular(str(call), ("out", staged))
    except RefusedPathError as refusal:
        if refusal.missing:
            raise unavailable("output_missing", f"the service reported success but wrote no file for {name}") from None
        raise unavailable("output_invalid", f"the service wrote something other than a regular file for {name}",
                          field=name) from None


def _move_out(call: Path, staged: str, file: FileArg, scope: Scope, max_bytes: int | None) -> None:
    name = pointer(file.where)
    fd, size = _open_staged(call, staged, name)
    with os.fdopen(fd, "rb") as src:
        if max_bytes is not None and size > max_bytes:
            raise unavailable("output_too_large", f"the service wrote {size} bytes for {name}, over maxFileBytes "
                              f"({max_bytes})", field=name)
        parts = os.path.relpath(file.target, scope.real).split("/")
        try:
            folder = open_folder(scope.real, parts[:-1], create=True, mode=0o755)
        except RefusedPathError as refusal:  # a folder changed under us since step 4
            raise _refused(name, file.value, refusal) from None
        try:
            _write_into(folder, parts[-1], src, name, file.value)
        finally:
            os.close(folder)


def _write_into(folder: int, leaf: str, src: BinaryIO, name: str, value: str) -> None:
    """`src` written to `leaf` of `folder` through a fresh temporary file renamed over it: the rename never
    follows or opens what is there, and a FIFO, device, socket or symlink there is refused first."""
    try:
        mode = os.stat(leaf, dir_fd=folder, follow_symlinks=False).st_mode
    except FileNotFoundError:
        mode = stat.S_IFREG
    if not stat.S_ISREG(mode):
        raise _refused(name, value, RefusedPathError(describe_mode(mode), final=True))
    tmp = f".handler-{secrets.token_hex(8)}"
    out_fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder)
    try:
        with os.fdopen(out_fd, "wb") as out:
            shutil.copyfileobj(src, out, _COPY_CHUNK)
            os.fchmod(out.fileno(), 0o644)
        os.replace(tmp, leaf, src_dir_fd=folder, dst_dir_fd=folder)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=folder)
        raise


def restore_paths(value: Any, back: Mapping[str, str]) -> Any:
    """`value` with every string equal to a connector-side path replaced by the agent's path."""
    if isinstance(value, str):
        return back.get(value, value)
    if isinstance(value, dict):
        return {k: restore_paths(v, back) for k, v in value.items()}
    if isinstance(value, list):
        return [restore_paths(v, back) for v in value]
    return value
