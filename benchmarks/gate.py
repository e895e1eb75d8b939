"""The gate alone: CPU per admitted and settled call, uncapped (on its lane) and capped (against budget leases),
side by side in one process on SQLite (docs/architecture.md §10).

No router, no connector, no sockets: what `benchmarks/router.py`'s capped lines pay at the gate over the
uncapped ones, measured where a busy host moves it least (the process's own CPU time over many calls). With
`--profile`, the capped calls also run under cProfile and the functions they spend the most in are printed.

    .venv/bin/python benchmarks/gate.py [--calls 20000] [--rounds 4] [--profile]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: another checkout can be measured
from reconciler.config.snapshot import Snapshot
from reconciler.governance.governed import GovernedGate
from reconciler.governance.store import open_store
from tests.governance.builders import OWNERS_ORG, make_snapshot, priced_call


def snapshot(capped: bool) -> Snapshot:
    """Profile `p` (permissive); capped: under an org cap no run comes near, so every call is covered by leases."""
    org = {**OWNERS_ORG, "caps": {"monthly_usd": 1_000_000.0}} if capped else OWNERS_ORG
    return make_snapshot({"p": {"template": "permissive"}}, org=org)


async def calls(governor: GovernedGate, snap: Snapshot, count: int) -> float:
    """µs of this process's CPU per call, admitted and settled at its price."""
    call = priced_call()
    started = time.process_time()
    for _ in range(count):
        admission = await governor.admit(snap, call)
        await governor.settle(admission, None, True)
    if admission.status != "executed":
        raise SystemExit(f"the benchmark's call was not executed: {admission.message}")
    return (time.process_time() - started) / count * 1e6


async def measure(count: int, rounds: int, profile: cProfile.Profile | None) -> dict[str, list[float]]:
    store = open_store(f"sqlite:///{tempfile.mkdtemp(prefix='hb')}/gate.db")
    governor = GovernedGate(store, owns_store=True)
    lines = {"uncapped": snapshot(False), "capped": snapshot(True)}
    out: dict[str, list[float]] = {name: [] for name in lines}
    try:
        for snap in lines.values():
            await calls(governor, snap, 2000)  # warm-up: lanes, leases, plans
        for _ in range(rounds):
            for name, snap in lines.items():
                out[name].append(await calls(governor, snap, count))
        if profile is not None:
            profile.enable()
            await calls(governor, lines["capped"], count)
            profile.disable()
    finally:
        await governor.aclose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls of one line in one round (default 20,000)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the lines taking turns (default 4)")
    parser.add_argument("--profile", action="store_true", help="also profile the capped calls (cProfile)")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    out = asyncio.run(measure(args.calls, args.rounds, profile))
    for name, figures in out.items():
        print(
            f"  {name:<9} {statistics.median(figures):6.2f} µs CPU per call at the gate (rounds "
            f"{min(figures):.2f} to {max(figures):.2f})"
        )
    gap = statistics.median(out["capped"]) - statistics.median(out["uncapped"])
    print(f"  a capped call costs the gate {gap:.2f} µs more than an uncapped one")
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    main()
