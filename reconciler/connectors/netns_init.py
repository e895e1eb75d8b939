"""The first process inside a connector's network namespace: loopback up, the egress relay, the connector.

Run by the router as `unshare --net -- python -m reconciler.connectors.netns_init [--proxy SOCKET]
-- COMMAND...`. The namespace has no route out. With `--proxy`, a relay on the namespace's own
loopback forwards each connection to the router's egress proxy through its unix socket (a path
socket crosses namespaces), and the connector gets HTTP(S)_PROXY pointing at the relay. The
connector inherits stdin, stdout and stderr, so MCP flows straight between it and the router; this
process forwards SIGTERM/SIGINT to it and exits with its status.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence

__all__ = ["main"]

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


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


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    proxy = None
    if args[:1] == ["--proxy"]:
        proxy, args = args[1], args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("netns_init: no command to run", file=sys.stderr)
        return 2
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
