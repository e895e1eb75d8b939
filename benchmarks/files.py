"""A call that carries a file, through the real router: the copy that keeps an input as it was, against the hard link
it replaced. Prints; asserts none.

First, how long the router takes to hand a file of `--mb` MiB in (`CallFolder.stage` then `remove`, the code every
call with a file runs; p50 of `--calls`), side by side:

- baseline, a hard link to the agent's file (what the router did before: no byte copied, but the connector read the
  agent's own file, and a descriptor it kept saw what the agent wrote after the call);
- a copy into a tmpfs, as a sandboxed connector's call space is (the kernel's `sendfile`, across filesystems);
- a copy on the scope's own filesystem, as the host's call folder of `--no-sandbox` is (`copy_file_range`: on Btrfs
  or XFS it shares the blocks, on ext4 it copies them).

Then three figures of whole calls, each the p50 of `--calls` calls of the echo connector's `echo_read` (it reads the
whole file and hashes it) on that file in the profile's scope:

- sandboxed: the file copied into the call space of its sandbox;
- --no-sandbox: the file copied into the host's call folder;
- direct: the same read and hash in this process, with no router: the floor.

Run: .venv/bin/python benchmarks/files.py [--mb N] [--calls N]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from reconciler.router.files import CallFolder, FileArg, FileField, Scope, open_input, resolve_files
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, serving, short_dir


async def through_router(root: Path, run_dir: Path, calls: int, sandbox: bool) -> float:
    async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
        client = await RawClient.connect(router.socket_path("tester"))
        await client.call("echo_read", {"path": "big.bin"})  # the process started, the page cache warm
        times = []
        for _ in range(calls):
            started = time.perf_counter()
            result = await client.call("echo_read", {"path": "big.bin"})
            times.append((time.perf_counter() - started) * 1000)
            assert result.get("isError") is False, result
        await client.close()
    return statistics.median(times)


def _checked(scope_dir: Path, name: str) -> tuple[FileArg, ...]:
    scope = Scope(str(scope_dir), os.path.realpath(scope_dir))
    return resolve_files((FileField(("path",), output=False),), {"path": name}, scope, None, frozenset())


def copied_in(scope_dir: Path, name: str, calls_dir: Path, calls: int) -> float:
    """p50 ms of copying `name` (in `scope_dir`) into a call folder under `calls_dir` and removing it again."""
    files = _checked(scope_dir, name)
    times = []
    for n in range(calls):
        started = time.perf_counter()
        folder = CallFolder(calls_dir, f"c{n}")
        args, _ = folder.stage(files, {"path": name}, None, frozenset())
        folder.remove()
        times.append((time.perf_counter() - started) * 1000)
        assert not Path(args["path"]).exists()
    return statistics.median(times)


def linked_in(scope_dir: Path, name: str, inbox: Path, calls: int) -> float:
    """p50 ms of the baseline: the file opened from the scope as the router opens it, hard-linked into an inbox,
    and the link removed again."""
    files = _checked(scope_dir, name)
    inbox.mkdir(parents=True, exist_ok=True)
    times = []
    for n in range(calls):
        started = time.perf_counter()
        fd, _ = open_input(files[0])
        dest = inbox / f"c{n}-0-{name}"
        os.link(f"/proc/self/fd/{fd}", dest, src_dir_fd=fd, follow_symlinks=True)
        os.close(fd)
        dest.unlink()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def direct(path: Path, calls: int) -> float:
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        hashlib.sha256(path.read_bytes()).hexdigest()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=20)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-token")
    with short_dir() as folder, short_dir() as run_dir:
        root = write_echo_tree(folder / "t", limits={"maxFileBytes": (args.mb + 1) << 20})
        big = root / "work/tester/big.bin"
        big.write_bytes(os.urandom(args.mb << 20))
        linked = linked_in(big.parent, big.name, folder / "inbox", args.calls)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
            to_tmpfs = copied_in(big.parent, big.name, Path(shm), args.calls)
        same_fs = copied_in(big.parent, big.name, folder / "calls", args.calls)
        boxed = asyncio.run(through_router(root, run_dir, args.calls, sandbox=True))
        copied = asyncio.run(through_router(root, run_dir, args.calls, sandbox=False))
        floor = direct(big, args.calls)
    print(f"handing a {args.mb} MiB file in to a connector (the router's file step, in and out), p50 of {args.calls}")
    print(f"  baseline: hard link to the agent's file (before): {linked:8.3f} ms")
    print(f"  copy into a tmpfs (a sandbox's call space):      {to_tmpfs:8.3f} ms   {to_tmpfs / linked:6.0f}x the link")
    print(f"  copy on the scope's filesystem (--no-sandbox):   {same_fs:8.3f} ms   {same_fs / linked:6.0f}x the link")
    print(f"a call carrying a {args.mb} MiB file (echo_read: read and hash it), p50 of {args.calls} calls")
    print(f"  sandboxed, copied into its call space:           {boxed:8.2f} ms   {boxed / floor:5.2f}x direct")
    print(f"  --no-sandbox, copied into the call folder:       {copied:8.2f} ms   {copied / floor:5.2f}x direct")
    print(f"  direct read and hash, no router:                 {floor:8.2f} ms")


if __name__ == "__main__":
    main()
