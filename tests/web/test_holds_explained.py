"""Holds explained, end to end with `handler up` in this loop: who was really told of a hold, a rejection's
reason, a failed run's cause, and the hold page that follows the run (docs/governance.md)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from reconciler.app import Service as AppService
from reconciler.app import ServiceOptions, UpOptions
from reconciler.cli import main
from reconciler.governance.holds import get_hold
from reconciler.governance.notices import list_notices
from reconciler.governance.store import Store
from reconciler.web.notifier import decision_text
from tests.fixtures.echo_tree import TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, short_dir
from tests.fixtures.service import Service, running
from tests.fixtures.signin import sign_in as sign_in_member

ORG = '''apiVersion = "handler.org/v1"
name = "test-org"

[members.owner]
email = "owner@example.org"
owner = true

[slack]
channels = ["#approvals"]
'''

# Writes wait for a person (Balanced); so does echo_misbehave, by a rule, so that a held run can fail.
PROFILE = '''apiVersion = "handler.profile/v1"
name = "tester"
scope = "work/tester"
services = {{ echo = "echo-local" }}
{routing}
rules = [{{ action = "echo_misbehave", outcome = "approve" }}]
'''


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    for name in ("HANDLER_STORE_URL", "HANDLER_SMTP_URL", "HANDLER_SLACK_TOKEN", "HANDLER_SLACK_SIGNING_SECRET",
                 "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/org.toml").write_text(ORG)
        monkeypatch.setenv("HANDLER_STATE_DIR", str(base / "state"))  # the CLI finds the service's store
        yield root


def start(root: Path, routing: str = "") -> UpOptions:
    (root / "config/profiles/tester.toml").write_text(PROFILE.format(routing=routing))
    return UpOptions(str(root), run_dir=root.parent / "run", state_dir=root.parent / "state", http_port=0,
                     sandbox=False)


def cli(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> str:
    code = main([*argv, "--root", str(root)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def store_of(service: Service) -> Store:
    assert service.router is not None
    store: Store = service.router.services.gate.store  # type: ignore[attr-defined]
    return store


def dashboard(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


async def held(client: RawClient, tool: str, arguments: dict[str, object]) -> tuple[str, str]:
    """Call `tool`, which is held; (its request id, what the agent was told)."""
    result = body(await client.call(tool, arguments))
    assert result["status"] == "pending", result
    return result["request_id"], result["message"]


async def status(client: RawClient, rid: str) -> dict[str, str]:
    return body(await client.call("handler_status", {"request_id": rid}))


async def sign_in(http: httpx.AsyncClient, capsys: pytest.CaptureFixture[str], root: Path, service: Service,
                  rid: str) -> dict[str, str]:
    """Open the owner's decision link (`handler approvals link`); the form fields it carries."""
    link = cli(capsys, root, "approvals", "link", rid, "--member", "owner", "--url", dashboard(service)).strip()
    page = await http.get(link)
    assert page.status_code == 200
    assert "Approve as owner" in page.text
    assert 'name="reason"' in page.text  # the reject form takes a reason
    return {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}


