"""The first process inside a connector's namespaces: its view of the filesystem, loopback up, the
egress relay, the connector.

Run by the router as `unshare --net [--mount] -- python -m reconciler.connectors.netns_init
[--proxy SOCKET] [--fs VIEW] -- COMMAND...`.

With `--fs` (an `FsView` as JSON, in a private mount namespace), each frozen folder is bound onto
itself read-only, each hidden folder gets an empty tmpfs over it, and the folders the connector
needs are bound back in from descriptors opened before (writable or read-only); files named as
secrets get /dev/null over them. A mount that fails stops the start, saying which: a connector
never runs with less confinement than asked.

The network namespace has no route out. With `--proxy`, a relay on the namespace's own loopback
forwards each connection to the router's egress proxy through its unix socket (a path socket
crosses namespaces), and the connector gets HTTP(S)_PROXY pointing at the relay. The connector
inherits stdin, stdout and stderr, so MCP flows straight between it and the router; this process
forwards SIGTERM/SIGINT to it and exits with its status.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["FsView", "apply_view", "main"]

_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC = 1, 2, 4, 32, 4096, 16384

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


@dataclass(frozen=True, slots=True)
class FsView:
    """What a connector sees of the filesystem: each `hidden` folder is empty, except the `writable`
    and `readable` folders inside it, bound back in; each `frozen` folder is read-only; each
    `blanked` file reads as empty."""

    hidden: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    readable: tuple[str, ...] = ()
    blanked: tuple[str, ...] = ()
    frozen: tuple[str, ...] = ()

    _FIELDS = ("hidden", "writable", "readable", "blanked", "frozen")

    def to_arg(self) -> str:
        return json.dumps({name: getattr(self, name) for name in self._FIELDS})

    @classmethod
    def from_arg(cls, text: str) -> FsView:
        data = json.loads(text)
        return cls(*(tuple(str(p) for p in data.get(name, ())) for name in cls._FIELDS))


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | _IFF_UP))


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _relay(listener: socket.socket, proxy_path: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            upstream.connect(proxy_path)
        except OSError:
            client.close()
            upstream.close()
            continue
        for a, b in ((client, upstream), (upstream, client)):
            threading.Thread(target=_pipe, args=(a, b), daemon=True).start()


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    encoded = [v.encode() if v is not None else None for v in (source, target, fstype, data)]
    if libc.mount(encoded[0], encoded[1], encoded[2], ctypes.c_ulong(flags), encoded[3]) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot mount over {target}: {os.strerror(errno)}")


def _under(path: str, folders: Sequence[str]) -> bool:
    return any(path == f or path.startswith(f.rstrip("/") + "/") for f in folders)


def apply_view(view: FsView) -> None:
    """Freeze, hide, bind back, blank (see the module docstring). Needs its own mount namespace.

    Hiding and binding back go from the shallowest path to the deepest, so a folder bound back (the
    config tree, under a hidden /tmp) can still have a hidden folder inside it (the state folder),
    and that one a folder bound back again (the connector's own).
    """
    hidden = [h for h in set(view.hidden) if Path(h).is_dir()]
    kept = dict.fromkeys(view.writable, True) | {p: False for p in view.readable if p not in view.writable}
    kept = {p: w for p, w in kept.items() if Path(p).is_dir() and _under(p, hidden)}
    fds = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in kept}  # reachable once their parents are hidden
    cwd = Path.cwd()
    try:
        for folder in sorted(set(view.frozen), key=len):
            if Path(folder).is_dir():
                _mount(folder, folder, None, _MS_BIND | _MS_REC)
                _mount(None, folder, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
        steps: list[tuple[str, bool | None]] = [(h, None) for h in hidden] + list(kept.items())
        for path, writable in sorted(steps, key=lambda step: (len(step[0]), step[1] is not None)):
            if writable is None:
                if Path(path).is_dir():  # else it is already out of sight
                    _mount("tmpfs", path, "tmpfs", _MS_NOSUID | _MS_NODEV, "mode=0755")
                continue
            Path(path).mkdir(parents=True, exist_ok=True)
            _mount(f"/proc/self/fd/{fds[path]}", path, None, _MS_BIND | _MS_REC)
            if not writable:
                _mount(None, path, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY)
    finally:
        for fd in fds.values():
            os.close(fd)
    for file in view.blanked:
        if Path(file).is_file():  # as seen now: a secret inside a folder bound back is blanked too
            _mount("/dev/null", file, None, _MS_BIND)
    with contextlib.suppress(OSError):
        os.chdir(cwd)  # through the view: the folder bound back in, not the one hidden under it


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    proxy = view = None
    if args[:1] == ["--proxy"]:
        proxy, args = args[1], args[2:]
    if args[:1] == ["--fs"]:
        view, args = FsView.from_arg(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("netns_init: no command to run", file=sys.stderr)
        return 2
    if view is not None:
        try:
            apply_view(view)
        except OSError as exc:
            print(f"sandbox: {exc.strerror}; the connector was not started", file=sys.stderr)
            return 126
    _loopback_up()
    env = dict(os.environ)
    if proxy is not None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        threading.Thread(target=_relay, args=(listener, proxy), daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            env[name] = url
        for name in ("NO_PROXY", "no_proxy"):
            env.pop(name, None)
    child = subprocess.Popen(args, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
