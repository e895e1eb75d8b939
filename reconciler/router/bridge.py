"""`handler-service <interface>`: the stdio bridge an agent runs as its MCP server (docs/architecture.md §6).

It connects to the profile's socket (`--profile`, else `HANDLER_PROFILE`) under the run folder. The
`_meta` it names are the interface it serves (`handler/interface`) and, when set, the agent's
instance (`HANDLER_INSTANCE` → `handler/instance`) and the instance that started it
(`HANDLER_PARENT_INSTANCE` → `handler/parentInstance`). With `--no-builtins` it also says another entry of
the host's configuration serves the built-in tools (`handler/builtins`), so this one lists none of them and no
tool name appears twice in the host (docs/hosts.md).

It relays the session's lines both ways (`relaying`): the router binds those `_meta` to the session, and the
bridge, seeing every request and reply, answers each request exactly once whatever happens to the router — when
the router goes away (a restart, a crash) it answers each request left open with an error naming the restart,
waits for the next router (`--wait-seconds`) and goes on with the session there. A bridge started while the
service starts, or stops (docs/router.md "Stopping"), waits for its router the same way before the session
begins. With `--handover`, when its stdin and stdout are pipes or sockets, it hands both to the router instead (see
`handoff`) and follows the session (`lifeline`): one process fewer per message, but a router killed mid-call can
leave a call unanswered (docs/router.md "Exactly one reply"); where the router refuses the handoff, it relays. A
line over the size cap goes through as it is: the router answers it. When the agent closes stdin, the bridge closes its
sending side and waits for the replies still owed; when the agent stops reading, it exits.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from reconciler.liveness import NotOursError, holder_of
from reconciler.places import default_run_dir, socket_path, why_unreachable
from reconciler.router.handoff import is_stream_fd
from reconciler.router.lifeline import DEFAULT_WAIT_SECONDS, Lifeline, Refusal, next_router
from reconciler.router.openpage import make_page
from reconciler.router.relaying import Relay
from reconciler.wire.framing import DEFAULT_MAX_LINE_BYTES
from reconciler.wire.meta import caller_meta

__all__ = ["main"]

_CONNECT_PAUSE = 0.1  # seconds between tries of the profile's socket while a service starts


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="handler-service", description=(
        "Serve one interface of a profile over stdio, through the router's socket for that profile."))
    parser.add_argument("interface",
                        help="the interface to serve, e.g. ocr (or ocr/v1; 'handler' for the built-ins)")
    parser.add_argument("--profile", default=os.environ.get("HANDLER_PROFILE"),
                        help="the profile whose socket to use (default: $HANDLER_PROFILE)")
    parser.add_argument("--run-dir", type=Path, default=None, help="the router's run folder (default: "
                        "$HANDLER_RUN_DIR, else $XDG_RUNTIME_DIR/handler, else /tmp/handler-$UID)")
    parser.add_argument("--no-builtins", action="store_true",
                        help="leave out handler_status and handler_decide: another entry of the host's configuration "
                        "serves them (handler mcp-config writes a 'handler' entry for them)")
    parser.add_argument("--handover", action="store_true", default=os.environ.get("HANDLER_HANDOVER") == "1",
                        help="hand stdin and stdout to the router instead of relaying the session's lines: one "
                        "process fewer per message, but a router killed mid-call can leave a call unanswered "
                        "(docs/router.md \"Exactly one reply\"; also HANDLER_HANDOVER=1)")
    parser.add_argument("--relay", action="store_true", default=os.environ.get("HANDLER_RELAY") == "1",
                        help="relay the session's lines, every request answered exactly once (the default; it wins "
                        "over --handover; also HANDLER_RELAY=1)")
    parser.add_argument("--wait-seconds", type=float, default=_wait_default(), metavar="SECONDS",
                        help="when the router goes away (a restart), or is starting or stopping as this starts, "
                        "how long to wait for the next one before stopping (default "
                        f"{DEFAULT_WAIT_SECONDS:g}; also HANDLER_REATTACH_SECONDS)")
    args = parser.parse_args(argv)
    if closed := _closed_stream():
        # Checked before any socket is opened: it would take the free descriptor and pass for the agent's stdio.
        print(f"handler-service: {closed} is closed; start it with stdin and stdout open, as an MCP client does "
              "(pipes)", file=sys.stderr)
        return 2
    if not args.profile:
        print("handler-service: name the profile with --profile or HANDLER_PROFILE", file=sys.stderr)
        return 2
    try:
        meta = caller_meta(args.interface, os.environ, builtins=not args.no_builtins)
    except ValueError as exc:  # the router would refuse every call: say so before connecting
        print(f"handler-service: {exc}", file=sys.stderr)
        return 2
    run_dir = args.run_dir or default_run_dir()
    path = socket_path(run_dir, args.profile)
    try:
        sock = _connect(run_dir, args.profile, path, args.wait_seconds)
        if isinstance(sock, str):
            print(f"handler-service: {sock}", file=sys.stderr)
            return 1
        return _serve(sock, path, meta, args)
    except KeyboardInterrupt:
        return 130


def _connect(run_dir: Path, profile: str, path: Path, wait_seconds: float) -> socket.socket | str:
    """A connection to the profile's socket, or why there is none. Where no router listens yet but a service holds
    the run folder with no profile's socket open (one starting, or one stopping: a restart), the next router's socket
    is waited for, up to `wait_seconds`; where none does, the bridge stops at once, saying why."""
    deadline: float | None = None
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError as exc:
            sock.close()
            if deadline is None:
                if not _service_between_sockets(run_dir):
                    return why_unreachable(run_dir, profile, path, exc)
                print(f"handler-service: the service on {run_dir} is starting (or restarting); waiting up to "
                      f"{wait_seconds:g} s for its router at {path}", file=sys.stderr, flush=True)
                deadline = time.monotonic() + wait_seconds
            elif time.monotonic() >= deadline:
                return f"no router came to {path} within {wait_seconds:g} s; start one with `handler up`"
            time.sleep(_CONNECT_PAUSE)
            continue
        return sock


def _service_between_sockets(run_dir: Path) -> bool:
    """Whether a service holds the run folder and serves no profile's socket there: it is starting, or stopping."""
    profiles = run_dir / "profiles"
    try:
        return holder_of(run_dir) is not None and not (profiles.is_dir() and any(profiles.glob("*.sock")))
    except (OSError, NotOursError):  # a run folder not ours to look into: no service of ours
        return False


