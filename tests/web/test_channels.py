"""Approval channels end to end: `handler up` in this loop, a real SMTP server and a Slack stand-in on loopback.

An agent's call is held; the approver is told (an email with a signed link, or a Slack message with
buttons); opening the link decides nothing; the signed POST, or a signed Slack click, decides; the
router then runs the call once. Forged, stale or foreign requests decide nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import re
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from reconciler.app import UpOptions
from reconciler.governance.gate import CallRequest
from reconciler.governance.governed import GovernedGate
from reconciler.governance.notices import list_notices
from reconciler.governance.store.audit import record
from reconciler.web.channels import open_channels
from reconciler.web.http import HttpListener
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, load, short_dir
from tests.fixtures.mail import Mailbox, serving_mailbox
from tests.fixtures.service import DEADLINE, Service, running
from tests.fixtures.signin import sign_in
from tests.governance.builders import cap_snapshot, priced_call
from tests.governance.store.test_set_aside import refuse_a_row

ORG = OWNED_ORG + '''
[members.carol]
slack = "U0CAROL"

[slack]
channels = ["#approvals"]
'''

PROFILE = '''apiVersion = "handler.profile/v1"
name = "tester"
scope = "work/tester"
services = {{ echo = "echo-local" }}
routing = {routing}
'''

SIGNING = "slack-signing-secret"
HANDLER = str(Path(sys.executable).parent / "handler")


@pytest.fixture
def mailbox() -> Iterator[tuple[Mailbox, int]]:
    with serving_mailbox() as served:
        yield served


class SlackStandIn:
    """Slack's side on loopback: chat.postMessage as the Web API answers it, and a response_url."""

    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.responses: list[dict[str, Any]] = []
        self.updates: list[dict[str, Any]] = []
        self.fail_with: str | None = None

    def app(self) -> Starlette:
        async def post_message(request: Request) -> Response:
            self.posts.append((dict(request.headers), orjson.loads(await request.body())))
            if self.fail_with == "ratelimited":
                return Response("", status_code=429, headers={"Retry-After": "120"})
            if self.fail_with:
                return JSONResponse({"ok": False, "error": self.fail_with})
            return JSONResponse({"ok": True, "channel": "C0APPROVALS", "ts": "1700000000.000100"})

        async def update(request: Request) -> Response:
            self.updates.append(orjson.loads(await request.body()))
            return JSONResponse({"ok": True})

        async def respond(request: Request) -> Response:
            self.responses.append(orjson.loads(await request.body()))
            return Response("ok")

        return Starlette(routes=[Route("/api/chat.postMessage", post_message, methods=["POST"]),
                                 Route("/api/chat.update", update, methods=["POST"]),
                                 Route("/respond", respond, methods=["POST"])])


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv(TOKEN_ENV, "t")
    for name in ("HANDLER_STORE_URL", "HANDLER_STATE_DIR", "HANDLER_SMTP_URL", "HANDLER_SLACK_TOKEN",
                 "HANDLER_SLACK_SIGNING_SECRET", "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/org.toml").write_text(ORG)
        yield root


def route(root: Path, routing: str) -> None:
    (root / "config/profiles/tester.toml").write_text(PROFILE.format(routing=routing))


def options(root: Path) -> UpOptions:
    return UpOptions(str(root), run_dir=root.parent / "run", state_dir=root.parent / "state", http_port=0,
                     sandbox=False)



async def hold_a_write(service: Service, told: str = "") -> tuple[RawClient, str]:
    """An agent session whose echo_write is held (Balanced: writes wait for a person)."""
    client = await service.session()
    result = await client.call("echo_write", {"text": "dear bob", "outputPath": "mail.txt"})
    assert body(result)["status"] == "pending", result
    assert told in body(result)["message"]
    return client, body(result)["request_id"]


async def status_of(client: RawClient, rid: str) -> str:
    result = await client.call("handler_status", {"request_id": rid})
    status: str = body(result)["status"]
    return status


async def until_executed(client: RawClient, rid: str) -> None:
    async with asyncio.timeout(DEADLINE):
        while (status := await status_of(client, rid)) != "executed":
            assert status == "pending", status
            await asyncio.sleep(0.05)


