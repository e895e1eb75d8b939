"""Two routers following one tree and sharing one PostgreSQL store, as docs/scaling.md deploys them: a hold's
notice goes out once, the signed link works on either router's dashboard, the CLI decides too, each hold runs
once, and a saved change reloads both."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from reconciler.app import UpOptions
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, short_dir
from tests.fixtures.mail import serving_mailbox
from tests.fixtures.service import DEADLINE, Service, running

HANDLER = str(Path(sys.executable).parent / "handler")
ORG = OWNED_ORG
PROFILE = '''apiVersion = "handler.profile/v1"
name = "tester"
scope = "work/tester"
services = { echo = "echo-local" }
routing = { to = "member", member = "bob" }
'''


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch, pg_url: str) -> Iterator[Path]:
    for name in ("HANDLER_STATE_DIR", "HANDLER_SLACK_TOKEN", "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(TOKEN_ENV, "t")
    monkeypatch.setenv("HANDLER_STORE_URL", pg_url)  # one store for both
    monkeypatch.setenv("HANDLER_LINK_SECRET", "one-secret-for-every-router")  # a link signed by one, checked by all
    with short_dir() as base:
        root = write_echo_tree(base / "t")
        (root / "config/org.toml").write_text(ORG)
        (root / "config/profiles/tester.toml").write_text(PROFILE)
        yield root


def _options(root: Path, name: str) -> UpOptions:
    """Each router its own run and state folders; the same tree, the same store."""
    return UpOptions(str(root), run_dir=root.parent / f"run-{name}", state_dir=root.parent / f"state-{name}",
                     http_port=0, sandbox=False)


def _url(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


async def _hold(client: RawClient, text: str) -> str:
    result = await client.call("echo_write", {"text": text, "outputPath": f"{text}.txt"})
    assert body(result)["status"] == "pending", result
    return str(body(result)["request_id"])


async def _until_executed(client: RawClient, rid: str) -> None:
    async with asyncio.timeout(DEADLINE):
        while (status := body(await client.call("handler_status", {"request_id": rid}))["status"]) != "executed":
            assert status == "pending", status
            await asyncio.sleep(0.05)


def _claims(root: Path, rid: str) -> int:
    trail = subprocess.run([HANDLER, "audit", "--root", str(root), "--request", rid, "--format", "json"],
                           capture_output=True, text=True, timeout=60, check=True, env=dict(os.environ)).stdout
    return [r["event"] for r in json.loads(trail)].count("claimed")


def test_two_routers_on_one_postgresql_notify_once_decide_anywhere_run_once_and_both_reload(
        tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with serving_mailbox() as (box, port):
        monkeypatch.setenv("HANDLER_SMTP_URL", f"smtp://127.0.0.1:{port}")

        async def scenario() -> tuple[str, str]:
            async with running(_options(tree, "a")) as a, running(_options(tree, "b")) as b, \
                    httpx.AsyncClient() as http:
                client = await a.session()
                by_link = await _hold(client, "first")
                await a.until(lambda: bool(box.messages))
                await asyncio.sleep(1.5)  # both notifiers have polled the outbox since
                assert len(box.messages) == 1  # one notice, whichever router sent it

                # The link names the router that sent it; the other router's dashboard takes it as well.
                mail_text = box.messages[0].get_body().get_content()  # type: ignore[union-attr]
                link = re.search(r"(http://\S+/approvals/\S+)", mail_text)
                assert link is not None
                fields = {k: v[0] for k, v in parse_qs(urlsplit(link.group(1)).query).items()}
                sender, other = (a, b) if link.group(1).startswith(_url(a)) else (b, a)
                decided = await http.post(f"{_url(other)}/approvals/{by_link}", data={**fields, "decision": "approve"})
                assert decided.status_code == 200, decided.text
                await _until_executed(client, by_link)
                assert sender is not other

                by_cli = await _hold(client, "second")
                done = await asyncio.to_thread(subprocess.run, [HANDLER, "approvals", "approve", by_cli, "--as",
                                               "owner", "--root", str(tree)], capture_output=True, text=True,
                                               timeout=60, env=dict(os.environ))
                assert done.returncode == 0, done.stderr
                await _until_executed(client, by_cli)
                await client.close()

                # A saved change: each router follows the tree and applies it.
                (tree / "config/profiles/tester.toml").write_text(PROFILE + 'description = "changed"\n')
                await a.until(lambda: a.generation == 2)
                await b.until(lambda: b.generation == 2)
                return by_link, by_cli

        by_link, by_cli = asyncio.run(scenario())
    assert (tree / "work/tester/first.txt").read_text() == "first"
    assert (tree / "work/tester/second.txt").read_text() == "second"
    assert _claims(tree, by_link) == 1
    assert _claims(tree, by_cli) == 1