def _serve(sock: socket.socket, path: Path, meta: Mapping[str, str], args: argparse.Namespace) -> int:
    """Hand the agent's stdio over and follow the session, else relay it (`relaying`); the exit status."""
    page = _page() if args.handover and not args.relay and _can_hand_over() else None
    if page is not None:
        lifeline = Lifeline(path, meta, page, args.wait_seconds)
        taken = _open(sock, path, lifeline.hand_over, args.wait_seconds)
        if isinstance(taken, socket.socket):
            return lifeline.follow(taken)
        if taken is None:
            return 1
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # refused: the relay opens a connection of its own
        try:
            sock.connect(str(path))
        except OSError as exc:
            sock.close()
            print(f"handler-service: the router refused the handoff ({taken.message}) and then could not be reached "
                  f"({exc.strerror}); restart this MCP server in your host", file=sys.stderr, flush=True)
            return 1
    relay = Relay(path, meta, args.wait_seconds, DEFAULT_MAX_LINE_BYTES)
    taken = _open(sock, path, relay.attach, args.wait_seconds)
    if isinstance(taken, Refusal):
        print(f"handler-service: the router refused the session: {taken.message}", file=sys.stderr, flush=True)
        return 1
    return 1 if taken is None else relay.follow(taken)


def _open(sock: socket.socket, path: Path, attach: Callable[[socket.socket], Refusal | None],
          wait_seconds: float) -> socket.socket | Refusal | None:
    """The socket the session began on: `sock`'s, or, when that router is stopping (or went away as the bridge
    attached), the next router's (`next_router`; None when none came in time). A refusal for any other reason."""
    try:
        refused = attach(sock)
    except OSError:
        refused = Refusal("the router closed the connection", stopping=True)
    if refused is None:
        return sock
    sock.close()
    return next_router(path, wait_seconds, attach, first=True) if refused.stopping else refused


def _page() -> int | None:
    """The page of open calls for a handoff (`openpage`); None where the kernel makes none: the bridge relays."""
    try:
        return make_page()
    except OSError as exc:
        print(f"handler-service: no shared page for the session ({exc.strerror}); relaying its lines instead",
              file=sys.stderr, flush=True)
        return None


def _closed_stream() -> str | None:
    """The name of the first of stdin and stdout that is not an open descriptor, if one is not."""
    for fd, name in ((0, "stdin"), (1, "stdout")):
        try:
            os.fstat(fd)
        except OSError:
            return name
    return None


def _wait_default() -> float:
    try:
        return float(os.environ.get("HANDLER_REATTACH_SECONDS") or DEFAULT_WAIT_SECONDS)
    except ValueError:
        return DEFAULT_WAIT_SECONDS


def _can_hand_over() -> bool:
    """Whether stdin and stdout can be handed to the router: two pipes or sockets, which an event loop can watch
    (one socket both ways it cannot)."""
    try:
        stdin, stdout = os.fstat(0), os.fstat(1)
    except OSError:
        return False
    return is_stream_fd(stdin.st_mode) and is_stream_fd(stdout.st_mode) \
        and (stdin.st_dev, stdin.st_ino) != (stdout.st_dev, stdout.st_ino)


if __name__ == "__main__":
    sys.exit(main())