def base_url(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


def test_an_email_with_a_signed_link_lets_its_member_decide_once(tree: Path, mailbox: tuple[Mailbox, int],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    box, port = mailbox
    monkeypatch.setenv("HANDLER_SMTP_URL", f"smtp://127.0.0.1:{port}")
    monkeypatch.setenv("HANDLER_MAIL_FROM", "handler@test.example")
    route(tree, '{ to = "member", member = "bob" }')

    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient() as http:
            client, rid = await hold_a_write(service, told="Waiting for approval; bob is being emailed.")
            await service.until(lambda: bool(box.messages))
            (mail,) = box.messages
            assert mail["To"] == "bob@example.org"
            assert mail["From"] == "handler@test.example"
            assert rid in mail["Subject"]
            body = mail.get_body().get_content()  # type: ignore[union-attr]
            assert "dear bob" not in body  # the arguments stay on the page the link opens
            link = re.search(r"(http://\S+/approvals/\S+)", body)
            assert link is not None
            url = link.group(1)
            assert url.startswith(base_url(service) + f"/approvals/{rid}?")

            page = await http.get(url)  # what a mail scanner does: it must decide nothing
            assert page.status_code == 200
            assert "dear bob" in page.text
            assert "Approve as bob" in page.text
            assert await status_of(client, rid) == "pending"

            fields = {k: v[0] for k, v in parse_qs(urlsplit(url).query).items()}
            forged = await http.post(url.split("?")[0], data={**fields, "member": "owner", "decision": "approve"})
            assert forged.status_code == 403  # the signature binds the member
            assert "signature does not match" in forged.text
            assert await status_of(client, rid) == "pending"

            done = await http.post(url.split("?")[0], data={**fields, "decision": "approve"})
            assert done.status_code == 200, done.text
            assert "Approved by bob" in done.text
            again = await http.post(url.split("?")[0], data={**fields, "decision": "reject"})
            assert again.status_code == 409
            assert "already decided" in again.text
            await until_executed(client, rid)
            assert (tree / "work/tester/mail.txt").read_text() == "dear bob"
            history = (await http.get(base_url(service) + "/approvals")).text
            assert "Nothing waits for a decision." in history
            assert re.search(rf"{rid}.*?executed.*?bob", history, re.S)
            assert service.router is not None
            (notice,) = list_notices(service.router.services.gate.store, rid)  # type: ignore[attr-defined]
            assert (notice.channel, notice.target, notice.state) == ("email", "bob@example.org", "sent")
            await client.close()

    asyncio.run(scenario())


def test_an_unreachable_mail_server_keeps_the_notice_for_a_retry(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HANDLER_SMTP_URL", "smtp://127.0.0.1:9")  # nothing listens on the discard port
    route(tree, '{ to = "member", member = "bob" }')

    async def scenario() -> None:
        async with running(options(tree)) as service:
            client, rid = await hold_a_write(service)
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]
            await service.until(lambda: list_notices(store, rid)[0].attempts == 1)
            (notice,) = list_notices(store, rid)
            assert notice.state == "pending"  # it will be tried again later
            assert notice.error is not None
            assert "cannot reach the mail server 127.0.0.1:9" in notice.error
            assert await status_of(client, rid) == "pending"  # the hold itself is untouched
            async with httpx.AsyncClient() as http:  # the operator sees it on the overview
                await sign_in(http, base_url(service), tree, tree.parent / "state", "owner")
                overview = await http.get(base_url(service) + "/")
            assert "Notices that did not go out" in overview.text
            assert "will retry" in overview.text
            assert "cannot reach the mail server 127.0.0.1:9" in overview.text
            assert "frame-ancestors 'none'" in overview.headers["content-security-policy"]
            await client.close()

    asyncio.run(scenario())


def slack_click(user: str, rid: str, response_url: str, action: str = "handler_approve") -> bytes:
    payload = {"type": "block_actions", "user": {"id": user, "username": user.lower()},
               "actions": [{"action_id": action, "value": rid, "type": "button"}], "response_url": response_url}
    return urlencode({"payload": orjson.dumps(payload).decode()}).encode()


def signed(body: bytes, secret: str = SIGNING, at: float | None = None) -> dict[str, str]:
    timestamp = str(int(time.time() if at is None else at))
    mac = hmac.new(secret.encode(), b"v0:" + timestamp.encode() + b":" + body, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": timestamp, "X-Slack-Signature": "v0=" + mac,
            "Content-Type": "application/x-www-form-urlencoded"}


async def refuse_bad_clicks(http: httpx.AsyncClient, slack: SlackStandIn, hook: str, click: bytes, rid: str,
                            slack_url: str) -> None:
    """A forged click, a stale one and a stranger's are refused."""
    forged = await http.post(hook, content=click, headers=signed(click, secret="not-the-secret"))  # noqa: S106
    assert forged.status_code == 401
    stale = await http.post(hook, content=click, headers=signed(click, at=time.time() - 600))
    assert stale.status_code == 401
    assert "five minutes" in stale.json()["error"]
    stranger = slack_click("U0NOBODY", rid, slack_url + "/respond")
    refused = await http.post(hook, content=stranger, headers=signed(stranger))
    assert refused.status_code == 200
    assert slack.responses[-1]["response_type"] == "ephemeral"
    assert "not an org member" in slack.responses[-1]["text"]


def test_a_slack_message_with_buttons_decides_through_a_signed_click(tree: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    slack = SlackStandIn()
    route(tree, '{ to = "slack", channel = "#approvals" }')

    async def scenario() -> None:
        stand_in = HttpListener(slack.app(), "127.0.0.1", 0)
        await stand_in.start()
        slack_url = f"http://127.0.0.1:{stand_in.port}"
        monkeypatch.setenv("HANDLER_SLACK_TOKEN", "xoxb-test-token")
        monkeypatch.setenv("HANDLER_SLACK_SIGNING_SECRET", SIGNING)
        monkeypatch.setenv("HANDLER_SLACK_API_URL", slack_url + "/api")
        try:
            async with running(options(tree)) as service, httpx.AsyncClient() as http:
                client, rid = await hold_a_write(service,
                                                 told="Waiting for approval; it is being posted to Slack #approvals.")
                await service.until(lambda: bool(slack.posts))
                (headers, message), = slack.posts
                assert headers["authorization"] == "Bearer xoxb-test-token"
                assert message["channel"] == "#approvals"
                buttons = message["blocks"][1]["elements"]
                assert [(b["action_id"], b.get("value")) for b in buttons[:2]] == [
                    ("handler_approve", rid), ("handler_reject", rid)]
                assert buttons[2]["url"] == f"{base_url(service)}/approvals/{rid}"
                assert "dear bob" not in orjson.dumps(message).decode()  # a channel has many readers

                hook = base_url(service) + "/hooks/slack"
                click = slack_click("U0CAROL", rid, slack_url + "/respond")
                await refuse_bad_clicks(http, slack, hook, click, rid, slack_url)
                assert await status_of(client, rid) == "pending"

                done = await http.post(hook, content=click, headers=signed(click))
                assert done.status_code == 200
                assert slack.responses[-1]["replace_original"] is True
                assert slack.responses[-1]["text"].startswith("Approved by carol")
                await until_executed(client, rid)
                assert service.router is not None
                # The message in the channel loses its buttons and says what was decided.
                await service.until(lambda: bool(slack.updates))
                (update,) = slack.updates
                assert (update["channel"], update["ts"]) == ("C0APPROVALS", "1700000000.000100")
                assert update["text"].startswith("Approved by carol")
                assert "handler_approve" not in orjson.dumps(update).decode()
                (notice,) = list_notices(service.router.services.gate.store, rid)  # type: ignore[attr-defined]
                assert (notice.state, notice.ref) == ("closed", "C0APPROVALS 1700000000.000100")
                await client.close()
        finally:
            await stand_in.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("refusal", ["channel_not_found", "ratelimited"])
def test_what_slack_refuses_is_given_up_or_retried_when_it_says(tree: Path, monkeypatch: pytest.MonkeyPatch,
                                                                refusal: str) -> None:
    slack = SlackStandIn()
    slack.fail_with = refusal
    route(tree, '{ to = "slack", channel = "#approvals" }')

    async def scenario() -> None:
        stand_in = HttpListener(slack.app(), "127.0.0.1", 0)
        await stand_in.start()
        monkeypatch.setenv("HANDLER_SLACK_TOKEN", "xoxb-test-token")
        monkeypatch.setenv("HANDLER_SLACK_API_URL", f"http://127.0.0.1:{stand_in.port}/api")
        try:
            async with running(options(tree)) as service:
                client, rid = await hold_a_write(service)
                assert service.router is not None
                store = service.router.services.gate.store  # type: ignore[attr-defined]
                await service.until(lambda: list_notices(store, rid)[0].attempts == 1)
                (notice,) = list_notices(store, rid)
                if refusal == "channel_not_found":  # the same message would be refused again: given up
                    assert notice.state == "failed"
                    assert "channel_not_found" in (notice.error or "")
                else:  # back when Slack said, not at the first backoff
                    assert notice.state == "pending"
                    assert notice.next_at >= time.time() + 100
                await client.close()
        finally:
            await stand_in.aclose()

    asyncio.run(scenario())


async def enter_the_dashboard_as_a_member(http: httpx.AsyncClient, tree: Path, url: str, rid: str) -> None:
    """Without a member signed in nothing opens, the dashboard token neither; signed in, carol (a member the hold is
    not routed to) sees the status, the hold and its arguments, and no buttons."""
    assert (await http.get(url + "/")).status_code == 401
    assert (await http.get(url + "/?token=let-me-in")).status_code == 401  # the token opens no page
    assert (await http.get(url + "/?token=wrong-é")).status_code == 401  # any text: refused, not a crash
    assert (await http.get(f"{url}/approvals/{rid}")).status_code == 401  # no session, no signed link
    await sign_in(http, url, tree, tree.parent / "state", "carol")
    entered = await http.get(url + "/")
    assert entered.status_code == 200, entered.text
    assert "ready" in entered.text
    assert "1 hold" in entered.text
    listing = await http.get(url + "/approvals")
    assert rid in listing.text
    assert "member bob" in listing.text
    page = await http.get(f"{url}/approvals/{rid}")
    assert "dear bob" in page.text
    assert "Approve as" not in page.text  # routed to bob: carol reads it, and decides nothing


async def approvals_link(tree: Path, url: str, rid: str, member: str) -> subprocess.CompletedProcess[str]:
    """`handler approvals link RID --member MEMBER`, as a person runs it beside the service."""
    env = {**os.environ, "HANDLER_STATE_DIR": str(tree.parent / "state"), "HANDLER_PUBLIC_URL": url}
    return await asyncio.to_thread(subprocess.run, [HANDLER, "approvals", "link", rid, "--member", member,
                                                    "--root", str(tree)], capture_output=True, text=True,
                                   env=env, check=False)


async def sign_an_owner_link(tree: Path, url: str, rid: str) -> str:
    """`handler approvals link` signs one for the owner, which lets them in alone, and refuses carol."""
    link = await approvals_link(tree, url, rid, "owner")
    assert link.returncode == 0, link.stderr
    assert link.stdout.startswith(f"{url}/approvals/{rid}?member=owner&")
    async with httpx.AsyncClient() as stranger:  # no cookie: the link alone lets the owner in
        owner_page = await stranger.get(link.stdout.strip())
    assert "Approve as owner" in owner_page.text
    refused = await approvals_link(tree, url, rid, "carol")
    assert refused.returncode != 0
    assert "carol may not decide" in refused.stderr
    return link.stdout.strip()


async def reject_as_the_signed_in_owner(url: str, rid: str, link: str) -> str:
    """Signed in by the link, the owner rejects the hold with the page's CSRF token; returns that token."""
    async with httpx.AsyncClient() as owner:  # the link signed the owner in: the dashboard is theirs
        await owner.get(link)
        listing = await owner.get(url + "/approvals")
        assert listing.status_code == 200  # no dashboard token needed once signed in
        assert "signed in as owner" in listing.text
        hold_page = await owner.get(f"{url}/approvals/{rid}")  # no link this time
        assert "Approve as owner" in hold_page.text
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', hold_page.text)
        assert token is not None
        forged = await owner.post(f"{url}/approvals/{rid}", data={"csrf": "0" * 64, "decision": "reject"})
        assert forged.status_code == 403
        assert "does not belong to this session" in forged.text
        done = await owner.post(f"{url}/approvals/{rid}", data={"csrf": token.group(1), "decision": "reject"})
        assert done.status_code == 200
        assert "Rejected by owner" in done.text
    return token.group(1)


def test_the_dashboard_shows_status_holds_and_catalog_to_a_signed_in_member(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    route(tree, '{ to = "member", member = "bob" }')
    monkeypatch.setenv("HANDLER_DASHBOARD_TOKEN", "let-me-in")

    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient() as http:
            client, rid = await hold_a_write(service)
            url = base_url(service)
            await enter_the_dashboard_as_a_member(http, tree, url, rid)
            link = await sign_an_owner_link(tree, url, rid)
            csrf = await reject_as_the_signed_in_owner(url, rid, link)
            assert await status_of(client, rid) == "rejected"
            anonymous = await http.post(f"{url}/approvals/{rid}", data={"csrf": csrf, "decision": "approve"})
            assert anonymous.status_code == 403  # another session's form token decides nothing
            catalog = await http.get(url + "/catalog")
            assert "echo/v1" in catalog.text
            assert "echo_say" in catalog.text
            assert "echo-local" in catalog.text
            await client.close()

    asyncio.run(scenario())


def test_a_member_removed_from_the_org_is_signed_out_of_the_dashboard(tree: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    route(tree, '{ to = "member", member = "bob" }')
    monkeypatch.setenv("HANDLER_DASHBOARD_TOKEN", "let-me-in")

    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient() as bob:
            client, rid = await hold_a_write(service)
            url = base_url(service)
            signed = await approvals_link(tree, url, rid, "bob")
            assert signed.returncode == 0, signed.stderr
            link = signed.stdout.strip()
            assert "Approve as bob" in (await bob.get(link)).text  # the link signs bob in
            assert (await bob.get(url + "/approvals")).status_code == 200
            for save in (lambda: route(tree, '{ to = "member", member = "owner" }'),  # holds no longer go to bob,
                         lambda: (tree / "config/org.toml").write_text(  # so he may be removed
                             ORG.replace('[members.bob]\nemail = "bob@example.org"\n', ""))):
                live = service.generation
                save()
                await service.until(lambda: service.generation > live)  # noqa: B023 - awaited within the turn
            listing = await bob.get(url + "/approvals")
            assert listing.status_code == 401, listing.text  # the session no longer opens the dashboard
            again = await bob.get(link)
            assert again.status_code == 403, again.text
            assert "bob is no longer a member of the org" in again.text
            assert "dear bob" not in again.text
            fields = {k: v[0] for k, v in parse_qs(urlsplit(link).query).items()}
            posted = await bob.post(link.split("?")[0], data={**fields, "decision": "approve"})
            assert posted.status_code == 403, posted.text
            assert await status_of(client, rid) == "pending"
            await client.close()

    asyncio.run(scenario())


def test_a_stored_hold_wakes_the_notifier_without_waiting_for_its_poll(tree: Path, mailbox: tuple[Mailbox, int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    box, port = mailbox
    monkeypatch.setenv("HANDLER_SMTP_URL", f"smtp://127.0.0.1:{port}")
    route(tree, '{ to = "member", member = "bob" }')
    snapshot = load(tree)

    async def scenario() -> None:
        governor = GovernedGate.from_env(tree, state_dir=tree.parent / "state")
        channels = open_channels(governor.store, lambda: snapshot, tree.parent / "state", os.environ)
        channels.notifier.poll_seconds = 3600.0  # its poll alone would not come round within the test
        channels.set_public_url("127.0.0.1", 8765)
        governor.on_hold = channels.notifier.wake
        stop = asyncio.Event()
        sending = asyncio.create_task(channels.notifier.run(stop))
        try:
            await asyncio.sleep(0)  # the notifier looks once, finds nothing, and waits
            call = CallRequest("tester", "run-1", None, "echo/v1", "echo_write", "echo-local",
                               {"text": "dear bob", "outputPath": "mail.txt"})
            held = await governor.admit(snapshot, call)
            assert held.status == "pending"
            async with asyncio.timeout(DEADLINE):
                while not box.messages:
                    await asyncio.sleep(0.02)
            assert box.messages[0]["To"] == "bob@example.org"
        finally:
            stop.set()
            await sending
            await channels.aclose()
            await governor.aclose()

    asyncio.run(scenario())


def _spend_cells(page: str, scope: str) -> list[str]:
    """The cells after the scope's own in its row of the overview's spend table."""
    row = page.split(f"<code>{scope}</code>", 1)[1].split("</tr>", 1)[0]
    return [cell.split("</td>", 1)[0] for cell in row.split("<td>")[1:]]


def test_the_overview_counts_this_months_pricing_violations_and_rows_set_aside(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]
            async with httpx.AsyncClient() as http:
                await sign_in(http, base_url(service), tree, tree.parent / "state", "owner")
                quiet = await http.get(base_url(service) + "/")
                assert "Pricing violations" not in quiet.text
                with store.begin() as tx:
                    record(tx, "pricing_violation", profile="assistant", tool="send_email_send",
                           detail={"binding": "email-smtp", "reported": 2_000_000, "reserved": 10_000})
                told = await http.get(base_url(service) + "/")
                assert "Rows the store refused" not in told.text
                await asyncio.to_thread(refuse_a_row, store)
                refused = await http.get(base_url(service) + "/")
            assert "Pricing violations this month" in told.text
            assert "charged the reservation" in told.text
            assert "Rows the store refused this month</dt>" in refused.text
            assert "1: each is set aside in the audit trail" in refused.text

    asyncio.run(scenario())


def test_a_page_needing_a_store_that_cannot_be_read_says_so_and_works_again_once_it_can(
        tree: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]
            database = store.engine.url.database
            async with httpx.AsyncClient() as http:
                await sign_in(http, base_url(service), tree, tree.parent / "state", "owner")
                with sqlite3.connect(database) as db:  # a migration gone wrong, say
                    db.execute("ALTER TABLE holds RENAME TO holds_aside")
                down = await http.get(base_url(service) + "/")
                assert down.status_code == 503
                assert down.headers["retry-after"] == "5"
                assert "The governance store cannot be read now" in down.text
                assert "no such table: holds" in down.text
                assert (await http.get(base_url(service) + "/status")).status_code == 200  # needs no store
                with sqlite3.connect(database) as db:
                    db.execute("ALTER TABLE holds_aside RENAME TO holds")
                back = await http.get(base_url(service) + "/")
            assert back.status_code == 200
            assert "Waiting for a decision" in back.text

    asyncio.run(scenario())
    assert "GET /: the store cannot be read now" in caplog.text
    assert "Traceback" not in caplog.text


def test_the_overview_shows_spend_and_what_budget_leases_hold_of_it(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service:
            assert service.router is not None
            store = service.router.services.gate.store  # type: ignore[attr-defined]
            other = GovernedGate(store, owns_store=False)  # another router on the same store, holding a lease
            try:
                admitted = await other.admit(cap_snapshot(), priced_call())
                assert admitted.status == "executed"
                async with httpx.AsyncClient() as http:
                    await sign_in(http, base_url(service), tree, tree.parent / "state", "owner")
                    page = await http.get(base_url(service) + "/")
                assert "Spend this month (UTC)" in page.text
                counted, leased = _spend_cells(page.text, "org:acme")[:2]
                # Counted, and all of it leased: the call has not settled. The lease is at least its price, and
                # more once the lease keeper sees the call still running (sized from the recent rate).
                assert counted == leased
                assert counted.startswith("$")
                assert float(counted[1:]) >= 0.005
                await other.settle(admitted, None, True)
            finally:
                await other.aclose()
            async with httpx.AsyncClient() as http:
                await sign_in(http, base_url(service), tree, tree.parent / "state", "owner")
                page = await http.get(base_url(service) + "/")
            assert _spend_cells(page.text, "org:acme")[:2] == ["$0.005", ""]  # returned: what was charged, none leased

    asyncio.run(scenario())
