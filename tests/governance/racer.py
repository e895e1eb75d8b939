"""A router stand-in run as a separate process by the store tests: it races admissions or runs holds.

    python racer.py admit URL N   — prints "ready", waits for a line on stdin, then admits N priced calls
                                    at once and settles the executed ones; prints {"executed": k, ...}
    python racer.py run URL FILE  — runs approved holds, appending each run's request id to FILE,
                                    until stdin closes

Both use the snapshot `cap_snapshot()` of `builders`, so every process decides the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from reconciler.governance.gate import CallRequest, CallResult
from reconciler.governance.governor import Governor
from reconciler.governance.store import open_store
from tests.governance.builders import cap_snapshot, priced_call


async def admit(url: str, n: int) -> None:
    governor = Governor(open_store(url))
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


async def run(url: str, path: str) -> None:
    governor = Governor(open_store(url), poll_seconds=0.05)
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
    else:
        asyncio.run(run(sys.argv[2], sys.argv[3]))