def test_a_hold_routed_to_an_unconfigured_channel_says_so_and_its_notice_is_not_left_waiting(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = start(tree, 'routing = { to = "slack", channel = "#approvals" }')  # and no HANDLER_SLACK_TOKEN

    async def scenario() -> None:
        async with running(options) as service, httpx.AsyncClient() as http:
            client = await service.session()
            rid, told = await held(client, "echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
            expected = (f"No channel is configured to tell anyone (HANDLER_SLACK_TOKEN is not set): an owner decides "
                        f"on the dashboard at {dashboard(service)}/approvals/{rid} or with "
                        f"`handler approvals approve {rid} --as MEMBER` (or reject).")
            assert expected in told
            assert "Notifying" not in told
            assert expected in (await status(client, rid))["message"]
            (notice,) = list_notices(store_of(service), rid)
            assert (notice.state, notice.error, notice.attempts) == ("unsent", "HANDLER_SLACK_TOKEN is not set", 0)
            await sign_in_member(http, dashboard(service), tree, tree.parent / "state", "owner")
            overview = (await http.get(dashboard(service) + "/")).text
            section = overview.split("Notices that did not go out", 1)[1]
            assert rid in section
            assert "not sent" in section
            assert "HANDLER_SLACK_TOKEN is not set" in section
            shown = cli(capsys, tree, "approvals", "show", rid)
            assert "notice:    slack to #approvals: not sent: HANDLER_SLACK_TOKEN is not set" in shown
            await client.close()

    asyncio.run(scenario())


def test_a_rejection_from_the_dashboard_carries_its_reason_to_the_agent_the_page_and_the_audit_trail(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = start(tree)  # the owners decide; no mail server is set

    async def scenario() -> None:
        async with running(options) as service, httpx.AsyncClient() as http:
            client = await service.session()
            rid, told = await held(client, "echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
            assert "(HANDLER_SMTP_URL is not set)" in told
            fields = await sign_in(http, capsys, tree, service, rid)
            long = await http.post(f"{dashboard(service)}/approvals/{rid}",
                                   data={**fields, "decision": "reject", "reason": "x" * 2001})
            assert long.status_code == 400
            assert "give at most 2000" in long.text
            assert "Reject as owner" in long.text  # the form is still there; nothing was decided
            assert (await status(client, rid))["status"] == "pending"
            done = await http.post(f"{dashboard(service)}/approvals/{rid}",
                                   data={**fields, "decision": "reject", "reason": "Bob left; write to Carol"})
            assert done.status_code == 200, done.text
            assert "Rejected by owner: Bob left; write to Carol." in done.text
            assert 'http-equiv="refresh"' not in done.text  # final: the page stays
            answer = await status(client, rid)
            assert answer["status"] == "rejected"
            assert answer["message"].startswith("Rejected by owner: Bob left; write to Carol.")
            page = (await http.get(f"{dashboard(service)}/approvals/{rid}")).text
            assert re.search(r"rejected by owner at [^<]*: <q class=\"reason\">Bob left; write to Carol</q>", page)
            trail = cli(capsys, tree, "audit", "--request", rid)
            assert "rejected by owner: Bob left; write to Carol" in trail
            assert not (tree / "work/tester/mail.txt").exists()
            # What a Slack message of the hold is replaced with says it too.
            assert decision_text(get_hold(store_of(service), rid)).endswith(f"request {rid} — Bob left; write to Carol")
            await client.close()

    asyncio.run(scenario())


def test_an_approved_hold_whose_run_fails_shows_its_cause_and_no_retry_advice(
        tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    options = start(tree)

    async def scenario() -> None:
        async with running(options) as service, httpx.AsyncClient() as http:
            client = await service.session()
            rid, _ = await held(client, "echo_misbehave", {"mode": "die"})  # the connector crashes on it
            fields = await sign_in(http, capsys, tree, service, rid)
            done = await http.post(f"{dashboard(service)}/approvals/{rid}", data={**fields, "decision": "approve"})
            assert done.status_code == 200, done.text
            # Not final yet (approved, or already running): the page follows the run, keeping the link.
            refresh = re.search(r'<meta http-equiv="refresh" content="2; url=([^"]+)">', done.text)
            assert refresh is not None
            assert refresh.group(1).startswith(f"/approvals/{rid}?")
            assert "sig=" in refresh.group(1)
            store = store_of(service)
            await service.until(lambda: get_hold(store, rid).state == "failed")
            hold = get_hold(store, rid)
            assert hold.cause is not None
            assert hold.cause.startswith("unavailable (")  # the router's cause and what the connector did
            page = (await http.get(f"{dashboard(service)}{refresh.group(1).replace('&amp;', '&')}")).text
            assert 'http-equiv="refresh"' not in page  # final: it stops following
            assert "approved by owner at" in page
            assert "failed</span> at" in page
            assert hold.cause in page.replace("&#39;", "'")
            assert "This is final" in page
            assert "retrying later may work" not in page
            answer = await status(client, rid)
            assert answer["status"] == "failed"
            assert answer["message"].startswith("Approved by owner; the run failed: the service failed.")
            assert "retrying later may work" not in str(answer)
            shown = cli(capsys, tree, "approvals", "show", rid)
            assert "failed at " in shown
            assert hold.cause in shown
            assert "retrying later may work" not in shown
            trail = cli(capsys, tree, "audit", "--request", rid)
            assert f"approved by owner; the run failed: {hold.cause}" in trail
            await client.close()

    asyncio.run(scenario())


def test_a_service_without_its_http_listener_tells_the_agent_that_nobody_is_notified(tree: Path) -> None:
    """`handler serve` runs no notifier: a hold's notices are not sent, and the agent is told so."""
    up = start(tree)
    options = ServiceOptions(up.root, run_dir=up.run_dir, state_dir=up.state_dir, listen=False, follow=False,
                             sandbox=False)

    async def scenario() -> None:
        async with AppService(options) as service:
            client = await RawClient.connect(service.router.socket_path("tester"))
            await client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                                "clientInfo": {"name": "test", "version": "1"}})
            await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            rid, told = await held(client, "echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
            assert ("No channel is configured to tell anyone (this service runs without its HTTP listener, which "
                    "sends notices: `handler up` does): an owner decides with "
                    f"`handler approvals approve {rid} --as MEMBER` (or reject).") in told
            assert service.router.services.gate.store is not None  # type: ignore[attr-defined]
            (notice,) = list_notices(service.router.services.gate.store, rid)  # type: ignore[attr-defined]
            assert notice.state == "unsent"
            await client.close()

    asyncio.run(scenario())
