"""The spare's own program: a process parked in fresh cgroups until a connector's start hands it its sandbox
(docs/architecture.md §6).

Run by `parking.Parking` as `python -I -S spare.py CGROUP.PROCS...`, standalone (the standard library
only, nothing of the service imported, so it starts in a few milliseconds). It writes its own pid into
each leaf's `cgroup.procs` — the kernel's task migration, which on cgroup v1 waits for an RCU grace
period after a quiet spell, is paid here, ahead of need — then writes one byte to stdout to say it is
ready and waits on stdin. When a start takes it, the router sends one order (an 8-byte big-endian
length, then JSON: argv, env, cwd, the seccomp program, whether stdin and stdout are the connector's
MCP pipes): it moves to the folder, opens the seccomp program on descriptor 9 as bubblewrap's
`--seccomp 9` expects, and executes the sandbox in place, so every process of the connector is born
in the leaves. End of stdin before an order (the router stopped, or closed the spare) ends it.
"""

import json
import os
import sys

_SECCOMP_FD = 9


def _read(size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = os.read(0, size - len(data))
        if not chunk:
            return b""
        data += chunk
    return data


def main(procs: list[str]) -> int:
    pid = str(os.getpid())
    for path in procs:
        try:
            leaf = os.open(path, os.O_WRONLY)
            try:
                os.write(leaf, pid.encode())
            finally:
                os.close(leaf)
        except OSError as exc:
            os.write(2, f"parked: cannot join the cgroup {path}: {exc.strerror}\n".encode())
            return 125
    os.write(1, b"\0")
    size = _read(8)
    if not size:
        return 0
    order = json.loads(_read(int.from_bytes(size, "big")))
    os.chdir(order["cwd"])
    seccomp = os.open(order["seccomp"], os.O_RDONLY)
    if seccomp != _SECCOMP_FD:
        os.dup2(seccomp, _SECCOMP_FD)
        os.close(seccomp)
    os.set_inheritable(_SECCOMP_FD, True)
    if not order["pipes"]:  # a socket connector: no MCP on its stdio
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
    argv = order["argv"]
    try:
        os.execve(argv[0], argv, order["env"])  # noqa: S606 - the sandbox the router built, as its shell would
    except OSError as exc:
        os.write(2, f"parked: cannot run {argv[0]}: {exc.strerror}\n".encode())
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
