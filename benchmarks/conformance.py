"""The conformance runner in parallel: a suite of 200+ items against a fast connector, 1 vs 2 workers.

Builds a tree with the interface `bench/v1` (T text tools, C cases) served by the test suite's
`shout` connector (plain stdio JSON-RPC, no SDK: it answers in well under a millisecond, so the
figures are the runner's), then runs `handler connector check` on it with `-n 1` and `-n 2` and
prints the wall time of each, the ratio, and fuzz examples per second (per worker, and overall).
Items: C cases + T fuzzed tools + T refusal sets. Prints; asserts nothing. Goal on the 2-core
reference machine: >= 1.7x from 1 to 2 workers. A run pays a fixed start-up either way (the CLI,
pytest, each worker's imports, router and connector: 3-4 s here), so the ratio grows with the work:
with `--examples 100` it is lower, with the default 300 the items dominate.

    python benchmarks/conformance.py [--tools T] [--cases C] [--examples K] [--repeat R]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CONNECTOR = REPO / "tests/conformance/shout_connector.py"
HANDLER = str(Path(sys.executable).parent / "handler")


def write_tree(root: Path, tools: int, cases: int) -> Path:
    iface = root / "catalog/interfaces/bench/v1"
    (iface / "conformance").mkdir(parents=True)
    (iface / "interface.toml").write_text(
        'apiVersion = "handler.interface/v1"\nname = "bench"\nversion = 1\ndescription = "Benchmark texts"\n\n'
        '[limits]\ntimeoutSeconds = 10\n\n[errors]\nunavailable = "down"\nempty_text = "nothing to shout"\n')
    schema_out = {"type": "object", "additionalProperties": False, "required": ["text", "length"],
                  "properties": {"text": {"type": "string"}, "length": {"type": "integer", "minimum": 0}}}
    listing = [{
        "name": f"bench_t{i:03d}", "description": f"Shout a text back ({i}).",
        "inputSchema": {"type": "object", "additionalProperties": False, "required": ["text"],
                        "properties": {"text": {"type": "string", "maxLength": 200},
                                       "times": {"type": "integer", "minimum": 1, "maximum": 3}}},
        "outputSchema": schema_out, "annotations": {"readOnlyHint": True}} for i in range(tools)]
    (iface / "tools.json").write_text(json.dumps(listing))
    (iface / "skills/bench").mkdir(parents=True)
    (iface / "skills/bench/SKILL.md").write_text("---\nname: bench\ndescription: Benchmark texts.\n---\n")
    (iface / "conformance/cases.toml").write_text("".join(
        f'[[case]]\nname = "case {i}"\ntool = "bench_t{i % tools:03d}"\ninput = {{ text = "word {i}" }}\n'
        f'expect.text.contains = "WORD {i}"\nexpect.length.minimum = 1\n\n' for i in range(cases)))
    conn = root / "catalog/connectors/shout"
    conn.mkdir(parents=True)
    (conn / "connector.toml").write_text(
        'apiVersion = "handler.connector/v1"\nname = "shout"\ndescription = "Shouts"\nimplements = ["bench/v1"]\n'
        f'egress = []\n\n[run]\ncommand = {json.dumps([sys.executable, "main.py"])}\ntransport = "stdio"\n')
    shutil.copy(CONNECTOR, conn / "main.py")  # a connector's code lives in its folder: all its sandbox shows of it
    (root / "config/bindings").mkdir(parents=True)
    (root / "config/bindings/shout-good.toml").write_text(
        'apiVersion = "handler.binding/v1"\nname = "shout-good"\nconnector = "shout"\ndescription = "bench"\n')
    return root


def check(root: Path, workers: int, examples: int, out: Path) -> tuple[float, dict[str, Any]]:
    start = time.perf_counter()
    done = subprocess.run([HANDLER, "connector", "check", "shout", "--binding", "shout-good", "--root", str(root),
                           "-n", str(workers), "--examples", str(examples), "--seed", "1", "--json", str(out),
                           "--no-record"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the check failed ({done.returncode}): {done.stderr[-2000:]}")
    return wall, json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tools", type=int, default=40)
    parser.add_argument("--cases", type=int, default=120)
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        root = write_tree(Path(tmp) / "tree", args.tools, args.cases)
        items = args.cases + 2 * args.tools
        print(f"suite: {items} items ({args.cases} cases, {args.tools} fuzzed tools x {args.examples} examples, "
              f"{args.tools} refusal sets) on {os.cpu_count()} CPUs; best of {args.repeat}")
        check(root, 1, 2, Path(tmp) / "warm.json")  # hypothesis's tables and the page cache, once
        walls: dict[int, float] = {}
        spans: dict[int, float] = {}
        for workers in (1, 2):
            runs = [check(root, workers, args.examples, Path(tmp) / f"n{workers}.json") for _ in range(args.repeat)]
            wall, doc = min(runs, key=lambda r: r[0])
            walls[workers] = wall
            fuzz = [i for i in doc["items"] if i["kind"] == "fuzz"]
            examples = sum(i["details"]["examples"] for i in fuzz)
            in_fuzz = sum(i["duration"] for i in fuzz)
            busy = sum(i["duration"] for i in doc["items"])
            per_worker: dict[str, float] = {}
            for item in doc["items"]:
                per_worker[item["details"]["worker"]] = per_worker.get(item["details"]["worker"], 0) + item["duration"]
            spans[workers] = max(per_worker.values())
            print(f"-n {workers}: {wall:6.2f} s wall (median {statistics.median(r[0] for r in runs):.2f} s), "
                  f"{len(doc['items'])} items, items busy {busy:5.2f} s (longest worker {spans[workers]:5.2f} s); "
                  f"fuzz {examples} examples: "
                  f"{examples / in_fuzz:6.0f} examples/s per worker, {examples / wall:6.0f} examples/s of wall time")
        print(f"speed-up from 1 to 2 workers: {walls[1] / walls[2]:.2f}x wall clock (goal >= 1.7x); "
              f"{spans[1] / spans[2]:.2f}x on the items alone (start-up of pytest, workers and routers excluded)")
        print(f"load average now: {', '.join(f'{x:.2f}' for x in os.getloadavg())} (other work on the machine skews "
              "the figures)")


if __name__ == "__main__":
    main()
