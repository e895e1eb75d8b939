"""The egress relay: the first process inside the sandbox of a connector that may reach the network.

Run by the sandbox (`sandbox.boxed`) as `python -m reconciler.connectors.relay --proxy SOCKET
[--forward ADDRESS:PORT=HOST:PORT ...] [--uid UID] -- COMMAND...`.

The sandbox's network namespace has only its loopback. The relay listens there and carries each
connection to the router's egress proxy (`egress.EgressProxy`) through its unix socket, a path bound
into the sandbox, as the proxy's own `CONNECT` or plain-HTTP request:

- an HTTP proxy on 127.0.0.1 (a port of its own), which the connector gets as HTTP(S)_PROXY;
- one raw TCP forward per egress entry that names an exact host and port (`smtp.example.com:587`),
  for clients that ignore HTTP proxies (`smtplib`): the sandbox's `/etc/hosts` maps the host to a
  loopback address of its own, where the relay listens on that port and sends each connection on as
  `CONNECT host:port`. The proxy, not the relay, decides what is allowed.

Once its listeners are bound (ports under 1024 need the one capability the sandbox leaves it), it
gives up what it holds: with `--uid` (the router is root) it becomes that uid and gid, which clears
every capability; otherwise it clears its ambient capabilities so the connector starts with none. It
forwards SIGTERM/SIGINT/SIGHUP to the connector and exits with its status.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["Forward", "RelayArgs", "main", "parse_args"]

_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
_MAX_REPLY_HEAD = 16 * 1024


@dataclass(frozen=True, slots=True)
class Forward:
    listen: str  # the loopback address in the sandbox
    port: int
    target: str  # host:port, as the egress entry names it

    def to_arg(self) -> str:
        return f"{self.listen}:{self.port}={self.target}"

    @classmethod
    def from_arg(cls, text: str) -> Forward:
        listen, _, target = text.partition("=")
        address, _, port = listen.rpartition(":")
        return cls(address, int(port), target)


@dataclass
class RelayArgs:
    proxy: str = ""
    forwards: list[Forward] = field(default_factory=list)
    uid: int | None = None
    command: list[str] = field(default_factory=list)


def parse_args(argv: Sequence[str]) -> RelayArgs:
    out = RelayArgs()
    args = list(argv)
    while args and args[0] != "--":
        flag, value, args = args[0], args[1], args[2:]
        if flag == "--proxy":
            out.proxy = value
        elif flag == "--forward":
            out.forwards.append(Forward.from_arg(value))
        elif flag == "--uid":
            out.uid = int(value)
        else:
            raise ValueError(f"relay: unknown option {flag}")
    out.command = args[1:]
    return out


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _splice(a: socket.socket, b: socket.socket) -> None:
    threading.Thread(target=_pipe, args=(b, a), daemon=True).start()
    _pipe(a, b)


def _upstream(proxy: str) -> socket.socket:
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    upstream.connect(proxy)
    return upstream


def _serve_proxy(client: socket.socket, proxy: str) -> None:
    """A connection to the HTTP proxy: passed through as it is (the egress proxy reads the request)."""
    with client, _upstream(proxy) as upstream:
        _splice(client, upstream)


def _serve_forward(client: socket.socket, proxy: str, target: str) -> None:
    """A connection to a raw forward: `CONNECT target` first; on 200, the bytes both ways."""
    with client, _upstream(proxy) as upstream:
        upstream.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < _MAX_REPLY_HEAD:
            chunk = upstream.recv(4096)
            if not chunk:
                return
            head += chunk
        status = head.split(b"\r\n", 1)[0].split()
        if len(status) < 2 or status[1] != b"200":
            return  # refused: the connector sees its connection closed
        rest = head.split(b"\r\n\r\n", 1)[1]
        if rest:
            client.sendall(rest)
        _splice(client, upstream)


def _accept(listener: socket.socket, serve: object, *args: str) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(client, *args), daemon=True).start()  # type: ignore[arg-type]


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port))
    listener.listen(64)
    return listener


def _give_up_privileges(uid: int | None) -> None:
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)  # from root to another uid: every capability set is cleared
    else:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not args.command or not args.proxy:
        print("relay: usage: relay --proxy SOCKET [--forward ADDR:PORT=HOST:PORT] [--uid UID] -- COMMAND",
              file=sys.stderr)
        return 2
    try:
        http = _listen("127.0.0.1", 0)
        forwards = [(_listen(f.listen, f.port), f.target) for f in args.forwards]
        _give_up_privileges(args.uid)
    except OSError as exc:
        print(f"sandbox: the egress relay could not start ({exc}); the connector was not started", file=sys.stderr)
        return 126
    threading.Thread(target=_accept, args=(http, _serve_proxy, args.proxy), daemon=True).start()
    for listener, target in forwards:
        threading.Thread(target=_accept, args=(listener, _serve_forward, args.proxy, target), daemon=True).start()
    env = dict(os.environ)
    url = f"http://127.0.0.1:{http.getsockname()[1]}"
    env.update(dict.fromkeys(_PROXY_VARS, url))
    for name in ("NO_PROXY", "no_proxy"):
        env.pop(name, None)
    child = subprocess.Popen(args.command, env=env)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    code = child.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
