"""A process parked in cgroups ahead of need (root only): a start takes it, bound as its binding; the next one
is parked after; a restart and a start that finds none join cgroups themselves; nothing is left at close."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from unittest import mock

import pytest

from reconciler.connectors.cgroups import make_cgroups, sweep_stale
from reconciler.connectors.parking import Parking
from reconciler.connectors.sandbox import limits_for
from tests.fixtures.harness import RawClient, load, run, serving

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="cgroups, and so parked processes, are root's")


def pids_leaf(pid: int) -> Path:
    """The `pids` cgroup a process is in."""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/")
    raise AssertionError(f"process {pid} is in no pids cgroup")


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


async def eventually(check: object, seconds: float = 10.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if check():  # type: ignore[operator]
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {seconds} s: {check}")


def test_a_start_runs_in_the_parked_spare_bound_as_its_binding_and_nothing_is_left(echo_root: Path,
                                                                                      run_dir: Path) -> None:
    limits = limits_for(load(echo_root).connectors["echo"].spec.sandbox)
    seen: dict[str, object] = {}

    async def scenario() -> None:
        async with serving(echo_root, run_dir) as router:
            pool = router.services.pool
            spare = pool.parked()
            assert spare is not None  # parked at the router's start
            spare_leaf = pids_leaf(spare)
            assert spare_leaf.name.startswith("spare.")
            client = await RawClient.connect(router.socket_path("tester"))
            said = await client.call("echo_say", {"text": "from a parked start"})
            assert said["structuredContent"] == {"text": "from a parked start"}
            assert pool.processes() == [spare]  # the spare became the connector's sandbox, in place
            assert pids_leaf(spare) == spare_leaf
            assert int((spare_leaf / "pids.max").read_text()) == limits.processes  # bound as its binding now
            await eventually(lambda: pool.parked() not in (None, spare))  # the next one, off the start's path
            following = pool.parked()
            assert following is not None
            seen.update(following=following, leaves=(spare_leaf, pids_leaf(following)))

            # A crash: the same launch restarts the usual way, its shell joining the same leaves.
            await client.call("echo_misbehave", {"mode": "die"})
            again = await client.call("echo_say", {"text": "again"})
            assert again["structuredContent"] == {"text": "again"}
            [restarted] = pool.processes()
            assert restarted != spare
            assert pids_leaf(restarted) == spare_leaf
            await client.close()

    run(scenario())
    following = seen["following"]
    assert isinstance(following, int)
    assert not alive(following)  # the unused spare ended with the router
    assert not any(leaf.exists() for leaf in seen["leaves"])  # type: ignore[attr-defined]


def test_a_start_that_finds_no_spare_joins_fresh_cgroups_itself(echo_root: Path, run_dir: Path) -> None:
    limits = limits_for(load(echo_root).connectors["echo"].spec.sandbox)

    async def scenario() -> None:
        with mock.patch("reconciler.connectors.pool.Parking", return_value=None):
            async with serving(echo_root, run_dir) as router:
                client = await RawClient.connect(router.socket_path("tester"))
                said = await client.call("echo_say", {"text": "the usual way"})
                assert said["structuredContent"] == {"text": "the usual way"}
                [pid] = router.services.pool.processes()
                leaf = pids_leaf(pid)
                assert not leaf.name.startswith("spare.")
                assert leaf.name.startswith("echo-local.")  # named after its launch folder
                assert int((leaf / "pids.max").read_text()) == limits.processes
                await client.close()

    run(scenario())


def test_one_spare_at_a_time_and_a_closed_parking_ends_it() -> None:
    async def scenario() -> None:
        parking = Parking()
        await parking.start()
        spare = parking.take(16, 64 << 20)
        assert spare is not None
        assert parking.take(16, 64 << 20) is None  # the next one is not parked yet
        assert int(Path(spare.cgroups.procs[0]).with_name("pids.max").read_text()) == 16
        spare.discard()
        assert not alive(spare.popen.pid)
        assert not any(leaf.exists() for leaf in spare.cgroups.leaves)
        await eventually(lambda: parking.parked is not None)
        following = parking.parked
        assert following is not None
        await parking.aclose()
        assert not alive(following)

    run(scenario())


def test_a_pools_start_sweeps_empty_leaves_a_killed_router_left_and_nothing_in_use() -> None:
    left = make_cgroups(f"left-by-a-killed-router.{os.getpid()}", 8, 64 << 20)  # its connector gone, it stayed
    assert left is not None

    async def scenario() -> None:
        parking = Parking()
        await parking.start()  # swept only what is a minute old: this one is not yet
        assert all(leaf.exists() for leaf in left.leaves)
        spare = parking.parked
        assert spare is not None
        await asyncio.sleep(1.1)
        assert sweep_stale(min_age=1.0) >= 1
        assert not any(leaf.exists() for leaf in left.leaves)
        assert pids_leaf(spare).exists()  # a leaf in use is never swept
        assert alive(spare)
        await parking.aclose()

    try:
        run(scenario())
    finally:
        left.remove()


def test_a_spare_that_died_is_not_taken_and_its_leaves_go() -> None:
    async def scenario() -> None:
        parking = Parking()
        await parking.start()
        pid = parking.parked
        assert pid is not None
        leaves = [pids_leaf(pid)]
        os.kill(pid, 9)
        await eventually(lambda: not alive(pid) or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2])
        assert parking.take(16, 64 << 20) is None  # the start goes the usual way
        await eventually(lambda: not any(leaf.exists() for leaf in leaves))
        await parking.aclose()

    run(scenario())
