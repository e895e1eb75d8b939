"""Spend through the real router and the echo connector, which reports `_meta["handler/cost"] = 0.25`.

Many agents call at once: a connector reporting 100 times its binding's price never takes a $0.50 cap
past $0.50, and with no cap `handler spend` ends equal to what the replies said was charged.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from reconciler.governance.governed import GovernedGate
from reconciler.governance.ledger import spend_report
from reconciler.governance.rulebook import to_micros
from reconciler.governance.store import Store
from reconciler.governance.store.audit import read_audit
from reconciler.router.server import Router
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import DEADLINE, RawClient, body, log_lines, run, serving, short_dir
from tests.governance.governed import until

REPORTED = 0.25  # what the echo connector's `cost` mode reports for every call


def price_misbehave(root: Path, usd: float, cap: float | None) -> None:
    """Give echo_misbehave a price (the most one call may cost) and the profile a monthly cap, or none."""
    binding = root / "config/bindings/echo-local.toml"
    binding.write_text(binding.read_text().replace("echo_say = 0.001\n", f"echo_say = 0.001\necho_misbehave = {usd}\n"))
    if cap is not None:
        profile = root / "config/profiles/tester.toml"
        profile.write_text(profile.read_text() + f"\n[caps]\nmonthly_usd = {cap}\n")


@pytest.fixture
def places(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    with short_dir() as base:
        yield write_echo_tree(base / "t"), base / "run"


async def agents(socket: Path, clients: int, calls_each: int) -> list[float]:
    """`clients` agents at once, each calling the costly mode `calls_each` times; what each reply charged."""
    async def agent(n: int) -> list[float]:
        client = await RawClient.connect(socket)
        try:
            charged = []
            for _ in range(calls_each):
                result = await client.call("echo_misbehave", {"mode": "cost"}, _meta={"handler/instance": f"a{n}"})
                assert not result.get("isError"), result
                charged.append(float(result["_meta"]["handler/cost"]))
            return charged
        finally:
            await client.close()

    found = await asyncio.gather(*(agent(n) for n in range(clients)))
    return [c for each in found for c in each]


@contextlib.asynccontextmanager
async def governed(store: Store, root: Path, run_dir: Path, *,
                   sandbox: bool = True) -> AsyncIterator[tuple[Router, RawClient]]:
    """The router serving `root` governed on `store`, and a client on its profile's socket; all closed after."""
    governor = GovernedGate(store, owns_store=False)
    try:
        async with serving(root, run_dir, gate=governor, sandbox=sandbox) as router:
            client = await RawClient.connect(router.socket_path("tester"))
            try:
                yield router, client
            finally:
                await client.close()
    finally:
        await governor.aclose()


def profile_spend(store: Store) -> int:
    return sum(r["micros"] for r in spend_report(store) if r["scope"] == "profile:tester")


def test_200_concurrent_calls_reporting_100_times_their_price_keep_a_50_cent_cap(
        places: tuple[Path, Path], store: Store) -> None:
    root, run_dir = places
    price_misbehave(root, REPORTED / 100, cap=0.50)  # 200 calls at $0.0025 reserved fill the cap exactly

    async def scenario() -> list[float]:
        governor = GovernedGate(store, owns_store=False)
        try:
            async with serving(root, run_dir, gate=governor) as router:
                return await agents(router.socket_path("tester"), 50, 4)
        finally:
            await governor.aclose()

    charged = run(scenario(), timeout=120)
    assert len(charged) == 200
    assert set(charged) == {REPORTED / 100}
    assert profile_spend(store) <= to_micros(0.50)
    assert len([r for r in read_audit(store, limit=1000) if r["event"] == "pricing_violation"]) == 200


def test_with_no_cap_handler_spend_equals_what_60_concurrent_replies_charged(
        places: tuple[Path, Path], store: Store) -> None:
    root, run_dir = places
    price_misbehave(root, 1.0, cap=None)  # reports of $0.25 are under the price: each is charged as reported

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False)
        try:
            async with serving(root, run_dir, gate=governor) as router:
                charged = await agents(router.socket_path("tester"), 60, 2)
                replied = sum(to_micros(c) for c in charged)
                assert replied == to_micros(120 * REPORTED)

                async def recorded() -> bool:  # while the router still runs: nothing waits in its memory
                    return await asyncio.to_thread(profile_spend, store) == replied

                await until(recorded, 10.0)
        finally:
            await governor.aclose()

    run(scenario(), timeout=120)


