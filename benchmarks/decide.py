"""Governance benchmark: decision latency under 1,000 rules and 1,000 policies, Cedar as the anchor,
and admitted calls per second with governance on (SQLite, PostgreSQL) and off, side by side — also for
a capped profile, whose calls are admitted against budget leases (goal: >= 5,000 calls/s on each store).
The full-pipeline lines run the router on uvloop, as `handler serve` does, with its clients in the same
process; `benchmarks/router.py` measures `handler serve` itself from outside.

    .venv/bin/python benchmarks/decide.py [--calls 200000] [--pg postgresql://postgres@127.0.0.1:5432/test]

It prints figures and asserts nothing about time (docs/architecture.md §10: goal p99 under 20 µs; a
capped profile through the full pipeline >= 5,000 calls/s on SQLite and on PostgreSQL).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import cedarpy
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.pgschema import pg_schema
from reconciler.config import FolderSource, Loader
from reconciler.config.eventloop import run_on_uvloop
from reconciler.config.models import BindingFile, InterfaceFile, OrgFile, ProfileFile, Tool
from reconciler.config.snapshot import BUILTIN_TEMPLATES, Binding, InterfaceVersion, Profile, Selection, Snapshot
from reconciler.governance.decide import SpendState, decide_call
from reconciler.governance.gate import CallRequest, Gate, OpenGate
from reconciler.governance.governed import GovernedGate
from reconciler.governance.rulebook import compile_rulebook, to_micros
from reconciler.governance.store import open_store
from reconciler.router.server import Router

SERVICES = 250  # x 4 tools = 1,000 tools on the profile
CAPPED_GOAL = 5_000  # calls/s of a capped profile through the full pipeline, on each store
CLASSES = ("read", "write", "destructive", "read")


def build_snapshot(rules: int = 1000, policies: int = 1000, seed: int = 7) -> Snapshot:
    rng = random.Random(seed)
    interfaces, bindings, selections = {}, {}, {}
    for s in range(SERVICES):
        name = f"svc{s}"
        tools = []
        for t, cls in enumerate(CLASSES):
            hints = {"readOnlyHint": cls == "read", "destructiveHint": cls == "destructive"}
            tools.append(Tool(name=f"svc{s}_t{t}", description="t", inputSchema={"type": "object"},
                              annotations=hints))
        spec = InterfaceFile(apiVersion="handler.interface/v1", name=name, version=1, description=name)
        interfaces[f"{name}/v1"] = InterfaceVersion(f"{name}/v1", spec, tuple(tools), f"catalog/interfaces/{name}/v1")
        bindings[f"{name}-b"] = Binding(f"{name}-b", BindingFile(apiVersion="handler.binding/v1", connector="c",
                                                                 pricing={f"{name}_t0": 0.005}), "b.toml")
        selections[name] = Selection(name, f"{name}/v1", f"{name}-b", False, "profile")
    outcomes = ("allow", "approve", "block")
    rule_list: list[dict[str, str]] = []
    for i in range(rules):
        kind = i % 4
        if kind == 0:
            rule_list.append({"service": f"svc{rng.randrange(SERVICES)}", "outcome": rng.choice(outcomes)})
        elif kind == 1:
            rule_list.append({"action": f"gone_{i}", "outcome": rng.choice(outcomes)})  # names no tool served
        else:
            rule_list.append({"action": f"svc{rng.randrange(SERVICES)}_t{rng.randrange(4)}",
                              "outcome": rng.choice(outcomes)})
    profile_spec = ProfileFile.model_validate({
        "apiVersion": "handler.profile/v1", "name": "big", "scope": "w", "group": "g0", "template": "balanced",
        "services": {n: f"{n}-b" for n in selections}, "rules": rule_list,
        "pins": [f"svc{s}" for s in range(0, SERVICES, 10)],
        "caps": {"monthly_usd": 1000.0, "instance_usd": 50.0},
    })
    members = {f"m{i}": {"owner": i == 0} for i in range(20)}
    policy_list = []
    for i in range(policies):
        kind = rng.choice(["action", "service", "profile", "group", "org"])
        scope: dict[str, Any] = {
            "action": {"action": f"svc{rng.randrange(SERVICES)}_t{rng.randrange(4)}"},
            "service": {"service": f"svc{rng.randrange(SERVICES)}"},
            "profile": {"profile": rng.choice(["big", "other"])},
            "group": {"group": rng.choice(["g0", "g1"])},
            "org": {"org": True},
        }[kind]
        when = rng.choice([{}, {"cost_above": round(rng.uniform(0.001, 5), 3)},
                           {"cost_below": round(rng.uniform(0.001, 5), 3)},
                           {"cost_above": 1.0, "cost_below": round(rng.uniform(1.5, 9), 3)}])
        policy_list.append({"name": f"p{i}", "scope": scope, "priority": rng.randrange(100),
                            "approver": {"to": "member", "member": f"m{rng.randrange(20)}"},
                            **({"when": when} if when else {})})
    org = OrgFile.model_validate({"apiVersion": "handler.org/v1", "name": "bench", "members": members,
                                  "groups": {"g0": {"members": ["m1"]}, "g1": {"members": ["m2"]}},
                                  "policies": policy_list, "caps": {"monthly_usd": 10_000.0}})
    profile = Profile("big", profile_spec, "config/profiles/big.toml", MappingProxyType(selections))
    return Snapshot("bench", MappingProxyType(interfaces), MappingProxyType({}), MappingProxyType(bindings),
                    MappingProxyType({"big": profile}), MappingProxyType(dict(BUILTIN_TEMPLATES)), org)


def percentiles(samples: list[float]) -> tuple[float, float, float]:
    samples.sort()
    n = len(samples)
    return samples[n // 2], samples[int(n * 0.99)], samples[int(n * 0.999)]


def bench_decide(snapshot: Snapshot, calls: int) -> dict[str, float]:
    started = time.perf_counter()
    book = compile_rulebook(snapshot)
    compile_ms = (time.perf_counter() - started) * 1000
    rng = random.Random(1)
    tools = [t for (_, t) in book.entries]
    costs = [0.0, 0.001, 0.005, 0.5, 1.2, 3.0, 7.5]
    requests = [(rng.choice(tools), to_micros(rng.choice(costs))) for _ in range(4096)]
    state = SpendState(org=to_micros(12.0), profile=to_micros(3.0), instance=to_micros(0.5))
    clock = time.perf_counter_ns
    entry_of = book.entry
    # Cold: the first decision of each (tool, cost band) also works out layers 2-7 and caches them.
    cold: list[float] = []
    outcomes: dict[str, int] = {}
    for tool, cost in requests:
        t0 = clock()
        d = decide_call(entry_of("big", tool), "run-1", cost, state)  # type: ignore[arg-type]
        cold.append((clock() - t0) / 1000)
        outcomes[d.outcome.value] = outcomes.get(d.outcome.value, 0) + 1
    samples: list[float] = []
    gc.collect()
    for i in range(calls):
        tool, cost = requests[i & 4095]
        t0 = clock()
        decide_call(entry_of("big", tool), "run-1", cost, state)  # type: ignore[arg-type]
        samples.append((clock() - t0) / 1000)
    c50, c99, _ = percentiles(cold)
    p50, p99, p999 = percentiles(samples)
    print(f"decide_call   1,000 tools, 1,000 rules, 1,000 policies: compile {compile_ms:.0f} ms once per snapshot")
    print(f"              first decision per tool and cost band ({len(cold):,}): p50 {c50:.1f} µs  p99 {c99:.1f} µs"
          f"   (mix {outcomes})")
    print(f"              {calls:,} decisions: p50 {p50:.2f} µs  p99 {p99:.2f} µs  p99.9 {p999:.2f} µs  "
          f"mean {statistics.fmean(samples):.2f} µs")
    return {"p50": p50, "p99": p99}


def cedar_policies(snapshot: Snapshot) -> str:
    """The same rules and cost policies as Cedar text: forbid for blocks, permit for the rest."""
    assert snapshot.org is not None
    profile = snapshot.profiles["big"].spec
    out = ['permit(principal, action, resource) when { context.class == "read" };']
    for rule in profile.rules:
        effect = "forbid" if rule.outcome == "block" else "permit"
        if rule.action:
            out.append(f'{effect}(principal == Profile::"big", action == Action::"{rule.action}", resource);')
        else:
            out.append(f'{effect}(principal == Profile::"big", action, resource == Service::"{rule.service}");')
    for p in snapshot.org.policies:
        conds = []
        if p.when and p.when.cost_above is not None:
            conds.append(f"context.cost > {to_micros(p.when.cost_above)}")
        if p.when and p.when.cost_below is not None:
            conds.append(f"context.cost < {to_micros(p.when.cost_below)}")
        kind = p.scope.kind
        head = {"action": f'principal, action == Action::"{p.scope.action}", resource',
                "service": f'principal, action, resource == Service::"{p.scope.service}"',
                "profile": f'principal == Profile::"{p.scope.profile}", action, resource',
                "group": f'principal in Group::"{p.scope.group}", action, resource',
                "org": "principal, action, resource"}[kind]
        when = f" when {{ {' && '.join(conds)} }}" if conds else ""
        out.append(f"@id(\"{p.name}\") permit({head}){when};")
    return "\n".join(out)


def bench_cedar(snapshot: Snapshot, calls: int) -> dict[str, float]:
    policies = cedarpy.PolicySet.from_str(cedar_policies(snapshot))
    entities = cedarpy.Entities.from_json_str('[{"uid": {"type": "Profile", "id": "big"}, "attrs": {}, '
                                              '"parents": [{"type": "Group", "id": "g0"}]}]')
    rng = random.Random(1)
    book = compile_rulebook(snapshot)
    requests = []
    for _ in range(1024):
        entry = rng.choice(list(book.entries.values()))
        requests.append({"principal": 'Profile::"big"', "action": f'Action::"{entry.tool}"',
                         "resource": f'Service::"{entry.service}"',
                         "context": {"cost": rng.choice([0, 1000, 5000, 500000, 3000000]),
                                     "class": entry.action_class.value}})
    samples = []
    clock = time.perf_counter_ns
    for i in range(calls):
        t0 = clock()
        cedarpy.is_authorized(requests[i & 1023], policies, entities)
        samples.append((clock() - t0) / 1000)
    p50, p99, _ = percentiles(samples)
    print(f"cedarpy       the same 1,000 rules + 1,000 policies (pre-parsed PolicySet and Entities), "
          f"{calls:,} requests: p50 {p50:.1f} µs  p99 {p99:.1f} µs")
    return {"p50": p50, "p99": p99}


async def _pipeline(gate: Gate, snapshot: Snapshot, calls: int, concurrency: int) -> float:
    tools = ["svc1_t0", "svc2_t0", "svc3_t0", "svc4_t3", "svc5_t0"]
    queue = iter(range(calls))

    async def worker(w: int) -> None:
        for i in queue:
            call = CallRequest("big", f"run-{w}", None, "svc1/v1", tools[i % len(tools)], "svc1-b", {"q": i})
            admission = await gate.admit(snapshot, call)
            if admission.status == "executed":
                await gate.settle(admission, None, True)

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return calls / (time.perf_counter() - started)


def bench_pipeline(snapshot: Snapshot, calls: int, pg: str | None) -> None:
    concurrency = 32
    rates = {"governance off (OpenGate)": asyncio.run(_pipeline(OpenGate(), snapshot, calls, concurrency))}
    with tempfile.TemporaryDirectory() as tmp:
        governor = GovernedGate(open_store(f"sqlite:///{Path(tmp) / 'handler.db'}"))
        rates["governance on, SQLite (WAL)"] = asyncio.run(_pipeline(governor, snapshot, calls, concurrency))
        governor.close()
    with pg_schema(pg) as url:
        if url is not None:
            governor = GovernedGate(open_store(url))
            rates["governance on, PostgreSQL"] = asyncio.run(_pipeline(governor, snapshot, calls, concurrency))
            governor.close()
    print(f"the gate alone, admit+settle, {calls:,} calls, {concurrency} concurrent, profile capped; most of them "
          "are held for a person (one store transaction each), the rest blocked by a rule:")
    for name, rate in rates.items():
        print(f"              {name:32} {rate:10,.0f} calls/s")


async def _router_rate(root: Path, run_dir: Path, gate: Gate, calls: int, sessions: int) -> float:
    router = Router(Loader().load(FolderSource(root)), root=root, run_dir=run_dir, gate=gate, call_log=False)
    await router.start()
    if isinstance(gate, GovernedGate):
        await gate.start(router.execute_held)
    line = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                         "params": {"name": "echo_say", "arguments": {"text": "hello"}}}) + b"\n"

    async def session(n: int) -> None:
        reader, writer = await asyncio.open_unix_connection(str(router.socket_path("tester")))
        for _ in range(n):
            writer.write(line)
            await writer.drain()
            reply = orjson.loads(await reader.readline())
            assert reply["result"]["_meta"]["handler/status"] == "executed", reply
        writer.close()

    try:
        await session(20)  # start the connector first
        started = time.perf_counter()
        await asyncio.gather(*(session(calls // sessions) for _ in range(sessions)))
        return (calls // sessions * sessions) / (time.perf_counter() - started)
    finally:
        if isinstance(gate, GovernedGate):
            await gate.aclose()
        await router.aclose()


def bench_router(calls: int, pg: str | None) -> None:
    """Calls/s through the real router (socket, validation, connector, settle) per gate."""
    from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree

    os.environ.setdefault(TOKEN_ENV, "bench")
    sessions = 8
    rows: list[tuple[str, float]] = []
    for capped in (False, True):
        with tempfile.TemporaryDirectory(dir="/tmp", prefix="hb") as tmp, pg_schema(pg) as url:
            root = write_echo_tree(Path(tmp) / "t")
            if capped:
                profile = root / "config/profiles/tester.toml"
                profile.write_text(profile.read_text() + "\n[caps]\nmonthly_usd = 1000.0\n")
            stores = {"off (OpenGate)": None, "on, SQLite": f"sqlite:///{Path(tmp) / 'h.db'}"}
            if url is not None:
                stores["on, PostgreSQL"] = url
            for name, store_url in stores.items():
                if capped and store_url is None:
                    continue
                label = f"governance {name}" + (", profile capped (budget leases)" if capped else "")
                gate = OpenGate() if store_url is None else GovernedGate(open_store(store_url))
                # On the loop `handler serve` runs (uvloop), clients and router in this one process.
                rate = run_on_uvloop(_router_rate(root, Path(tmp) / "run", gate, calls, sessions))
                rows.append((label, rate))
    print(f"full pipeline: the router on its socket -> echo connector, {sessions} sessions, {calls:,} calls:")
    for label, rate in rows:
        print(f"              {label:62} {rate:8,.0f} calls/s")
    found = dict(rows)
    open_gate = found["governance off (OpenGate)"]
    for store in ("SQLite", "PostgreSQL"):
        rate = found.get(f"governance on, {store}, profile capped (budget leases)")
        if rate is not None:
            verdict = "met" if rate >= CAPPED_GOAL else "NOT met"
            print(f"              capped profile on {store}: {rate:,.0f} calls/s, {rate / open_gate:.0%} of the open "
                  f"gate in this run (goal: >= {CAPPED_GOAL:,} calls/s: {verdict})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--cedar-calls", type=int, default=5_000)
    parser.add_argument("--pipeline-calls", type=int, default=3_000)
    # Enough calls for a capped profile's leases to reach their size: the first second sizes them from the rate.
    parser.add_argument("--router-calls", type=int, default=20_000)
    parser.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test", help="'' to skip PostgreSQL")
    args = parser.parse_args()
    snapshot = build_snapshot()
    ours = bench_decide(snapshot, args.calls)
    cedar = bench_cedar(snapshot, args.cedar_calls)
    print(f"              decide_call p99 is {cedar['p99'] / ours['p99']:.0f} times below cedarpy's on the same set "
          f"(goal: p99 < 20 µs: {'met' if ours['p99'] < 20 else 'NOT met'})")
    bench_pipeline(snapshot, args.pipeline_calls, args.pg or None)
    bench_router(args.router_calls, args.pg or None)


if __name__ == "__main__":
    main()
