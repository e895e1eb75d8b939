"""Connector lifecycle costs through the real router, sandboxed and not, in one run. Prints figures; asserts none.

- cold: a session's first call to a binding whose process is not running (the start included:
  secrets, private folder, sandbox, handshake, tools/list comparison), to its result; the rounds
  alternate between a sandboxed router and a `--no-sandbox` one, so both see the same machine; as
  root, a start takes the process the pool parked in cgroups ahead of need (`connectors/parking.py`),
  and a third line takes none, as a start does when several begin at once;
- the floor: bubblewrap alone starting `true` in the same namespaces, against `true` started plainly;
- warm: the first call of a new session when the binding's process already runs;
- shared: calls/s with 8 sessions sharing the one process (each session one call at a time);
- then, per local connector (Tesseract, eSpeak NG, PocketSphinx, all-MiniLM-L6-v2), sandboxed, on its
  shipped binding: the cold first call (the process started and its engine or model loaded) and a warm
  call on the running process, with another input so no cache answers it.

Run: .venv/bin/python benchmarks/connectors.py [--rounds N] [--calls N] [--local-rounds N]
(the local connectors' environments are built first: `handler connector install`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, serving, short_dir
from tests.fixtures.vendor_trees import write_tree

REPO = Path(__file__).resolve().parent.parent
_OCR, _HEARD = REPO / "catalog/interfaces/ocr/v1/conformance", REPO / "catalog/interfaces/transcribe/v1/conformance"
# connector, its shipped binding, the interface, the tool, a cold input and a warm one (files copied in first)
LOCAL = (
    ("ocr-tesseract", "ocr-local", "ocr", "ocr_extract", {"path": "invoice.png"}, {"path": "invoice.pdf"}),
    ("tts-espeak", "tts-local", "tts", "tts_synthesize", {"text": "The meeting starts early.", "outputPath": "a.wav"},
     {"text": "Please send the report to the finance team.", "outputPath": "b.wav"}),
    ("transcribe-pocketsphinx", "transcribe-local", "transcribe", "transcribe_audio", {"path": "car.wav"},
     {"path": "train.wav"}),
    ("embed-local", "embed-local", "embed", "embed_texts", {"texts": ["cat", "kitten", "carburetor"]},
     {"texts": [f"sentence number {i} about invoices" for i in range(32)]}),
)


async def first_call_ms(root: Path, run_dir: Path, sandbox: bool, parked: bool = True) -> tuple[float, float]:
    """One round: a router of its own, whose first call starts the process cold; then a warm first call.
    `parked=False`: the start finds no parked spare and joins fresh cgroups itself."""
    out = []
    # Without parking, the pool is made as where no cgroups can be: no spare (a benchmark's switch, no setting).
    switch = mock.patch("reconciler.connectors.pool.Parking", return_value=None)
    with switch if not parked else contextlib.nullcontext():
        async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
            await asyncio.sleep(0.2)  # a quiet spell, as before a real first call
            for _ in range(2):
                client = await RawClient.connect(router.socket_path("tester"))
                started = time.perf_counter()
                await client.call("echo_say", {"text": "x"})
                out.append((time.perf_counter() - started) * 1000)
                await client.close()
    return out[0], out[1]


def bwrap_floor_ms(rounds: int) -> tuple[float, float]:
    """p50 of bubblewrap starting `true` in the sandbox's namespaces, and of `true` alone."""
    import shutil
    import subprocess

    bwrap = shutil.which("bwrap") or "bwrap"
    boxed = [bwrap, "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
             *([] if os.geteuid() == 0 else ["--unshare-user"]), "--die-with-parent", "--ro-bind", "/usr", "/usr",
             "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/bin", "/bin",
             "--proc", "/proc", "--dev", "/dev", "--", "/usr/bin/true"]
    times: dict[str, list[float]] = {"boxed": [], "plain": []}
    for _ in range(rounds):
        for name, command in (("boxed", boxed), ("plain", ["/usr/bin/true"])):
            started = time.perf_counter()
            subprocess.run(command, check=True)
            times[name].append((time.perf_counter() - started) * 1000)
    return statistics.median(times["boxed"]), statistics.median(times["plain"])


def cgroup_attach_ms(rounds: int) -> float | None:
    """p50 of a shell moving itself into a connector's pids and memory cgroups before it execs `true`, less the same
    shell without them: what the kernel takes to migrate a task (root only; None where no cgroup can be made).

    Each attempt follows a pause, as a connector's cold start does: on cgroup v1 the first migration after a
    quiet spell waits for an RCU grace period (about 10 ms here); migrations in quick succession do not."""
    import subprocess

    from reconciler.connectors.cgroups import make_cgroups

    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        groups = make_cgroups(f"bench-{os.getpid()}-{i}", 64, 1 << 30)
        if groups is None:
            return None
        try:
            for attach in (True, False):
                time.sleep(0.05)
                script = "".join(f'echo $$ > "{p}"; ' for p in groups.procs) if attach else ""
                started = time.perf_counter()
                subprocess.run(["/bin/sh", "-c", script + "exec /usr/bin/true"], check=True)
                times[attach].append((time.perf_counter() - started) * 1000)
        finally:
            groups.remove()
    return statistics.median(times[True]) - statistics.median(times[False])


