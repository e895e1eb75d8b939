"""Health where an operator acts, with `handler up` in this loop over real HTTP and a signed-in member: a binding
whose secret file is missing is red on its page with the finding and its fix, the profile form marks it and its
check warns before anything is written, a hold on it says it cannot start and offers the reject with that reason,
the overview badges each profile; the file appearing turns it green at the next applied revision, without a
restart; `handler doctor` (a subprocess) asks the running service and says whose environment it judged."""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from reconciler.app import UpOptions
from reconciler.config import FolderSource, Loader
from reconciler.web.health import profile_badges
from tests.fixtures.echo_tree import OWNED_ORG, TOKEN_ENV, write_echo_tree
from tests.fixtures.harness import RawClient, body, short_dir
from tests.fixtures.service import Service, running
from tests.fixtures.signin import sign_in

HANDLER = str(Path(sys.executable).with_name("handler"))
VAULT_FILE = "secrets/echo-vault"  # a file reference, relative to the tree; missing at first

VAULT = ('apiVersion = "handler.binding/v1"\nname = "echo-vault"\nconnector = "echo"\n'
         'description = "The echo connector, its token from a file"\n'
         f'secrets = {{ token = {{ file = "{VAULT_FILE}" }} }}\n')
# tester: Balanced (echo_write waits for a person) on the binding that cannot start; reader: on the one that can;
# writer: on the one that can, but its work folder is missing.
PROFILES = {
    "tester": 'services = { echo = "echo-vault" }\n',
    "reader": 'template = "permissive"\nservices = { echo = "echo-local" }\n',
    "writer": 'template = "permissive"\nservices = { echo = "echo-local" }\n',
}


