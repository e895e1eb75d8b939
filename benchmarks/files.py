"""A call that carries a file, through the real router: the inbox's hard link against the copy. Prints; asserts none.

First, how long the router takes to hand a file of `--mb` MiB in (`CallFolder.stage` then `remove`, the code
every call with a file runs; p50 of `--calls`), goal <= 1 ms when the scope and the inbox share a filesystem:

- same filesystem: the file is hard-linked into the binding's read-only inbox (no byte copied);
- another filesystem (the inbox on /dev/shm): the file is copied, as every call did before the inbox.

Then three figures of whole calls, each the p50 of `--calls` calls of the echo connector's `echo_read` (it
reads the whole file and hashes it) on that file in the profile's scope:

- sandboxed: the file reaches the connector through the inbox (hard-linked);
- --no-sandbox: the file is copied into the call folder;
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

from reconciler.router.files import CallFolder, FileField, Scope, resolve_files
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


def hand_in(scope_dir: Path, name: str, inbox: Path, calls: int) -> float:
    """p50 ms of handing `name` (in `scope_dir`) into `inbox` and taking it out again, as a call's file step does."""
    scope = Scope(str(scope_dir), os.path.realpath(scope_dir))
    files = resolve_files((FileField(("path",), output=False),), {"path": name}, scope, None, frozenset())
    inbox.mkdir(parents=True, exist_ok=True)
    times = []
    for n in range(calls):
        started = time.perf_counter()
        folder = CallFolder(inbox.parent / "calls", f"c{n}", inbox=inbox)
        args, _ = folder.stage(files, {"path": name}, None, frozenset())
        times.append((time.perf_counter() - started) * 1000)
        assert Path(args["path"]).stat().st_size == files[0].size
        folder.remove()
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
        linked = hand_in(big.parent, big.name, folder / "inbox", args.calls)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
            copied_in = hand_in(big.parent, big.name, Path(shm) / "inbox", args.calls)
        boxed = asyncio.run(through_router(root, run_dir, args.calls, sandbox=True))
        copied = asyncio.run(through_router(root, run_dir, args.calls, sandbox=False))
        floor = direct(big, args.calls)
    print(f"handing a {args.mb} MiB file in to a connector (the router's file step), p50 of {args.calls}")
    print(f"  inbox on the scope's filesystem, hard link:    {linked:8.3f} ms   (goal <= 1 ms)")
    print(f"  inbox on another filesystem, copy:            {copied_in:8.3f} ms   {copied_in / linked:6.0f}x the link")
    print(f"a call carrying a {args.mb} MiB file (echo_read: read and hash it), p50 of {args.calls} calls")
    print(f"  sandboxed, hard link into the read-only inbox: {boxed:8.2f} ms   {boxed / floor:5.2f}x direct")
    print(f"  --no-sandbox, copied into the call folder:     {copied:8.2f} ms   {copied / floor:5.2f}x direct")
    print(f"  direct read and hash, no router:               {floor:8.2f} ms")


if __name__ == "__main__":
    main()
