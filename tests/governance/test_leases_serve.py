"""Two `handler serve` processes share one store (SQLite, then PostgreSQL) and one cap for 50 calls.

200 agents call at once, 100 on each router; the connector charges exactly its declared maximum and
holds every call it gets until all 200 are decided. Exactly 50 run, 150 are blocked naming the cap,
and once both routers stop `handler spend` shows the cap spent to the micro-dollar.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, run, short_dir

HANDLER = str(Path(sys.executable).parent / "handler")
PRICE = 0.005  # echo_misbehave's [pricing]: the most one call may cost, and what the connector charges
CAP = 0.25  # the profile's monthly cap: exactly 50 calls
CALLS = 200


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_RUN_DIR"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as base:
        tree = write_echo_tree(base / "t", limits={"maxConcurrent": CALLS, "timeoutSeconds": 60})
        binding = tree / "config/bindings/echo-local.toml"
        priced = binding.read_text().replace("echo_say = 0.001\n", f"echo_say = 0.001\necho_misbehave = {PRICE}\n")
        binding.write_text(priced)
        profile = tree / "config/profiles/tester.toml"
        profile.write_text(profile.read_text() + f"\n[caps]\nmonthly_usd = {CAP}\n")
        yield tree


def _serve(root: Path, name: str, store: str) -> tuple[subprocess.Popen[str], Path]:
    """`handler serve` with a run and state folder of its own, on the shared store; its socket once it serves."""
    run_dir = root.parent / f"run-{name}"
    env = {**os.environ, "HANDLER_STORE_URL": store, "HANDLER_RUN_DIR": str(run_dir),
           "HANDLER_STATE_DIR": str(root.parent / f"state-{name}")}
    proc = subprocess.Popen([HANDLER, "serve", "--no-sandbox", str(root)], stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    said = []
    while not said or "tester on" not in said[-1]:
        line = proc.stderr.readline()
        assert line, "".join(said) + (proc.stderr.read() if proc.poll() is not None else "")
        said.append(line)
    return proc, run_dir / "profiles/tester.sock"


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if proc.stderr is not None:
        proc.stderr.close()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


async def _agents(sockets: list[Path], places: Path) -> list[dict[str, Any]]:
    """200 agents at once, alternating routers; the calls the connector holds are released once every call
    is decided: each blocked one has its answer, each admitted one has reached the connector."""
    release = places / "release"
    arrivals = [places / f"arrived-{n}" for n in range(len(sockets))]
    answers: list[dict[str, Any]] = []

    async def agent(i: int) -> dict[str, Any]:
        client = await RawClient.connect(sockets[i % 2])
        try:
            args = {"mode": "held", "cost": PRICE, "paths": [str(arrivals[i % 2]), str(release)]}
            result = await client.call("echo_misbehave", args, _meta={"handler/instance": f"agent-{i % 10}"})
        finally:
            await client.close()
        answers.append(result)
        return result

    tasks = [asyncio.create_task(agent(i)) for i in range(CALLS)]
    deadline = time.monotonic() + 60
    while len(answers) + sum(_lines(a) for a in arrivals) < CALLS:
        assert time.monotonic() < deadline, (len(answers), [_lines(a) for a in arrivals])
        await asyncio.sleep(0.02)
    assert len(answers) == CALLS - 50  # nothing executed yet: every admitted call is still held by its connector
    release.touch()
    return list(await asyncio.gather(*tasks))


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_200_calls_on_two_routers_against_a_cap_for_50_run_50_and_block_150_naming_the_cap(
        root: Path, backend: str, request: pytest.FixtureRequest) -> None:
    store = f"sqlite:///{root.parent / 'shared.db'}" if backend == "sqlite" else request.getfixturevalue("pg_url")
    routers = [_serve(root, "a", store), _serve(root, "b", store)]
    try:
        results = run(_agents([sock for _, sock in routers], root.parent), timeout=120)
    finally:
        for proc, _ in routers:
            _stop(proc)
    executed = [r for r in results if not r.get("isError")]
    blocked = [body(r) for r in results if r.get("isError")]
    assert len(executed) == 50
    assert {r["_meta"]["handler/cost"] for r in executed} == {PRICE}
    assert len(blocked) == 150
    assert {b["status"] for b in blocked} == {"blocked"}
    assert all(b["message"].startswith("Blocked by the profile monthly cap of profile tester:") for b in blocked), \
        blocked[0]
    spent = subprocess.run([HANDLER, "spend", "--root", str(root), "--format", "json"], capture_output=True, text=True,
                           timeout=60, check=True, env={**os.environ, "HANDLER_STORE_URL": store}).stdout
    rows = {r["scope"]: r for r in json.loads(spent)}
    assert rows["profile:tester"]["usd"] == CAP  # both routers returned their leases: what was spent, exactly
    assert rows["profile:tester"]["leased_usd"] == 0.0