@pytest.fixture
def tree(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name in ("HANDLER_STORE_URL", "HANDLER_SMTP_URL", "HANDLER_SLACK_TOKEN", "HANDLER_SLACK_SIGNING_VAULT_FILE",
                 "HANDLER_DASHBOARD_TOKEN", "HANDLER_PUBLIC_URL", "HANDLER_LINK_VAULT_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(TOKEN_ENV, "t")  # the service's environment (this process's), not the CLI's below
    with short_dir() as base:
        root = write_echo_tree(base / "t", profiles=("tester", "reader"))
        (root / "config/org.toml").write_text(OWNED_ORG)
        (root / "config/bindings/echo-vault.toml").write_text(VAULT)
        for name, services in PROFILES.items():
            (root / f"config/profiles/{name}.toml").write_text(
                f'apiVersion = "handler.profile/v1"\nname = "{name}"\nscope = "work/{name}"\n{services}')
        monkeypatch.setenv("HANDLER_STATE_DIR", str(base / "state"))
        yield root


def options(root: Path) -> UpOptions:
    return UpOptions(str(root), run_dir=root.parent / "run", state_dir=root.parent / "state", http_port=0,
                     sandbox=False)


def url(service: Service) -> str:
    assert service.listener is not None
    return f"http://127.0.0.1:{service.listener.port}"


def text(page: httpx.Response) -> str:
    """The page as a person reads it: tags out, entities decoded, spaces folded."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


def csrf(page: httpx.Response, form: str) -> str:
    """The CSRF token of the form posting to `form` (the page's sign-out form has its own)."""
    found = re.search(rf'action="{form}">\s*(?:<[^>]*>\s*)*?<input type="hidden" name="csrf" value="([0-9a-f]+)"',
                      page.text)
    assert found, page.text
    return found.group(1)


def doctor(root: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """`handler doctor` from a shell that lacks the token the service has."""
    shell = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}
    return subprocess.run([HANDLER, "doctor", str(root), *more], capture_output=True, text=True, timeout=120,
                          check=False, env=shell)


async def held(service: Service) -> str:
    assert service.router is not None
    client = await RawClient.connect(service.router.socket_path("tester"))
    await client.request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                        "clientInfo": {"name": "test", "version": "1"}})
    await client.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    result = body(await client.call("echo_write", {"text": "dear bob", "outputPath": "mail.txt"}))
    await client.close()
    assert result["status"] == "pending", result
    return str(result["request_id"])


def test_a_binding_whose_secret_is_missing_is_red_where_an_operator_acts(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, url(service), tree, tree.parent / "state", "owner")
            page = await http.get("/bindings/echo-vault")
            said = text(page)
            assert page.status_code == 200
            assert 'class="note health down"' in page.text
            assert "cannot start The running service cannot start this binding now" in said
            assert f"secret slot 'token': cannot read {tree / VAULT_FILE}: No such file or directory" in said
            assert "create that file, readable by the service" in said
            assert "Judged in the running service's environment and sandbox" in said
            fine = await http.get("/bindings/echo-local")
            assert 'class="note ok health up"' in fine.text
            assert "Nothing on the running service keeps this binding from starting" in text(fine)

            # The profile form marks it, and a check of the swap warns before anything is written.
            form = await http.get("/profiles/reader")
            assert '<option value="echo-vault" class="cannot-start">⚠ echo-vault' in form.text
            assert "Marked ⚠: the running service cannot start echo-vault (secret slot 'token'" in text(form)
            checked = await http.post("/profiles/reader", data={
                "csrf": csrf(form, "/profiles/reader"), "use.echo": "echo-vault", "was.echo": "echo-local",
                "action": "check"})
            assert checked.status_code == 200
            said = text(checked)
            assert ("Nothing was written yet: read the plan, then confirm it . But the running service warns of it "
                    "(below)") in said
            assert ("echo would be served by echo-vault, which cannot start on the running service now: secret "
                    "slot 'token': cannot read") in said
            assert 'echo = "echo-local"' in (tree / "config/profiles/reader.toml").read_text()

            # A hold on it says it cannot start, and offers the reject with that reason.
            rid = await held(service)
            hold = await http.get(f"/approvals/{rid}")
            assert "Binding echo-vault cannot start on the running service now: secret slot 'token'" in text(hold)
            assert "Approved, this call would fail for good" in text(hold)
            prefilled = re.search(r'name="reason"[^>]* value="([^"]+)"', hold.text)
            assert prefilled, hold.text
            reason = html.unescape(prefilled.group(1))
            assert reason.startswith("Not run: binding echo-vault cannot start on the service now (secret slot")
            listed = await http.get("/approvals")
            assert "echo/v1 echo_write echo-vault cannot start" in text(listed)
            rejected = await http.post(f"/approvals/{rid}", data={
                "csrf": csrf(hold, f"/approvals/{rid}"), "decision": "reject", "reason": reason})
            assert rejected.status_code == 200
            assert f"Rejected by owner: {reason}" in text(rejected)

            # The overview badges each profile.
            overview = await http.get("/")
            badges = dict(re.findall(r'id="badge-(\w+)" title="[^"]*">(\w+)<', overview.text))
            assert badges == {"tester": "blocked", "reader": "serving", "writer": "degraded"}, badges
            assert "no binding it uses can start: echo-vault (secret slot 'token'" in text(overview)
            assert "its scope work/writer does not exist" in text(overview)
    asyncio.run(scenario())


def test_a_secret_file_that_appears_turns_green_at_the_next_revision_without_a_restart(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, url(service), tree, tree.parent / "state", "owner")
            assert "cannot start" in text(await http.get("/bindings/echo-vault"))
            (tree / "secrets").mkdir()
            (tree / VAULT_FILE).write_text("t\n")
            (tree / VAULT_FILE).chmod(0o600)
            first = service.generation
            reader = tree / "config/profiles/reader.toml"
            reader.write_text(reader.read_text() + 'description = "reads"\n')  # any change: a new revision
            await service.until(lambda: service.generation > first)
            await service.until(lambda: service.reconciler is not None
                                and not service.reconciler.status.binding_checks["echo-vault"])
            page = await http.get("/bindings/echo-vault")
            assert 'class="note ok health up"' in page.text
            badges = dict(re.findall(r'id="badge-(\w+)" title="[^"]*">(\w+)<', (await http.get("/")).text))
            assert badges["tester"] == "serving"
            status = await asyncio.to_thread(subprocess.run, [HANDLER, "status", str(tree)], capture_output=True,
                                             text=True, timeout=60, check=False)
            assert "checks:  " in status.stdout
            assert "in the service's environment" in status.stdout
            assert "binding echo-vault" not in status.stdout
    asyncio.run(scenario())


def test_doctor_asks_the_running_service_and_says_whose_environment_it_judged(tree: Path) -> None:
    async def scenario() -> None:
        async with running(options(tree)) as service, httpx.AsyncClient(base_url=url(service)) as http:
            await sign_in(http, url(service), tree, tree.parent / "state", "owner")
            # The shell lacks the token the service has: the service's view names no echo-local problem.
            asked = await asyncio.to_thread(doctor, tree)
            assert asked.returncode == 1, asked.stdout + asked.stderr
            assert asked.stdout.startswith("judged in the running service's environment (pid ")
            assert f"the router's environment has no {TOKEN_ENV}" not in asked.stdout
            assert "error: binding echo-vault: secret slot 'token': cannot read" in asked.stdout
            here = await asyncio.to_thread(doctor, tree, "--here")
            assert here.stdout.startswith("judged in this shell's environment")
            assert f"the router's environment has no {TOKEN_ENV}" in here.stdout
            # The file appears: doctor's re-check, in the service, turns the binding green on its page.
            (tree / "secrets").mkdir()
            (tree / VAULT_FILE).write_text("t\n")
            again = json.loads((await asyncio.to_thread(doctor, tree, "--format", "json")).stdout)
            assert again["judged"].startswith("the running service's environment")
            assert not [p for p in again["problems"] if p["subject"] == "binding echo-vault"]
            assert 'class="note ok health up"' in (await http.get("/bindings/echo-vault")).text
    asyncio.run(scenario())


def test_a_failed_connector_blocks_the_profiles_it_alone_serves_and_a_suspended_org_blocks_every_profile(
        tree: Path) -> None:
    """The badges from a status document as the service writes it: a connector that failed (its secret resolved,
    its process did not answer) counts as a binding that cannot start; a suspended org blocks every profile."""
    snapshot = Loader().load(FolderSource(tree))
    status = {"bindingChecks": {"echo-local": [], "echo-vault": []}, "preflight": [],
              "connectors": {"echo-local": {"state": "failed", "message": "it did not answer initialize in 10 s",
                                            "drift": []}}}
    badges = profile_badges(snapshot, status)
    assert badges["tester"] == {"badge": "serving", "why": "every binding it uses can start"}
    assert badges["reader"] == {"badge": "blocked", "why": "no binding it uses can start: echo-local (it did not "
                                                           "answer initialize in 10 s)"}
    org = tree / "config/org.toml"
    org.write_text(org.read_text().replace('name = "test-org"\n', 'name = "test-org"\nsuspended = true\n'))
    suspended = profile_badges(Loader().load(FolderSource(tree)), status)
    assert {name: b["badge"] for name, b in suspended.items()} == dict.fromkeys(PROFILES, "blocked")
    assert suspended["tester"]["why"].startswith("the org is suspended")