@pytest.mark.parametrize(("key", "run_id", "problem"), [
    ("handler/instance", "r" * 129, "is 129 characters long"),
    ("handler/instance", "run\x00one", "holds a control character"),
    ("handler/parentInstance", "run\x1b[2Jone", "holds a control character"),
])
def test_a_run_id_the_store_cannot_hold_is_refused_and_every_other_call_is_recorded(
        places: tuple[Path, Path], store: Store, key: str, run_id: str, problem: str) -> None:
    """An agent run's id is the client's to name. One the store's columns cannot hold (longer than 128 characters, or
    a NUL, which PostgreSQL refuses in text) would fail the commit of every audit row and spend sum beside it, at each
    retry: it is refused before anything keeps it, and the calls of the other agents are all recorded."""
    root, run_dir = places
    price_misbehave(root, 1.0, cap=None)

    async def scenario() -> None:
        async with governed(store, root, run_dir) as (router, hostile):
            reply = await hostile.request("tools/call", {"name": "echo_misbehave", "arguments": {"mode": "cost"},
                                                         "_meta": {key: run_id}})
            assert reply["error"]["code"] == -32602
            assert reply["error"]["message"].startswith(f"params._meta['{key}'] {problem}")
            charged = await agents(router.socket_path("tester"), 4, 5)

            async def recorded() -> bool:  # while the router runs: its commits go on
                return await asyncio.to_thread(profile_spend, store) == to_micros(20 * REPORTED)

            await until(recorded, 10.0)
            assert charged == [REPORTED] * 20

    run(scenario(), timeout=120)
    settled = [r for r in read_audit(store, limit=1000) if r["event"] == "settled"]
    assert sum(r["detail"].get("calls", 1) for r in settled) == 20
    assert {r["instance"] for r in settled} == {"a0", "a1", "a2", "a3"}


def test_a_request_id_holding_a_nul_is_an_invalid_argument_not_a_failed_store(
        places: tuple[Path, Path], store: Store) -> None:
    """PostgreSQL refuses a NUL even in a lookup's parameter: `handler_status` with one answered that governance's
    store had failed. The built-ins' schema takes the ids the store makes, and says what a request id is."""
    root, run_dir = places

    async def scenario() -> None:
        async with governed(store, root, run_dir) as (_, client):
            for rid in ("req_\x00", "req_" + "0" * 100):
                refused = await client.call("handler_status", {"request_id": rid},
                                            _meta={"handler/interface": "handler"})
                assert refused["_meta"]["handler/error"] == "invalid_arguments", refused
            unknown = await client.call("handler_status", {"request_id": "req_0123abcd"},
                                        _meta={"handler/interface": "handler"})
            assert unknown["structuredContent"]["status"] == "unknown"

    run(scenario(), timeout=60)


@pytest.mark.parametrize("ending", ["cancelled", "timed out"])
@pytest.mark.parametrize("cap", [0.50, None])
def test_a_call_that_ends_unanswered_once_the_connector_has_it_is_charged_its_price(
        monkeypatch: pytest.MonkeyPatch, store: Store, ending: str, cap: float | None) -> None:
    """Its work may have been paid for at the provider. Released, a client that cancels every call once the connector
    has it (or a connector past its deadline) would run them all against a cap that never moves: two calls priced
    $0.25 fill a $0.50 cap, and the next is blocked naming it."""
    monkeypatch.setenv(TOKEN_ENV, "t")
    with short_dir() as base:
        root = write_echo_tree(base / "t", binding_limits={"timeoutSeconds": 1} if ending == "timed out" else None)
        price_misbehave(root, 0.25, cap=cap)
        arrivals, release = base / "arrivals", base / "release"
        held = {"mode": "held", "cost": 0.25, "seconds": 30, "paths": [str(arrivals), str(release)]}

        async def unanswered(client: RawClient, msg_id: int) -> None:
            """A call the connector receives and never answers in time, or whose client cancels it there."""
            count = arrivals.read_text().count("arrived") if arrivals.exists() else 0
            await client.send({"jsonrpc": "2.0", "id": msg_id, "method": "tools/call",
                               "params": {"name": "echo_misbehave", "arguments": held}})
            async with asyncio.timeout(DEADLINE):
                while not arrivals.exists() or arrivals.read_text().count("arrived") == count:
                    await asyncio.sleep(0.01)
            if ending == "cancelled":
                await client.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                   "params": {"requestId": msg_id}})
            else:
                reply = await client.recv()
                assert (reply["id"], reply["result"]["_meta"]["handler/error"]) == (msg_id, "unavailable"), reply

        async def scenario() -> dict[str, Any]:
            async with governed(store, root, base / "run", sandbox=False) as (_, client):  # it reads `paths`
                for msg_id in (1, 2):
                    await unanswered(client, msg_id)
                await until(lambda: asyncio.to_thread(lambda: profile_spend(store) == to_micros(0.50)), 10.0)
                release.touch()  # the next call is answered at once, if it runs
                return await client.call("echo_misbehave", held)

        third = run(scenario(), timeout=120)
    if cap is None:
        assert third["_meta"]["handler/status"] == "executed"
        assert profile_spend(store) == to_micros(0.75)
    else:
        assert third["_meta"]["handler/status"] == "blocked"
        assert "cap" in body(third)["message"]
        assert profile_spend(store) == to_micros(0.50)
    released = [r for r in read_audit(store, limit=1000) if r["event"] == "released"]
    assert sum(r["detail"].get("calls", 1) for r in released) == 2
    assert sum(r["detail"]["charged"] for r in released) == to_micros(0.50)


