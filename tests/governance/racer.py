"""A router stand-in run as a separate process by the store tests: it races admissions or runs holds.

    python racer.py admit URL N   — prints "ready", waits for a line on stdin, then admits N priced calls
                                    at once and settles the executed ones; prints {"executed": k, ...}
    python racer.py run URL FILE  — runs approved holds, appending each run's request id to FILE,
                                    until stdin closes
    python racer.py churn URL N SEED — N calls, 16 at a time, each settled a moment later at its price,
                                    half of it, or failed; prints {"executed": k, "charged": micros,
                                    "leased": how many of the executed were admitted on leases, ...}
    python racer.py lease URL ROUTER TTL — as router ROUTER (leases expiring TTL seconds unrenewed), 20
                                    calls one after the other, each settled at $0.002; prints
                                    {"charged": micros} and waits (with its lease open) until stdin closes

All use the snapshot `cap_snapshot()` of `builders` (an org cap of $0.25), so every process decides the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from typing import Any

from reconciler.governance.gate import CallRequest, CallResult
from reconciler.governance.governed import GovernedGate
from reconciler.governance.leases import LeaseTerms
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import open_store
from tests.governance.builders import cap_snapshot, priced_call


async def admit(url: str, n: int) -> None:
    governor = GovernedGate(open_store(url))
    snapshot = cap_snapshot()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    admissions = await asyncio.gather(*(governor.admit(snapshot, priced_call(f"i{i % 7}")) for i in range(n)))
    executed = [a for a in admissions if a.status == "executed"]
    await asyncio.gather(*(governor.settle(a, None, True) for a in executed))
    counts: dict[str, Any] = {"executed": len(executed),
                              "blocked": sum(a.status == "blocked" for a in admissions),
                              "messages": sorted({a.message for a in admissions if a.status == "blocked"})}
    print(json.dumps(counts), flush=True)
    await governor.aclose()


async def churn(url: str, n: int, seed: int) -> None:
    governor = GovernedGate(open_store(url))
    snapshot = cap_snapshot()
    rng = random.Random(seed)  # noqa: S311 - a test's mix of outcomes, not a secret
    outcomes = [rng.choice([(True, 0.005), (True, 0.0025), (False, 0.0)]) for _ in range(n)]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    counts = {"executed": 0, "blocked": 0, "charged": 0, "leased": 0}
    calls = iter(range(n))

    async def worker(w: int) -> None:
        for i in calls:
            admission = await governor.admit(snapshot, priced_call(f"i{w}"))
            if admission.status != "executed":
                counts["blocked"] += 1
                continue
            counts["executed"] += 1
            counts["leased"] += bool(getattr(admission.ticket, "leased", ()))  # its price reserved on its leases
            await asyncio.sleep(rng.random() * 0.004)
            ok, cost = outcomes[i]
            counts["charged"] += to_micros((await governor.settle(admission, cost, ok)).charged)

    await asyncio.gather(*(worker(w) for w in range(16)))
    await governor.aclose()
    print(json.dumps(counts), flush=True)


async def lease(url: str, router: str, ttl: float) -> None:
    terms = LeaseTerms(lease_seconds=10.0, idle_seconds=3600.0, ttl_seconds=ttl)
    governor = GovernedGate(open_store(url), router_id=router, leases=terms)
    snapshot = cap_snapshot()
    charged = 0
    for _ in range(20):
        admission = await governor.admit(snapshot, priced_call("i1"))
        assert admission.status == "executed", admission
        charged += to_micros((await governor.settle(admission, 0.002, True)).charged)
        await asyncio.sleep(0.02)
    await governor.flush()
    print(json.dumps({"charged": charged}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until killed


async def run(url: str, path: str) -> None:
    governor = GovernedGate(open_store(url), poll_seconds=0.05)
    governor.use_snapshot(cap_snapshot())

    async def executor(call: CallRequest) -> CallResult:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{call.arguments['n']}\n".encode())
        finally:
            os.close(fd)
        return CallResult(True, {"done": call.arguments["n"]})

    await governor.start(executor)
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await governor.aclose()


if __name__ == "__main__":
    if sys.argv[1] == "admit":
        asyncio.run(admit(sys.argv[2], int(sys.argv[3])))
    elif sys.argv[1] == "churn":
        asyncio.run(churn(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    elif sys.argv[1] == "lease":
        asyncio.run(lease(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        asyncio.run(run(sys.argv[2], sys.argv[3]))
