"""`/metrics` of a running `handler up`: calls made through the profile's socket counted by how they ended, the
store's figures, labels a hostile client cannot multiply, and the dashboard token asked for when one is set."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from reconciler.app import UpOptions
from reconciler.governance.ledger import spend_report
from tests.fixtures.echo_tree import TOKEN_ENV, governed_profile, write_echo_tree
from tests.fixtures.harness import body, short_dir
from tests.fixtures.service import Service, running

SCRAPE_TOKEN = "a-scrape-token"  # noqa: S105 - a test's own


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HANDLER_DASHBOARD_TOKEN", SCRAPE_TOKEN)  # what a scraper sends (the page names spend)
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/profiles/tester.toml").write_text(governed_profile(monthly_usd=50.0))
        yield root


def options(root: Path) -> UpOptions:
    return UpOptions(str(root), run_dir=root.parent / "run", state_dir=root.parent / "state", http_port=0,
                     sandbox=False)


async def scrape(service: Service, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the page, by name and labels, read as a scraper does (the bearer token unless `headers` say)."""
    assert service.listener is not None
    async with httpx.AsyncClient() as http:
        page = await http.get(f"http://127.0.0.1:{service.listener.port}/metrics",
                              headers={"Authorization": f"Bearer {SCRAPE_TOKEN}", **headers})
    assert page.status_code == 200, page.text
    assert page.headers["content-type"].startswith("text/plain; version=")  # the text format, as Prometheus asks
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(page.text) for s in family.samples}


def calls(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], **labels: str) -> float:
    key = ("handler_calls_total", tuple(sorted({"profile": "tester", "interface": "echo/v1", "error": "",
                                                 **labels}.items())))
    return samples.get(key, 0.0)


def test_calls_are_counted_by_how_they_ended_and_the_store_figures_are_read(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            before = await scrape(service)
            assert before[("handler_ready", ())] == 1
            assert before[("handler_generation", ())] == service.generation
            assert before[("handler_holds_pending", ())] == 0
            client = await service.session()
            for n in range(3):
                assert not (await client.call("echo_say", {"text": f"hi {n}"}))["isError"]
            held = await client.call("echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
            assert body(held)["status"] == "pending"
            blocked = await client.call("echo_token", {})
            assert body(blocked)["status"] == "blocked"
            await client.close()

            after = await scrape(service)  # at once: the page counts every call ended so far
            assert calls(after, tool="echo_say", outcome="executed") == 3
            assert calls(after, tool="echo_write", outcome="pending") == 1
            assert calls(after, tool="echo_token", outcome="blocked") == 1
            assert after[("handler_call_duration_seconds_count", (("interface", "echo/v1"),))] == 5
            assert after[("handler_call_duration_seconds_bucket", (("interface", "echo/v1"), ("le", "+Inf")))] == 5
            assert after[("handler_holds_pending", ())] == 1
            assert after[("handler_connector_state", (("binding", "echo-local"), ("state", "running")))] == 1
            assert after[("handler_set_aside_this_month", ())] == 0
            assert after[("handler_store_up", ())] == 1
            # What counts against the cap, as the overview shows it: the three charges and what the router's budget
            # lease on the capped profile holds. The lease moves the row while the router keeps it (it grows with the
            # calls' rate, and goes back once idle), so the page is read against the store once the row holds still.
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]

            async def profile_row() -> float:
                return {r["scope"]: r["micros"] / 1e6 for r in await asyncio.to_thread(spend_report, store)}[
                    "profile:tester"]

            for _ in range(100):
                counted = await profile_row()
                shown = (await scrape(service))[("handler_spend_usd", (("scope", "profile:tester"),))]
                if await profile_row() == counted:
                    break
                await asyncio.sleep(0.1)
            assert shown == counted >= 0.003

    asyncio.run(scenario())


def test_a_client_naming_many_unknown_tools_adds_one_series(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            client = await service.session()
            for n in range(40):
                refused = await client.call(f"made_up_{n}", {})
                assert refused["isError"]
            await client.close()
            samples = await scrape(service)
            series = [key for key in samples if key[0] == "handler_calls_total"]
            # The session names no interface (it is served every one of its profile's), so neither does the series.
            assert series == [("handler_calls_total", (("error", "unknown_tool"), ("interface", ""),
                                                      ("outcome", "refused"), ("profile", "tester"),
                                                      ("tool", "(unknown)")))]
            assert samples[series[0]] == 40

    asyncio.run(scenario())


def test_with_a_dashboard_token_the_page_and_the_status_ask_for_it(tree: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLER_DASHBOARD_TOKEN", "a-long-random-token")

    async def scenario() -> None:
        async with running(options(tree)) as service:
            assert service.listener is not None
            base = f"http://127.0.0.1:{service.listener.port}"
            async with httpx.AsyncClient() as http:
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic a-long-random-token"}):
                    refused = await http.get(base + "/metrics", headers=headers)
                    assert refused.status_code == 401
                    assert "HANDLER_DASHBOARD_TOKEN" in refused.text
                    assert "handler_calls" not in refused.text
                    status = await http.get(base + "/status", headers=headers)  # it names profiles and bindings
                    assert status.status_code == 401
                    assert "tester" not in status.text
                given = await http.get(base + "/status", headers={"Authorization": "Bearer a-long-random-token"})
                assert given.json()["ready"] is True
                assert (await http.get(base + "/healthz")).status_code == 200  # a probe needs no token
            samples = await scrape(service, Authorization="Bearer a-long-random-token")
            assert samples[("handler_ready", ())] == 1

    asyncio.run(scenario())


def test_a_store_that_cannot_be_read_leaves_its_figures_out_and_the_page_serves_the_rest(
        tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            client = await service.session()
            assert not (await client.call("echo_say", {"text": "hi"}))["isError"]
            await client.close()
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]
            with sqlite3.connect(store.engine.url.database) as db:  # a migration gone wrong, say
                db.execute("ALTER TABLE holds RENAME TO holds_aside")
            samples = await scrape(service)
            assert samples[("handler_store_up", ())] == 0
            assert ("handler_holds_pending", ()) not in samples
            assert calls(samples, tool="echo_say", outcome="executed") == 1
            assert samples[("handler_ready", ())] == 1

    asyncio.run(scenario())
    assert "/metrics: the store's figures are left out" in caplog.text
    assert "holds" in caplog.text
