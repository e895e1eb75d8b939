"""The dashboard's pages of what happened, read by a signed-in member of a running `handler up`: the audit trail
filtered to one profile, spend against each cap, and the call log with a failed call's cause."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.app import UpOptions
from reconciler.web.history import TAIL_BYTES, latency_by_binding, percentile, read_calls
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, governed_profile, write_echo_tree
from tests.fixtures.harness import body, short_dir
from tests.fixtures.service import running
from tests.fixtures.signin import sign_in


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_PUBLIC_URL", "HANDLER_DASHBOARD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/org.toml").write_text(OWNED_ORG)
        (root / "config/profiles/tester.toml").write_text(governed_profile(monthly_usd=0.01))
        yield root


def text(page: httpx.Response) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


def test_audit_spend_and_calls_show_what_happened_by_name(tree: Path) -> None:
    async def scenario() -> None:
        options = UpOptions(str(tree), run_dir=tree.parent / "run", state_dir=tree.parent / "state", http_port=0,
                            sandbox=False)
        async with running(options) as service, httpx.AsyncClient() as http:
            client = await service.session()
            assert not (await client.call("echo_say", {"text": "hi"}))["isError"]
            held = body(await client.call("echo_write", {"text": "dear bob", "outputPath": "mail.txt"}))
            failed = await client.call("echo_misbehave", {"mode": "wrong_type"})
            assert failed["isError"]
            await client.close()
            assert service.listener is not None
            url = f"http://127.0.0.1:{service.listener.port}"
            assert (await http.get(url + "/audit")).status_code == 401  # a member signs in first
            await sign_in(http, url, tree, tree.parent / "state", "owner")

            audit = await http.get(url + "/audit", params={"profile": "tester", "tool": "echo_write"})
            assert audit.status_code == 200, audit.text
            assert f'href="/approvals/{held["request_id"]}"' in audit.text  # the held call's row links to its page
            assert "echo_say" not in text(audit)  # filtered to the one tool
            elsewhere = await http.get(url + "/audit", params={"profile": "nobody-here"})
            assert "No entries match this filter" in text(elsewhere)
            bad_day = await http.get(url + "/audit", params={"since": "yesterday"})
            assert bad_day.status_code == 400
            assert "YYYY-MM-DD" in text(bad_day)

            spend = await http.get(url + "/spend")
            assert spend.status_code == 200
            said = text(spend)
            assert "profile tester" in said
            assert "$0.01" in said  # the profile's cap beside what it spent
            assert "<svg" in spend.text
            assert "script" not in spend.text.lower()  # drawn on the server: the page keeps its CSP
            assert "default-src 'none'" in spend.headers["content-security-policy"]
            assert re.search(r"instance <strong>tester · run conn-[0-9a-f]+</strong>", spend.text)  # names, not ids

            service.router.services.log.flush()  # the log writes in batches; the page reads the file
            calls = await http.get(url + "/calls", params={"outcome": "failed"})
            assert calls.status_code == 200
            said = text(calls)
            assert "echo_misbehave" in said
            assert "unavailable · output_invalid" in said  # the failed call's cause
            assert "echo_say" not in said  # it executed: not among the calls that did not
            assert "echo-local" in said  # its binding's latency line

    asyncio.run(scenario())


def test_percentiles_are_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (0.5, 0.95, 0.99)] == [50.0, 95.0, 99.0]
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([], 0.5) == 0.0
    made = [{"binding": "a", "outcome": "executed", "duration_ms": 1.0},
            {"binding": "a", "outcome": "error", "duration_ms": 3.0}, {"binding": "b", "outcome": "executed"}]
    assert latency_by_binding(made) == [
        {"binding": "a", "calls": 2, "failed": 1, "p50": "1.0", "p95": "3.0", "p99": "3.0"},
        {"binding": "b", "calls": 1, "failed": 0, "p50": "0.0", "p95": "0.0", "p99": "0.0"}]


def test_only_the_end_of_a_long_call_log_is_read_and_a_cut_line_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "calls.jsonl"
    line = b'{"tool": "echo_say", "n": %d, "pad": "' + b"x" * 200 + b'"}\n'
    lines = [line % n for n in range(TAIL_BYTES // 200 + 100)]
    log.write_bytes(b"".join(lines) + b"not json\n")
    calls = read_calls(log)
    assert calls[-1]["n"] == len(lines) - 1  # the newest is there; the line that is not JSON is skipped
    assert 0 < calls[0]["n"] < len(lines) // 2  # the start was not read, and no half line came through
    assert read_calls(tmp_path / "missing.jsonl") == []
