"""What a call costs the router in instructions and cache misses, open gate, governed and capped, under callgrind
(docs/architecture.md §10). Prints figures and ratios; asserts none.

`benchmarks/router.py` reads calls/s side by side, which is the goal's measure and moves with the host (its CPU, its
caches, its neighbours). This reads what a host moves least: the instructions the router's event loop runs a call,
and the first-level cache misses a simulated cache of one core takes for them (how the calls batch, which follows the
host's load, moves them by about 1%), for three routers of the same tree one after another: the open gate (every call
admitted at once), the governed router (SQLite) and the governed router with its profile capped (its calls admitted
against budget leases). Each serves 8 sessions of the echo tool, warms up with instrumentation off, then runs
`--calls` calls and 50 more a session with it on (each line says how many it counted).

Under valgrind a router runs some fifty times slower, so its clocks would come fifty times as often a call: the
backlog's flush (every 50 ms) and the lease keeper's ticks (every 0.1 s) and what they time. The governed routers
here run with every such period `--clock-scale` times longer, so each call's own cost is what is read; what the
clocks cost a call is in the side-by-side lines of `benchmarks/router.py`. The store's threads are counted apart.

Needs Debian's `valgrind` (callgrind and `callgrind_control`).

Run: .venv/bin/python benchmarks/instructions.py [--calls 4000] [--clock-scale 50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.router import SOCKET, Routers, capped_tree, concurrent_sessions, write_bench_files  # noqa: E402

# The governed router as `handler serve` starts it, every period of its governance `scale` times longer.
SERVE_SCALED = '''
import dataclasses, sys
from reconciler.cli import main
from reconciler.governance.governed import GovernedGate
from reconciler.governance.leases import LeaseTerms

scale = float(sys.argv[1])
made = GovernedGate.__init__
periods = {name: made.__kwdefaults__[name] * scale for name in ("batch_seconds", "poll_seconds")}


def scaled(self, store, *, leases=None, **options):
    terms = leases or LeaseTerms()
    terms = dataclasses.replace(terms, **{f.name: getattr(terms, f.name) * scale for f in dataclasses.fields(terms)})
    made(self, store, leases=terms, **{**options, **periods})


GovernedGate.__init__ = scaled
sys.argv = ["handler", "serve", *sys.argv[2:]]
sys.exit(main())
'''
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw")  # instructions; first-level instruction, data read and data write misses


def totals(path: Path) -> dict[str, int]:
    """The events a callgrind output file counts, by name."""
    names: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:"):
            counts = [int(count) for count in line.split()[1:]]  # the events a thread never had are left out
            return dict(zip(names, counts + [0] * (len(names) - len(counts)), strict=True))
    raise SystemExit(f"{path}: no totals line; is valgrind's callgrind what wrote it?")


def measure(routers: Routers, name: str, command: list[str], out: Path, calls: int, warmup: int) -> dict[str, float]:
    """One router under callgrind: its event loop's events a call (first-level data misses, read and write, as
    `D1`), its other threads' instructions a call, and how many calls it counted (`calls`)."""
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes", "--cache-sim=yes",
                f"--log-file={out}/valgrind-{name}.log", f"--callgrind-out-file={out}/{name}.out"]
    run_dir, pid = routers.start(name, valgrind + command)
    try:
        asyncio.run(concurrent_sessions(run_dir / SOCKET, 8, warmup))
        subprocess.run(["callgrind_control", "--instr=on", str(pid)], check=True, capture_output=True)
        served = asyncio.run(concurrent_sessions(run_dir / SOCKET, 8, calls))["calls"]
        subprocess.run(["callgrind_control", "--instr=off", str(pid)], check=True, capture_output=True)
        subprocess.run(["callgrind_control", "--dump", str(pid)], check=True, capture_output=True)
    finally:
        routers.stop(pid)
    threads = sorted(out.glob(f"{name}.out.1-*"))  # the dump: one file a thread, the event loop's first
    if not threads:
        raise SystemExit(f"callgrind wrote no dump for {name}: see {out}/valgrind-{name}.log")
    loop = totals(threads[0])
    figures = {event: loop[event] / served for event in EVENTS}
    figures["D1"] = figures.pop("D1mr") + figures.pop("D1mw")
    figures["others"] = sum(totals(path)["Ir"] for path in threads[1:]) / served
    figures["calls"] = served
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4000, help="counted calls a router, 8 sessions (default 4000)")
    parser.add_argument("--warmup", type=int, default=800, help="calls before counting (default 800)")
    parser.add_argument("--clock-scale", type=float, default=50.0,
                        help="how much longer the governed routers' periods are (default 50: valgrind's slowdown)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind, then run this again")
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="hbi"))
    root, env, _ = write_bench_files(base)
    (base / "serve_scaled.py").write_text(SERVE_SCALED)
    scaled = [sys.executable, str(base / "serve_scaled.py"), str(args.clock_scale)]
    lines = {"open": ("the open gate", [sys.executable, str(base / "serve_open.py"), str(root)]),
             "governed": ("governed, SQLite", [*scaled, str(root)]),
             "capped": ("governed, SQLite, profile capped", [*scaled, str(capped_tree(base))])}
    print(f"router instructions at 8 sessions under callgrind, counted after a warm-up; the governed routers' "
          f"periods {args.clock_scale:g}x longer; every router's PYTHONHASHSEED {env['PYTHONHASHSEED']}")
    results = {}
    routers = Routers(base, env)
    try:
        for name, (label, command) in lines.items():
            results[name] = found = measure(routers, name, command, base, args.calls, args.warmup)
            print(f"  {label:<34} {found['Ir']:9,.0f} instructions a call on the event loop, "
                  f"{found['I1mr']:6,.0f} instruction and {found['D1']:6,.0f} data cache misses (first level); "
                  f"its other threads {found['others']:7,.0f} instructions ({found['calls']:,.0f} calls counted)")
    finally:
        routers.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(base)
    print("\nAgainst the open gate (the open gate's figure over the line's: what side by side would read if time "
          "followed each):")
    open_gate = results["open"]
    for name in ("governed", "capped"):
        found = results[name]
        ratios = ", ".join(f"{event} {open_gate[event] / found[event]:.1%}" for event in ("Ir", "I1mr", "D1"))
        extra = found["Ir"] - open_gate["Ir"]
        print(f"  {lines[name][0]:<34} {ratios}; {extra:+,.0f} instructions a call")


if __name__ == "__main__":
    main()
