"""How fast a change reaches agents: save → live, push + webhook → live, and reload time by tree size.

One run, three measurements, figures only (nothing asserted):
1. a saved profile file under `handler up` (work-tree watcher) until a new MCP session sees the new
   binding, repeated; goal < 1 s;
2. a pushed commit announced by a signed webhook under `handler up --source git` until a new session
   sees it; goal < 2 s;
3. the reconciler's load → check → plan → swap time after a one-file change, by tree size (the
   generated trees of benchmarks/trees.py), against a cold load of the same tree.

    python benchmarks/reconcile.py [--repeat N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
from trees import generate_tree  # noqa: E402

from reconciler.app import UpOptions, run_up  # noqa: E402
from reconciler.config import FolderSource, Loader  # noqa: E402
from reconciler.gitops.reconciling import ReconcileLoop  # noqa: E402
from reconciler.gitops.webhook import sign_body  # noqa: E402
from reconciler.router.server import Router  # noqa: E402
from reconciler.web.http import HttpListener  # noqa: E402
from tests.fixtures.echo_tree import TOKEN_ENV, add_other_binding, write_echo_tree  # noqa: E402
from tests.fixtures.echo_tree import select_binding as _select  # noqa: E402
from tests.fixtures.harness import RawClient  # noqa: E402

OTHER_ENV = "HANDLER_BENCH_TOKEN_B"
SECRET = b"bench"


def _tree(root: Path) -> Path:
    return add_other_binding(write_echo_tree(root), OTHER_ENV)


def _git(cwd: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=B", "-c", "user.email=b@example.org", *args], cwd=cwd, check=True, capture_output=True
    )


async def _token_of_new_session(socket: Path) -> str:
    client = await RawClient.connect(socket)
    result = await client.call("echo_token", {})
    await client.close()
    token: str = result["structuredContent"]["token"]
    return token


async def _until_new_session_sees(socket: Path, token: str, deadline: float = 20.0) -> float:
    start = time.perf_counter()
    while await _token_of_new_session(socket) != token:
        if time.perf_counter() - start > deadline:
            raise TimeoutError("the change never reached a new session")
        await asyncio.sleep(0.005)
    return time.perf_counter() - start


async def _measure(options: UpOptions, change: Callable[[int], object], repeat: int) -> list[float]:
    ready = asyncio.Event()
    parts: list[object] = []

    def on_ready(router: Router, reconciler: ReconcileLoop, listener: HttpListener) -> None:
        parts.extend([router, listener])
        ready.set()

    stop = asyncio.Event()
    task = asyncio.create_task(run_up(options, on_ready=on_ready, stop=stop))
    await asyncio.wait_for(ready.wait(), 30)
    router = parts[0]
    assert isinstance(router, Router)
    socket = router.socket_path("tester")
    times = []
    for i in range(repeat):
        start = time.perf_counter()
        awaitable = change(i)
        if asyncio.iscoroutine(awaitable):
            await awaitable
        await _until_new_session_sees(socket, "token-B" if i % 2 == 0 else "token-A")
        times.append(time.perf_counter() - start)
    stop.set()
    await task
    return times


def _line(label: str, times: list[float], goal: str) -> None:
    ms = sorted(t * 1000 for t in times)
    print(f"{label:44} p50 {statistics.median(ms):7.1f} ms  max {ms[-1]:7.1f} ms  ({goal})")


def _print_saved_file(base: Path, repeat: int) -> None:
    root = _tree(base / "w")
    worktree = UpOptions(root=str(root), run_dir=base / "r1", state_dir=base / "s1", http_port=0)
    saved = asyncio.run(
        _measure(worktree, lambda i: _select(root, "echo-other" if i % 2 == 0 else "echo-local"), repeat)
    )
    _line("saved file → first new session sees it", saved, "goal < 1000 ms")


def _make_git_options(base: Path) -> tuple[Path, UpOptions]:
    """A bare repository holding the tree, the clone that pushes to it, and `handler up --source git` options."""
    bare, clone = base / "cfg.git", base / "clone"
    _git(base, "init", "-q", "--bare", "-b", "main", str(bare))
    _git(base, "clone", "-q", str(bare), str(clone))
    _tree(clone)
    _git(clone, "add", "-A")
    _git(clone, "commit", "-qm", "first")
    _git(clone, "push", "-q", "origin", "HEAD:main")
    gitopts = UpOptions(
        root=str(bare),
        source="git",
        interval=3600,
        run_dir=base / "r2",
        state_dir=base / "s2",
        http_port=18765,
        webhook_secret=SECRET,
    )
    return clone, gitopts


def _print_pushed_commit(base: Path, repeat: int) -> None:
    clone, gitopts = _make_git_options(base)

    async def push(i: int) -> None:
        _select(clone, "echo-other" if i % 2 == 0 else "echo-local")
        _git(clone, "commit", "-qam", f"change {i}")
        _git(clone, "push", "-q", "origin", "HEAD:main")
        body = b'{"ref":"refs/heads/main"}'
        async with httpx.AsyncClient() as http:
            await http.post(
                "http://127.0.0.1:18765/hooks/git",
                content=body,
                headers={"X-Hub-Signature-256": sign_body(SECRET, body)},
            )

    pushed = asyncio.run(_measure(gitopts, push, repeat))
    _line("pushed commit + webhook → new session sees it", pushed, "goal < 2000 ms; includes commit and push")


def _print_reload(profiles: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = generate_tree(Path(tmp), interfaces=200, connectors=1000, profiles=profiles)
        past = time.time() - 60
        for path in root.rglob("*"):
            os.utime(path, (past, past))
        live: list[object] = []

        async def swap(snapshot: object, live: list[object] = live) -> int:
            live.append(snapshot)
            return len(live)

        reconciler = ReconcileLoop(FolderSource(root), swap, label="bench")
        cold_start = time.perf_counter()
        asyncio.run(reconciler.reconcile("start"))
        cold = time.perf_counter() - cold_start
        binding = root / "config/bindings/bind0000.toml"
        text = binding.read_text()
        reloads = []
        for i in range(5):
            binding.write_text(text.replace('description = "binding 0"', f'description = "edit {i}"'))
            attempt = asyncio.run(reconciler.reconcile("watch"))
            assert attempt.result == "applied", attempt
            reloads.append(attempt.duration_ms)
        print(
            f"  {profiles:5} profiles, 1000 bindings, 200 interfaces: reload p50 "
            f"{statistics.median(reloads):7.1f} ms, cold {cold * 1000:7.1f} ms "
            f"(cold / reload {cold * 1000 / statistics.median(reloads):5.1f}x)"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    os.environ[TOKEN_ENV], os.environ[OTHER_ENV] = "token-A", "token-B"
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="hb") as tmp:
        base = Path(tmp)
        _print_saved_file(base, args.repeat)
        _print_pushed_commit(base, args.repeat)

    print("\nreload after a one-file change, by tree size (load → check → plan → swap):")
    for profiles in (500, 2000, 5000):
        _print_reload(profiles)
    _ = Loader  # the loader is what the reconciler runs; imported for readers of this script


if __name__ == "__main__":
    main()