async def shared_rate(root: Path, run_dir: Path, calls: int, sandbox: bool) -> tuple[float, int]:
    async with serving(root, run_dir, sandbox=sandbox, call_log=False) as router:
        clients = [await RawClient.connect(router.socket_path("tester")) for _ in range(8)]
        for c in clients:
            await c.call("echo_say", {"text": "warm"})

        async def drive(c: RawClient) -> None:
            for _ in range(calls // 8):
                await c.call("echo_say", {"text": "x"})

        started = time.perf_counter()
        await asyncio.gather(*(drive(c) for c in clients))
        elapsed = time.perf_counter() - started
        processes = len(router.services.pool.processes())
        for c in clients:
            await c.close()
    return (calls // 8) * 8 / elapsed, processes


async def local_calls_ms(root: Path, run_dir: Path, tool: str, cold: dict[str, object],
                         warm: dict[str, object]) -> tuple[float, float]:
    """A sandboxed router of its own: the first call starts the connector cold; the second finds it warm."""
    out = []
    async with serving(root, run_dir, call_log=False) as router:
        client = await RawClient.connect(router.socket_path("tester"))
        for arguments in (cold, warm):
            started = time.perf_counter()
            result = await client.call(tool, arguments)
            out.append((time.perf_counter() - started) * 1000)
            if result.get("isError"):
                raise SystemExit(f"{tool} failed: {result}")
        await client.close()
    return out[0], out[1]


def local_connectors(rounds: int, runner: Callable[[Coroutine[Any, Any, tuple[float, float]]], tuple[float, float]],
                     ) -> None:
    print(f"local connectors (sandboxed, shipped binding, {rounds} rounds each; p50, min..max)")
    print(f"{'':26}{'cold first call ms':>26}{'warm call ms':>22}")
    for name, binding, interface, tool, cold, warm in LOCAL:
        times: tuple[list[float], list[float]] = ([], [])
        with short_dir() as folder, short_dir() as run_dir:
            text = (REPO / f"config/bindings/{binding}.toml").read_text()
            root = write_tree(folder / "t", binding, text, interface)
            for source in (*_OCR.glob("invoice.*"), *_HEARD.glob("*.wav")):
                (root / "work/tester" / source.name).write_bytes(source.read_bytes())
            for _ in range(rounds):
                c, w = runner(local_calls_ms(root, run_dir, tool, cold, warm))
                times[0].append(c)
                times[1].append(w)
        shown = [f"{statistics.median(t):8.0f} ({min(t):.0f}..{max(t):.0f})" for t in times]
        print(f"{name:26}{shown[0]:>26}{shown[1]:>22}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=8000)
    parser.add_argument("--local-rounds", type=int, default=3, help="rounds per local connector (0: skip them)")
    args = parser.parse_args()
    os.environ.setdefault(TOKEN_ENV, "bench-token")
    try:
        import uvloop
        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    cold: dict[bool, list[float]] = {True: [], False: []}
    warm: dict[bool, list[float]] = {True: [], False: []}
    unparked: list[float] = []
    rates = {}
    with short_dir() as folder, short_dir() as run_dir:
        root = write_echo_tree(folder / "t")
        runner(first_call_ms(root, run_dir, True))  # once unmeasured: the page cache, the seccomp program
        for _ in range(args.rounds):
            for sandbox in (True, False):
                c, w = runner(first_call_ms(root, run_dir, sandbox))
                cold[sandbox].append(c)
                warm[sandbox].append(w)
            if os.geteuid() == 0:
                unparked.append(runner(first_call_ms(root, run_dir, True, parked=False))[0])
        for sandbox in (True, False):
            rates[sandbox] = runner(shared_rate(root, run_dir, args.calls, sandbox))
    boxed, plain = bwrap_floor_ms(args.rounds * 2)
    who = "root: each connector its own uid" if os.geteuid() == 0 else "an ordinary user: a user namespace"
    print(f"connector lifecycle (echo connector, {args.rounds} rounds each, the router as {who})")
    print(f"{'':36}{'sandboxed':>12}{'--no-sandbox':>14}{'added':>10}{'ratio':>8}")
    p50 = {k: statistics.median(v) for k, v in cold.items()}
    print(f"{'cold first call (start included) ms':36}{p50[True]:12.1f}{p50[False]:14.1f}"
          f"{p50[True] - p50[False]:10.1f}{p50[True] / p50[False]:8.2f}   (goal: added <= 20 ms)")
    if unparked:
        u50 = statistics.median(unparked)
        print(f"{'  the same, no parked spare, ms':36}{u50:12.1f}{p50[False]:14.1f}{u50 - p50[False]:10.1f}"
              f"{u50 / p50[False]:8.2f}")
    w50 = {k: statistics.median(v) for k, v in warm.items()}
    print(f"{'warm first call (new session) ms':36}{w50[True]:12.3f}{w50[False]:14.3f}"
          f"{w50[True] - w50[False]:10.3f}{w50[True] / w50[False]:8.2f}")
    print(f"{'8 sessions, one process, calls/s':36}{rates[True][0]:12,.0f}{rates[False][0]:14,.0f}"
          f"{'':10}{rates[True][0] / rates[False][0]:8.2f}")
    print(f"{'floor: bwrap true vs true, ms':36}{boxed:12.1f}{plain:14.1f}{boxed - plain:10.1f}{boxed / plain:8.2f}")
    attach = cgroup_attach_ms(args.rounds * 2)
    if attach is not None:
        print(f"{'joining fresh cgroups, ms':36}{attach:12.1f}   (the kernel's task migration, root only: "
              "a parked spare pays it ahead of need)")
    if args.local_rounds > 0:
        print()
        local_connectors(args.local_rounds, runner)


if __name__ == "__main__":
    main()