@pytest.mark.parametrize("cap", [0.50, None])
def test_a_connector_reporting_an_astronomical_cost_is_charged_its_price_and_the_violation_recorded(
        monkeypatch: pytest.MonkeyPatch, store: Store, cap: float | None) -> None:
    """1e300 USD is a finite number, so it counted as a report: in micro-dollars past 64 bits, it failed every
    settlement path (the agent told `unavailable`, the call's spend and audit lost, a lease never settled). Read as
    the most any amount may be, it is a pricing violation like any other report above the price."""
    monkeypatch.setenv(TOKEN_ENV, "t")
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        price_misbehave(root, 0.25, cap=cap)
        release = base / "release"
        release.touch()
        reporting = {"mode": "held", "cost": 1e300, "paths": [str(base / "arrivals"), str(release)]}

        async def scenario() -> dict[str, Any]:
            async with governed(store, root, base / "run", sandbox=False) as (_, client):  # it reads `paths`
                return await client.call("echo_misbehave", reporting)

        result = run(scenario(), timeout=60)
    assert (result["_meta"]["handler/status"], result["_meta"]["handler/cost"]) == ("executed", 0.25)
    assert profile_spend(store) == to_micros(0.25)
    trail = read_audit(store, limit=100)
    (violation,) = [r for r in trail if r["event"] == "pricing_violation"]
    assert (violation["detail"]["reported"], violation["detail"]["charged"]) == (to_micros(1e9), to_micros(0.25))
    assert sum(r["detail"].get("calls", 1) for r in trail if r["event"] == "settled") == 1


def test_an_answer_is_charged_what_it_reported_else_its_price_unless_it_is_a_declared_error(
        places: tuple[Path, Path], store: Store) -> None:
    """A wrong-shaped answer certainly reached the connector, and maybe the provider: it costs its price, as a call
    that timed out unanswered does, not nothing. A cost the connector reports is charged whatever the result. Only
    a declared error (or a JSON-RPC error) reporting nothing is released."""
    root, run_dir = places
    price_misbehave(root, 0.01, cap=None)
    cases = [  # the call's arguments, what the log says it was charged
        ({"mode": "wrong_type"}, 0.01),  # output_invalid
        ({"mode": "no_structured"}, 0.01),
        ({"mode": "bad_code"}, 0.01),  # undeclared_error
        ({"mode": "no_code"}, 0.01),  # an error without a code
        ({"mode": "wrong_type", "cost": 0.008}, 0.008),
        ({"mode": "bad_code", "cost": 0.008}, 0.008),
        ({"mode": "no_code", "cost": 0.008}, 0.008),
        ({"mode": "error", "cost": 0.008}, 0.008),  # a declared error that cost something
        ({"mode": "error", "cost": 5.0}, 0.01),  # never above the price
        ({"mode": "error"}, 0.0),  # a declared error: released
        ({"mode": "rpc_error"}, 0.0),
    ]

    async def scenario() -> None:
        async with governed(store, root, run_dir) as (router, client):
            for args, charged in cases:
                result = await client.call("echo_misbehave", args)
                assert result["isError"] is True
                assert log_lines(router)[-1]["cost"] == charged, args

            async def recorded() -> bool:
                return await asyncio.to_thread(profile_spend, store) == to_micros(0.01 * 5 + 0.008 * 4)

            await until(recorded, 10.0)

    run(scenario(), timeout=120)


def test_an_approved_hold_whose_answer_the_interface_refuses_is_charged_as_any_call_is(
        places: tuple[Path, Path], store: Store) -> None:
    """Its run cost nothing while the call log said its price: the spend rows and the log disagreed."""
    from reconciler.governance.holds import decide_hold, get_hold

    root, run_dir = places
    price_misbehave(root, 0.01, cap=None)
    profile = root / "config/profiles/tester.toml"
    profile.write_text(profile.read_text() + '\n[[rules]]\naction = "echo_misbehave"\noutcome = "approve"\n')

    async def scenario() -> None:
        governor = GovernedGate(store, owns_store=False, poll_seconds=0.05)
        try:
            async with serving(root, run_dir, gate=governor) as router:
                governor.use_snapshot(router.live.snapshot)
                await governor.start(router.execute_held)  # as `handler up` does: approved holds run here
                client = await RawClient.connect(router.socket_path("tester"))
                held = body(await client.call("echo_misbehave", {"mode": "wrong_type"}))
                await client.close()
                assert held["status"] == "pending", held
                rid = held["request_id"]
                await asyncio.to_thread(decide_hold, store, rid, "approve", "owner")

                async def failed() -> bool:
                    return (await asyncio.to_thread(get_hold, store, rid)).state == "failed"

                await until(failed, 20.0)
                assert (await asyncio.to_thread(get_hold, store, rid)).charged == to_micros(0.01)
                assert log_lines(router)[-1]["cost"] == 0.01  # the call log and the spend rows agree

                async def recorded() -> bool:
                    return await asyncio.to_thread(profile_spend, store) == to_micros(0.01)

                await until(recorded, 10.0)
        finally:
            await governor.aclose()

    run(scenario(), timeout=120)
